"""Emulating a fused ``LayerNormalization`` that asks for low-precision statistics.

ONNX's ``stash_type`` attribute names the type of the mean and inverse standard deviation:
1 = float32 (the default), otherwise the input's type. ONNX Runtime CPU computes the op in
float32 on the (rounded) float32 input whatever ``stash_type`` says, so in the emulation a
``stash_type`` = 0 LayerNorm on an FP16/BF16 node would silently get FP32 statistics. This
module expands such a node into the chain the statistics really go through, before the
emulator's rounding pass rounds every node of it::

    mean = ReduceMean(x); d = x - mean; q = d * d; var = ReduceMean(q)
    y = d / Sqrt(var + eps) * scale [+ bias]          (over the axes from ``axis`` to the last)

so the square q overflows at |x - mean| > 255.9 exactly as an engine honouring
``stash_type`` = 0 in FP16 would. Expanded node names are ``<node>/stats16/<step>`` and get the
LayerNorm's own precision in the plan.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from precision_doctor.formats import Precision
from precision_doctor.precision.plan import NodeDecision, PrecisionPlan

_LOW = (Precision.FP16, Precision.BF16)


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def expand_low_precision_stats(model: onnx.ModelProto, plan: PrecisionPlan
                               ) -> tuple[onnx.ModelProto, PrecisionPlan]:
    """Replace every FP16/BF16 ``LayerNormalization`` with ``stash_type`` != 1 by its chain.

    Args:
        model: The model (not modified; opset >= 18 assumed for ReduceMean with ``axes`` as an
            input, older opsets get the attribute).
        plan: The precision plan; the new nodes inherit the LayerNorm's precision.

    Returns:
        ``(model, plan)``: the input objects unchanged when there is nothing to expand.
    """
    targets = [n for n in model.graph.node if n.op_type == "LayerNormalization"
               and n.domain in ("", "ai.onnx") and int(_attr(n, "stash_type", 1)) != 1
               and plan.precision_of(n.name) in _LOW]
    if not targets:
        return model, plan
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    decisions: dict[str, NodeDecision] = {}
    names = {n.name for n in targets}
    new_nodes: list[onnx.NodeProto] = []
    extra_inits: list[onnx.TensorProto] = []
    for node in out.graph.node:
        if node.name not in names:
            new_nodes.append(node)
            continue
        p = f"{node.name}/stats16"
        axis = int(_attr(node, "axis", -1))
        eps = float(_attr(node, "epsilon", 1e-5))
        x, scale = node.input[0], node.input[1]
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        # the normalized axes, from `axis` to the last (a positive axis needs the rank)
        axes = list(range(axis, 0)) if axis < 0 else None
        if axes is None:
            rank = _rank(model, x)
            if rank is None:
                new_nodes.append(node)  # rank unknown: leave the op (FP32 statistics)
                continue
            axes = list(range(axis, rank))
        eps_name = f"{p}/eps"
        extra_inits.append(numpy_helper.from_array(np.asarray(eps, np.float32), eps_name))

        def reduce(src: str, dst: str, step: str, p: str = p,
                   axes: list[int] = axes) -> onnx.NodeProto:
            if opset >= 18:
                axes_name = f"{p}/axes"
                if not any(i.name == axes_name for i in extra_inits):
                    extra_inits.append(numpy_helper.from_array(np.asarray(axes, np.int64),
                                                               axes_name))
                return helper.make_node("ReduceMean", [src, axes_name], [dst],
                                        name=f"{p}/{step}", keepdims=1)
            return helper.make_node("ReduceMean", [src], [dst], name=f"{p}/{step}", axes=axes,
                                    keepdims=1)

        y = node.output[0]
        chain = [
            reduce(x, f"{p}/mean", "mean"),
            helper.make_node("Sub", [x, f"{p}/mean"], [f"{p}/d"], name=f"{p}/sub"),
            helper.make_node("Mul", [f"{p}/d", f"{p}/d"], [f"{p}/q"], name=f"{p}/square"),
            reduce(f"{p}/q", f"{p}/var", "var"),
            helper.make_node("Add", [f"{p}/var", eps_name], [f"{p}/ve"], name=f"{p}/add_eps"),
            helper.make_node("Sqrt", [f"{p}/ve"], [f"{p}/std"], name=f"{p}/sqrt"),
            helper.make_node("Div", [f"{p}/d", f"{p}/std"], [f"{p}/n"], name=f"{p}/div"),
            helper.make_node("Mul", [f"{p}/n", scale], [f"{p}/ns" if bias else y],
                             name=f"{p}/scale"),
        ]
        if bias:
            chain.append(helper.make_node("Add", [f"{p}/ns", bias], [y], name=f"{p}/bias"))
        precision = plan.precision_of(node.name)
        for n in chain:
            decisions[n.name] = NodeDecision(precision, "emulation",
                                             f"stash_type={_attr(node, 'stash_type', 1)} "
                                             f"statistics of '{node.name}'")
        new_nodes.extend(chain)
    del out.graph.node[:]
    out.graph.node.extend(new_nodes)
    out.graph.initializer.extend(extra_inits)
    return out, plan.with_overrides(decisions)


def _rank(model: onnx.ModelProto, name: str) -> int | None:
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        if vi.name == name and vi.type.tensor_type.HasField("shape"):
            return len(vi.type.tensor_type.shape.dim)
    return None


__all__ = ["expand_low_precision_stats"]
