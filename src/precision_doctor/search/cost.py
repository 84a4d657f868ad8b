"""Compute cost per node: FLOPs (multiply-add = 2 FLOPs) and parameter counts.

Used to report the share of compute left in FP32. Estimates for the samples' concrete input
shapes (``concrete_shapes``):

* Conv / ConvTranspose: 2 * numel(output) * (C_in / group) * prod(kernel) for Conv, and
  2 * numel(input) * (C_out / group) * prod(kernel) for ConvTranspose;
* MatMul / Gemm: 2 * numel(output) * K (K = reduced dimension);
* every other floating op: numel(output) (one op per element);
* parameters: elements of the node's constant float inputs.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.graph.constants import constant_values
from precision_doctor.graph.shapes import infer_types, skeleton
from precision_doctor.precision.plan import candidate_nodes

_SYMBOLIC = "precision_doctor._ort_symbolic_shape_infer"  # sys.modules name of the file's copy


@dataclass(frozen=True)
class NodeCost:
    """Cost of one node: ``flops`` (float operations) and ``params`` (constant elements)."""

    flops: float
    params: int


def compute_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Nodes computing a floating-point value: the plan's candidates
    (``precision.plan.candidate_nodes``: arithmetic, and Casts that write a float)."""
    return candidate_nodes(model)


def node_costs(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]]
               ) -> dict[str, NodeCost]:
    """FLOPs and parameters of every compute node for ``input_shapes``.

    Tensor shapes come from the samples' real input shapes: ONNX shape inference with data
    propagation (``graph.shapes.infer_types``), then ONNX Runtime's symbolic shape inference
    (``onnxruntime.tools.symbolic_shape_infer``) for what it leaves unknown (a Reshape whose
    target is computed from ``Shape``, as transformer exporters write attention). A MatMul
    of two activations (attention scores) reads its reduced dimension from its first input.

    Args:
        model: The model.
        input_shapes: Concrete shape of every graph input.

    Returns:
        Node name -> ``NodeCost`` (FLOPs 0 where the output size stays unknown).
    """
    shapes = concrete_shapes(model, input_shapes)
    sizes = {k: int(np.prod(v)) for k, v in shapes.items()}
    consts = constant_values(model)
    costs = {}
    for node in compute_nodes(model):
        out = sizes.get(node.output[0]) if node.output else None
        params = sum(int(consts[i].size) for i in node.input
                     if i in consts and consts[i].dtype.kind == "f")
        flops = float(out or 0)
        w = shapes.get(node.input[1]) if len(node.input) > 1 else None
        if node.op_type == "Conv" and w is not None and len(w) > 2 and out:
            flops = 2.0 * out * (w[1] * int(np.prod(w[2:])))
        elif node.op_type == "ConvTranspose" and w is not None and len(w) > 2:
            n_in = sizes.get(node.input[0]) or 0
            flops = 2.0 * n_in * (w[1] * int(np.prod(w[2:])))
        elif node.op_type in ("MatMul", "Gemm") and out:
            k = _reduced_dim(node, shapes)
            flops = 2.0 * out * k if k else float(out)
        costs[node.name] = NodeCost(flops, params)
    return costs


def concrete_shapes(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]]
                    ) -> dict[str, tuple[int, ...]]:
    """Tensor name -> concrete shape, for every tensor whose shape follows from
    ``input_shapes`` (ONNX inference with data propagation, then ONNX Runtime's symbolic
    inference for the rest; graph inputs and initializers included)."""
    types = infer_types(model, input_shapes, data_prop=True)
    shapes = {k: v for k, v in ((k, _dims(t)) for k, t in types.items()) if v is not None}
    shapes.update({k: tuple(int(d) for d in v) for k, v in input_shapes.items()})
    wanted = {o for n in model.graph.node for o in n.output if o}
    if wanted - set(shapes):
        ranks = {k: len(t.tensor_type.shape.dim) for k, t in types.items()
                 if t.HasField("tensor_type") and t.tensor_type.HasField("shape")}
        shapes.update({k: v for k, v in _symbolic(model, input_shapes, ranks).items()
                       if k not in shapes})
    return shapes


def _dims(t: onnx.TypeProto) -> tuple[int, ...] | None:
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
            for d in t.tensor_type.shape.dim]
    return None if any(d is None for d in dims) else tuple(int(d) for d in dims)  # type: ignore


def _symbolic_shape_inference() -> Any:
    """``onnxruntime.tools.symbolic_shape_infer.SymbolicShapeInference``, loaded from its file
    when its package is not imported yet: ``onnxruntime/tools/__init__.py`` imports PyTorch
    whenever it is installed (for a helper this module does not use), 1.7 s of the first
    ``fix`` in a process, measured 2026-11-28 with onnxruntime 1.32 and torch 2.13."""
    name = "onnxruntime.tools.symbolic_shape_infer"
    module = sys.modules.get(name) or sys.modules.get(_SYMBOLIC)
    if module is None and "onnxruntime.tools" in sys.modules:
        module = importlib.import_module(name)
    if module is None:
        import onnxruntime

        path = Path(onnxruntime.__file__).parent / "tools" / "symbolic_shape_infer.py"
        spec = importlib.util.spec_from_file_location(_SYMBOLIC, path)
        if spec is None or spec.loader is None:
            module = importlib.import_module(name)
        else:
            module = importlib.util.module_from_spec(spec)
            sys.modules[_SYMBOLIC] = module
            spec.loader.exec_module(module)
    return module.SymbolicShapeInference


def _symbolic(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]],
              ranks: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """Shapes from ONNX Runtime's symbolic shape inference on the model's skeleton (empty
    when it cannot run: it does not know every custom op). Its ``Constant`` handler reads only
    the ``value`` attribute and raises on a ``value_ints`` one (onnxruntime 1.32), which would
    leave every shape after it unknown: such Constants are rewritten with ``value`` first. It
    also asserts that a Concat of shape values has ``axis == 0``: a negative axis (Paddle2ONNX
    writes -1 on 1-D shape tensors) is made positive from ``ranks`` (tensor name -> rank, from
    ONNX inference)."""
    skel = skeleton(model, input_shapes)
    for node in skel.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            _constant_as_value(node)
        elif node.op_type == "Concat" and node.input and node.input[0] in ranks:
            for attr in node.attribute:
                if attr.name == "axis" and attr.i < 0:
                    attr.i += ranks[node.input[0]]
    inference = _symbolic_shape_inference()
    # its warnings ("Unable to determine if ... treat as equal", on data-dependent NonZero
    # dims) reach the user's terminal through logging's last resort: FLOPs are best effort
    log = logging.getLogger(inference.__module__)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        inferred = inference.infer_shapes(skel, auto_merge=True)
    except Exception:  # noqa: BLE001 - best effort: FLOPs of such nodes stay unknown
        return {}
    finally:
        log.setLevel(level)
    if inferred is None:
        return {}
    g = inferred.graph
    found = ((vi.name, _dims(vi.type)) for vi in [*g.value_info, *g.output])
    return {k: v for k, v in found if v is not None}


def _constant_as_value(node: onnx.NodeProto) -> None:
    """Rewrite a ``Constant`` node's ``value_int(s)`` / ``value_float(s)`` attribute as the
    equivalent ``value`` tensor, in place (other attributes are left as they are)."""
    if len(node.attribute) != 1:
        return
    attr = node.attribute[0]
    kinds = {"value_int": (onnx.TensorProto.INT64, [], [attr.i]),
             "value_ints": (onnx.TensorProto.INT64, [len(attr.ints)], list(attr.ints)),
             "value_float": (onnx.TensorProto.FLOAT, [], [attr.f]),
             "value_floats": (onnx.TensorProto.FLOAT, [len(attr.floats)], list(attr.floats))}
    if attr.name not in kinds:
        return
    dtype, dims, values = kinds[attr.name]
    tensor = onnx.helper.make_tensor(node.output[0], dtype, dims, values)
    del node.attribute[:]
    node.attribute.append(onnx.helper.make_attribute("value", tensor))


def _reduced_dim(node: onnx.NodeProto, shapes: Mapping[str, tuple[int, ...]]) -> int | None:
    """K of a MatMul/Gemm: from B's shape (Gemm's ``transB``), else A's last (``transA``)."""
    b = shapes.get(node.input[1])
    a = shapes.get(node.input[0])
    trans_a = any(x.name == "transA" and x.i for x in node.attribute)
    trans_b = any(x.name == "transB" and x.i for x in node.attribute)
    if b is not None and len(b) >= 2:
        return int(b[-1] if trans_b else b[-2])
    if a is not None and len(a) >= 1:
        return int(a[-2] if trans_a and len(a) >= 2 else a[-1])
    return None


def fp32_share(model: onnx.ModelProto, fp32_nodes: Sequence[str],
               costs: Mapping[str, NodeCost]) -> dict[str, float]:
    """Share of compute nodes, FLOPs and parameters that stay in FP32.

    Returns:
        ``{"nodes": .., "flops": .., "params": .., "fp32_nodes": n, "compute_nodes": N}``.
    """
    names = [n.name for n in compute_nodes(model)]
    keep = set(fp32_nodes) & set(names)
    total_flops = sum(c.flops for c in costs.values()) or 1.0
    total_params = sum(c.params for c in costs.values()) or 1
    return {
        "nodes": len(keep) / max(len(names), 1),
        "flops": sum(costs[n].flops for n in keep if n in costs) / total_flops,
        "params": sum(costs[n].params for n in keep if n in costs) / total_params,
        "fp32_nodes": len(keep), "compute_nodes": len(names),
    }


MAC_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")  # the ops whose FLOPs are multiply-adds
# Ops a quantized tensor passes through unchanged in value between its DequantizeLinear and the
# layer that reads it (the FP16 writer's Cast; exporters' weight Transpose/Reshape).
_PASS_THROUGH = ("Cast", "Transpose", "Reshape", "Identity", "Squeeze", "Unsqueeze", "Flatten")


def quantized_share(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]]
                    ) -> dict[str, float | int]:
    """Share of the multiply-adds (MACs) and of the parameters that run quantized in a Q/DQ
    model, whoever wrote it (``fix --target int8|fp8``, ONNX Runtime ``quantize_static``,
    ModelOpt ONNX PTQ).

    A Conv, ConvTranspose, MatMul or Gemm node is quantized when both its data input and its
    weight input (inputs 0 and 1) come from a ``DequantizeLinear`` (through value-preserving
    ops: ``Cast``, ``Transpose``, ``Reshape`` ...): the engine then runs it in INT8/FP8. Its
    MACs are ``node_costs``' FLOPs / 2 for the shapes of ``input_shapes``. Parameters are the
    elements of every constant a node reads as a value: an initializer or a ``Constant`` node
    output (ONNX Runtime ``quantize_static`` and ModelOpt keep a Paddle2ONNX model's weights
    in Constant nodes), float, or quantized behind a ``DequantizeLinear`` (through the same
    value-preserving ops); scales, zero points and integer shapes excluded, embeddings and
    norms included. A parameter is quantized when it is the weight of a quantized node.

    Args:
        model: The Q/DQ model (not modified).
        input_shapes: Concrete shape of every graph input (a sample's feeds' shapes).

    Returns:
        ``{"macs": share, "params": share, "quantized_layers": k, "mac_layers": n,
        "quantized_macs": MACs, "total_macs": MACs, "quantized_params": n,
        "total_params": n}``; shares in [0, 1] (0 when the model has no MACs/parameters).
    """
    from precision_doctor.graph.load import name_nodes

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    model = name_nodes(copy)
    producer = {o: n for n in model.graph.node for o in n.output}
    consts = _constant_tensors(model)

    def source(name: str) -> tuple[onnx.NodeProto | None, str]:
        node = producer.get(name)
        while node is not None and node.op_type in _PASS_THROUGH:
            name = node.input[0]
            node = producer.get(name)
        return node, name

    def weight(name: str) -> str | None:
        """The constant (initializer or Constant node) a value is read from: a float one, or
        a quantized one behind DequantizeLinear (and QuantizeLinear, for weights quantized at
        run time)."""
        node, name = source(name)
        quantized = False
        while node is not None and node.op_type in _QDQ:
            node, name = source(node.input[0])
            quantized = True
        const = consts.get(name)
        return name if const is not None and (quantized or const[0] in _FLOATS) else None

    costs = node_costs(model, input_shapes)
    macs = {n.name: costs[n.name].flops / 2 if n.name in costs else 0.0
            for n in model.graph.node if n.op_type in MAC_OPS}
    quantized = [n for n in model.graph.node if n.op_type in MAC_OPS and len(n.input) > 1
                 and all(_from_dq(source(x)[0]) for x in n.input[:2])]
    params = {w for n in model.graph.node if n.op_type not in _QDQ for x in n.input if x
              if (w := weight(x)) is not None}
    q_params = {w for n in quantized if (w := weight(n.input[1])) is not None}
    total_macs, q_macs = sum(macs.values()), sum(macs[n.name] for n in quantized)
    total_params = sum(consts[w][1] for w in params)
    q_count = sum(consts[w][1] for w in q_params)
    return {"macs": q_macs / total_macs if total_macs else 0.0,
            "params": q_count / total_params if total_params else 0.0,
            "quantized_layers": len(quantized), "mac_layers": len(macs),
            "quantized_macs": q_macs, "total_macs": total_macs,
            "quantized_params": q_count, "total_params": total_params}


_QDQ = ("DequantizeLinear", "QuantizeLinear")
_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
           onnx.TensorProto.DOUBLE)


def _constant_tensors(model: onnx.ModelProto) -> dict[str, tuple[int, int]]:
    """Tensor name -> (``TensorProto`` data type, element count) of every initializer and
    ``Constant`` node output (``value``, ``value_float(s)``, ``value_int(s)``); no data read."""
    found = {t.name: (t.data_type, int(np.prod(t.dims))) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type != "Constant" or not node.output or len(node.attribute) != 1:
            continue
        attr = node.attribute[0]
        kinds = {"value": (attr.t.data_type, int(np.prod(attr.t.dims))),
                 "value_float": (onnx.TensorProto.FLOAT, 1),
                 "value_floats": (onnx.TensorProto.FLOAT, len(attr.floats)),
                 "value_int": (onnx.TensorProto.INT64, 1),
                 "value_ints": (onnx.TensorProto.INT64, len(attr.ints))}
        if attr.name in kinds:
            found[node.output[0]] = kinds[attr.name]
    return found


def _from_dq(node: onnx.NodeProto | None) -> bool:
    return node is not None and node.op_type == "DequantizeLinear"
