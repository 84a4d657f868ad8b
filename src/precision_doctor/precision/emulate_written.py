"""Emulating a strongly typed model exactly as written: every BF16/FP16 tensor stored in its format.

``precision.emulate`` rounds an FP32 graph the way an engine running a ``PrecisionPlan`` would.
``fix`` must also check the model it *wrote* (its Casts, its converted constants, the types the
writer chose), and ONNX Runtime CPU cannot run most BF16 models: it has no BF16 kernel for
Conv, MatMul, Add, ... ("NOT_IMPLEMENTED: Could not find an implementation for Conv(22)").
``emulate_written`` turns a strongly typed model into an FP32 graph that ONNX Runtime CPU runs
and that computes what an engine running the written model stores (the engine model of
``precision.emulate``: inputs of a low-precision node are in the format, arithmetic inside the
node accumulates in FP32, its outputs are stored in the format):

* Every tensor typed BF16 (or FP16) in the written model is an FP32 tensor here that holds a
  BF16 (FP16) value: the output of the node that makes it is rounded right after that node
  (Cast to the format and back: round-to-nearest-even, overflow to inf, ONNX ``Cast``
  semantics), under the original tensor name.
* BF16/FP16 initializers and ``Constant`` / ``ConstantOfShape`` values become FP32 exactly (every
  BF16 and FP16 value is an FP32 value): the weights the engine reads, bit for bit.
* ``Cast(to=bfloat16)`` becomes ``Cast(to=float)`` followed by the rounding above, so every
  precision boundary the writer placed rounds exactly where the engine's Cast does; a Cast from
  BF16 back to FP32 is then exact, as on the engine. Other type attributes naming BF16/FP16
  (``dtype`` of EyeLike/Random*) name float.
* A graph input typed BF16/FP16 (``--low-io-types``) is an FP32 input rounded on entry, so the
  caller feeds float32 as to the FP32 model; a BF16/FP16 graph output is FP32 holding the
  stored values.
* Nodes that only move, select or bound values (``DATA_MOVEMENT_OPS`` but Cast/CastLike,
  ``precision.emulate_pass.EXACT_OPS``) produce values already in the format from inputs in the
  format: their outputs are not rounded again (same values, fewer Casts).
* A BF16/FP16 ``LayerNormalization`` with ``stash_type`` != 1 is emulated with statistics in its
  format (``precision.emulate_layernorm``), as ``emulate`` does.

Activation rounding needs ``Cast`` to bfloat16 (opset >= 13), which every model with BF16
tensors has. Nodes inside If/Loop/Scan bodies are handled like the main graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir

from precision_doctor.formats import Precision
from precision_doctor.graph.constants import attr_tensor, ir_tensor
from precision_doctor.graph.weight_store import ir_external_key, stored_copy
from precision_doctor.precision.conv_bias import FUSED, SEPARATE, split_conv_bias
from precision_doctor.precision.emulate import emulate
from precision_doctor.precision.emulate_pass import EXACT_OPS
from precision_doctor.precision.plan import DATA_MOVEMENT_OPS, NodeDecision, PrecisionPlan
from precision_doctor.precision.writer.validate import inferred_dtypes

LOW_TYPES = {ir.DataType.BFLOAT16: Precision.BF16, ir.DataType.FLOAT16: Precision.FP16}
_NO_ROUNDING = (DATA_MOVEMENT_OPS - {"Cast", "CastLike"}) | EXACT_OPS
_TYPE_ATTRIBUTES = ("to", "dtype")


def _reroute(graph: ir.Graph, value: ir.Value, uses, rounded: ir.Value) -> None:
    """Point ``uses`` (taken before the rounding nodes read ``value``) and any graph output
    that is ``value`` at ``rounded``."""
    for use in uses:
        use.node.replace_input_with(use.idx, rounded)
    for i, out in enumerate(graph.outputs):
        if out is value:
            graph.outputs[i] = rounded


@dataclass(frozen=True)
class WrittenEmulationInfo:
    """What ``emulate_written`` did.

    Attributes:
        formats: Low-precision formats found in the model (``bf16``, ``fp16``), sorted.
        rounded_activations: Activation tensors rounded after the node that makes them.
        rounded_inputs: Graph inputs rounded on entry.
        converted_constants: Initializers and Constant/ConstantOfShape values widened to FP32.
        retyped_nodes: Cast (and other typed) nodes retargeted from BF16/FP16 to float.
        stats_layernorms: BF16/FP16 LayerNormalization nodes with low-precision statistics
            (``stash_type`` != 1), emulated through ``precision.emulate``.
        unknown_dtype: Tensors whose element type shape inference could not determine.
    """

    formats: tuple[str, ...] = ()
    rounded_activations: int = 0
    rounded_inputs: int = 0
    converted_constants: int = 0
    retyped_nodes: int = 0
    stats_layernorms: tuple[str, ...] = ()
    unknown_dtype: tuple[str, ...] = ()


def low_precision_formats(model: onnx.ModelProto) -> set[Precision]:
    """The low-precision storage formats (BF16, FP16) of the tensors of a written model.

    Raises:
        UnsupportedModelError: ONNX shape inference cannot run on the model.
    """
    return {LOW_TYPES[t] for t in inferred_dtypes(model).values() if t in LOW_TYPES}


class _Lowering:
    """Mutable state of one pass over the written model."""

    def __init__(self, model: ir.Model, types: dict[str, ir.DataType]) -> None:
        self.model = model
        self.types = types
        self.formats: set[Precision] = set()
        self.rounded = 0
        self.inputs = 0
        self.constants = 0
        self.retyped = 0
        self.unknown: list[str] = []
        self.stats: dict[str, Precision] = {}

    def low(self, value: ir.Value | None) -> Precision | None:
        """The format ``value`` is stored in when the written model types it BF16/FP16."""
        if value is None:
            return None
        # the written model's type by name first: values already lowered are FLOAT here
        dtype = self.types.get(value.name or "", value.dtype)
        if dtype is None:
            if value.name and value.name not in self.unknown:
                self.unknown.append(value.name)
            return None
        fmt = LOW_TYPES.get(dtype)
        if fmt is not None:
            self.formats.add(fmt)
        return fmt

    def run(self) -> None:
        for graph in self.model.graphs():
            self._initializers(graph)
            self._graph_inputs(graph)
            for node in list(graph):
                self._node(graph, node)

    def _initializers(self, graph: ir.Graph) -> None:
        for value in graph.initializers.values():
            if self.low(value) is None or value.const_value is None:
                continue
            value.const_value = _widened(value.const_value, value.name or "")
            value.dtype = ir.DataType.FLOAT
            self.constants += 1

    def _graph_inputs(self, graph: ir.Graph) -> None:
        first = next(iter(graph), None)
        for value in graph.inputs:
            fmt = self.low(value)
            if fmt is None or value.is_initializer():
                continue
            value.dtype = ir.DataType.FLOAT
            uses = list(value.uses())
            nodes, rounded = rounding_nodes(value, fmt, f"pd_written/{fmt.value}/in/{value.name}")
            if first is None:
                graph.extend(nodes)
            else:
                graph.insert_before(first, nodes)
            _reroute(graph, value, uses, rounded)
            self.inputs += 1

    def _node(self, graph: ir.Graph, node: ir.Node) -> None:
        standard = node.domain in ("", "ai.onnx")
        out_formats = [self.low(v) for v in node.outputs]
        in_formats = [self.low(v) for v in node.inputs]
        self._retype_attributes(node)
        if standard and node.op_type == "LayerNormalization" and in_formats and in_formats[0] \
                and _stash_type(node) != 1:
            self.stats[node.name or ""] = in_formats[0]
        exact = standard and node.op_type in _NO_ROUNDING and not (
            "min" in node.attributes or "max" in node.attributes)  # Clip < 11 bounds
        for value, fmt in zip(node.outputs, out_formats):
            if fmt is None:
                continue
            value.dtype = ir.DataType.FLOAT
            if not exact:
                self._round_output(graph, node, value, fmt)

    def _retype_attributes(self, node: ir.Node) -> None:
        changed = False
        for name, attr in list(node.attributes.items()):
            if attr.type == ir.AttributeType.INT and name in _TYPE_ATTRIBUTES \
                    and ir.DataType(attr.as_int()) in LOW_TYPES:
                self.formats.add(LOW_TYPES[ir.DataType(attr.as_int())])
                node.attributes[name] = ir.AttrInt64(name, int(ir.DataType.FLOAT))
                changed = True
            elif attr.type == ir.AttributeType.TENSOR and attr_tensor(attr).dtype in LOW_TYPES:
                tensor = attr_tensor(attr)
                self.formats.add(LOW_TYPES[tensor.dtype])
                node.attributes[name] = ir.AttrTensor(name, _widened(tensor, tensor.name or name))
                self.constants += 1
        self.retyped += changed

    def _round_output(self, graph: ir.Graph, node: ir.Node, out: ir.Value,
                      fmt: Precision) -> None:
        """Round ``out`` in place: consumers and graph outputs see the rounded value under the
        original name (so outputs and layerwise tensors keep their names)."""
        uses = list(out.uses())
        original = out.name
        out.name = f"{original}__pd_unrounded"
        nodes, rounded = rounding_nodes(out, fmt, f"pd_written/{fmt.value}/out/{original}")
        rounded.name = original
        graph.insert_after(node, nodes)
        _reroute(graph, out, uses, rounded)
        self.rounded += 1


def rounding_nodes(x: ir.Value, fmt: Precision, base: str) -> tuple[list[ir.Node], ir.Value]:
    """``Cast(to=fmt)`` then ``Cast(to=float)``: nodes computing round_fmt(x) (FP32 ``x``)."""
    to = ir.DataType.BFLOAT16 if fmt is Precision.BF16 else ir.DataType.FLOAT16
    down = ir.node("Cast", [x], {"to": to}, name=f"{base}/down")
    up = ir.node("Cast", [down.outputs[0]], {"to": ir.DataType.FLOAT}, name=f"{base}/up")
    down.outputs[0].name = f"{base}/0"
    down.outputs[0].dtype = to
    out = up.outputs[0]
    out.name = f"{base}/1"
    out.dtype = ir.DataType.FLOAT
    out.shape = x.shape
    return [down, up], out


def _widened(tensor: ir.TensorProtocol, name: str) -> ir.TensorProtocol:
    """A BF16/FP16 tensor as float32 (exact); external weights through the weight store."""
    stored = ir_external_key(tensor, "widened-fp32")
    if isinstance(tensor, ir.ExternalTensor) and stored is not None:
        source = tensor
        copy, computed = stored_copy(source, stored, ir.DataType.FLOAT, name,
                                     lambda: source.numpy().astype(np.float32))
        if computed:
            source.release()
        return copy
    return ir_tensor(tensor.numpy().astype(np.float32), name=name)


def _stash_type(node: ir.Node) -> int:
    attr = node.attributes.get("stash_type")
    return 1 if attr is None else attr.as_int()


def _fresh_value_info(out: onnx.ModelProto) -> onnx.ModelProto:
    """``out`` with its value_info inferred again (the lowering changed types): ONNX Runtime's
    fusions read it (``precision.emulate_pass.Emulator.finish``: without it SkipLayerNormFusion
    does not fire, which moves a quantized MiniLM's FP32 output by 0.10), so the written
    model's verification sees the fusions the reference had. Dropped when inference fails."""
    del out.graph.value_info[:]
    try:
        inferred = onnx.shape_inference.infer_shapes(out, strict_mode=False)
    except Exception:  # noqa: BLE001 - best effort: ONNX Runtime infers the types itself
        return out
    return inferred


def emulate_written(model: onnx.ModelProto, conv_bias: str = FUSED
                    ) -> tuple[onnx.ModelProto, WrittenEmulationInfo]:
    """The FP32 emulation model of a strongly typed mixed-precision model (not modified).

    Args:
        model: A model with BF16 and/or FP16 tensors, e.g. one ``write_mixed_precision`` wrote.
        conv_bias: ``fused`` or ``separate`` (ONNX Runtime CUDA): as for
            ``precision.emulate.emulate`` (``precision.conv_bias``).

    Returns:
        ``(emulation model, info)``: same graph inputs and outputs, same names; every float
        input and output is float32. A model without BF16/FP16 tensors comes back equivalent
        (its value_info inferred again).

    Raises:
        UnsupportedModelError: ONNX shape inference cannot run on the model (the element type
            of every tensor is needed).
    """
    types = inferred_dtypes(model)
    if conv_bias == SEPARATE:
        low = {ir.DataType.FLOAT16, ir.DataType.BFLOAT16}
        model, added = split_conv_bias(model, lambda n: n.inputs[0] is not None
                                       and types.get(n.inputs[0].name or "") in low)
        if added:
            types = inferred_dtypes(model)
    ir_model = ir.serde.deserialize_model(model)
    lowering = _Lowering(ir_model, types)
    lowering.run()
    out = ir.serde.serialize_model(ir_model)
    out = _fresh_value_info(out)
    stats = tuple(sorted(lowering.stats))
    if stats:  # low-precision LayerNorm statistics: the plan emulator's expansion
        plan = PrecisionPlan(Precision.FP32, {name: NodeDecision(fmt, "written")
                                              for name, fmt in lowering.stats.items()})
        out = emulate(out, plan)[0]
    info = WrittenEmulationInfo(tuple(sorted(f.value for f in lowering.formats)),
                                lowering.rounded, lowering.inputs, lowering.constants,
                                lowering.retyped, stats, tuple(lowering.unknown))
    return out, info
