"""CPU emulation of reduced precision: rewrite a model so ONNX Runtime CPU computes what an
engine running a ``PrecisionPlan`` would store.

Model of an engine (a strongly typed network, the behaviour TensorRT >= 10 guarantees):

* FP16/BF16 node: every floating input is rounded to the format (the engine's Cast at a
  precision boundary, or a weight stored in the format), the node computes, and every floating
  output is rounded to the format. Internal accumulation is FP32 (what tensor-core GEMM/conv
  kernels and ONNX Runtime CUDA's reductions do).
* TF32 node (MatMul/Gemm/Conv/ConvTranspose only): the two multiplicands are rounded to 10
  mantissa bits with the FP32 exponent range; accumulation and output stay FP32. Depthwise
  convolutions (one input channel per group) are left in FP32: cuDNN runs them on CUDA cores,
  not tensor cores, so TF32 does not apply (measured on an H200: emulating them as TF32
  overestimated PP-OCRv4 cls's TF32 error 2.7x; see BENCHMARKS.md).
* FP32 node: unchanged.
* Ops that only select, negate or bound values (Relu, Clip, MaxPool, Max, ...; ``EXACT_OPS``)
  produce values already in the format from rounded inputs: their output round trip would be
  the identity and is left out.
* Data-movement nodes (Reshape, Concat, Slice, Gather, ...) do no arithmetic: they carry values
  in the format their producers stored them in, whatever the plan says about them (the
  strongly typed writer gives them their producer's precision too; one the plan names FP32 it
  writes in FP32 with Casts around it, which moves the same values).
* A ``Cast``/``CastLike`` node is a candidate when it writes a float tensor
  (``precision.plan.candidate_nodes``): in FP16/BF16 its float output is rounded (an int32
  accumulator of 1.2e5 becomes inf in FP16), its input is read as its producer stored it.

Rounding is round-to-nearest-even with overflow to inf, FP16 subnormals kept and values below
half the smallest subnormal flushed to zero (ONNX ``Cast`` semantics). Initializers are rounded
ahead of time with ``ml_dtypes`` (exact RNE). Activations use ``Cast`` round trips; where the
opset has no ``bfloat16`` Cast (< 13) and for TF32, a Veltkamp split rounds to the target
mantissa: c = x*(2^s+1), hi = c - (c - x) (Dekker 1971, "A floating-point technique for
extending the available precision"), which is round-to-nearest except that exact ties may round
away from even and |x| > FLT_MAX / 2^s overflows.

A ``LayerNormalization`` with ``stash_type`` != 1 on an FP16/BF16 node is expanded into its
statistics chain first (``emulate_layernorm``), so its statistics are rounded like the engine's;
with ``stash_type`` = 1 (the default) the op runs in FP32 on its rounded input.

Nodes inside subgraphs (If/Loop/Scan bodies) are left in FP32; ``EmulationInfo`` counts them.

Weights kept in external data files (``graph.external``) are rounded into the process's weight
store once per (tensor, format) and referenced from there, so the emulation model of a model of
any size stays a small proto and repeated emulations (search, layerwise) reuse the rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, TypeVar

import numpy as np
import onnx
import onnx_ir as ir

from precision_doctor.errors import UnsupportedModelError
from precision_doctor.formats import Precision, round_to
from precision_doctor.graph.constants import const_tensor, ir_tensor
from precision_doctor.graph.load import opset_of
from precision_doctor.graph.weight_store import ir_external_key, stored_copy
from precision_doctor.precision.conv_bias import FUSED, SEPARATE, split_conv_bias
from precision_doctor.precision.emulate_layernorm import expand_low_precision_stats
from precision_doctor.precision.plan import (
    CAST_OPS,
    DATA_MOVEMENT_OPS,
    NodeDecision,
    PrecisionPlan,
)

TF32_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose"})
# Ops whose every output element is one of their (rounded) input elements, its negation, its
# absolute value or a (rounded) bound: the output of such a node in FP16/BF16 is already in the
# format, so its output round trip is skipped (same values, two Casts fewer per tensor).
EXACT_OPS = frozenset({"Relu", "Clip", "MaxPool", "Abs", "Neg", "Max", "Min", "ReduceMax",
                       "ReduceMin"})
_FLOATS = {ir.DataType.FLOAT, ir.DataType.DOUBLE}
_SPLIT_BITS = {Precision.TF32: 13, Precision.BF16: 16}  # FP32 mantissa bits dropped (23 - kept)


@dataclass(frozen=True)
class EmulationInfo:
    """What the emulation did.

    Attributes:
        rounded_activations: Number of activation tensors rounded at run time.
        rounded_initializers: Number of initializer copies rounded ahead of time.
        method: Format -> rounding method used for activations (``cast`` or ``veltkamp``).
        unknown_dtype: Tensors whose dtype shape inference could not determine (not rounded).
        subgraph_nodes: Nodes inside subgraphs, left in FP32.
    """

    rounded_activations: int = 0
    rounded_initializers: int = 0
    method: dict[str, str] = field(default_factory=dict)
    unknown_dtype: tuple[str, ...] = ()
    subgraph_nodes: int = 0


_E = TypeVar("_E", bound="_Emulator")


class _Emulator:
    """Mutable state of one emulation pass over an ``ir.Model``."""

    def __init__(self, model: ir.Model, plan: PrecisionPlan) -> None:
        self.model = model
        self.graph = model.graph
        self.plan = plan
        self.opset = model.opset_imports.get("", 1)
        self.cache: dict[tuple[int, Precision], ir.Value] = {}
        self.rounded: dict[Precision, set[int]] = {p: set() for p in Precision}
        self.n_act = 0
        self.n_init = 0
        self.unknown: list[str] = []
        self.methods: dict[str, str] = {}
        self.constants: set[int] = set()  # values computed from constants only

    # -- rounding primitives -------------------------------------------------------------
    def _method(self, p: Precision) -> str:
        if p is Precision.FP16 or (p is Precision.BF16 and self.opset >= 13):
            return "cast"
        return "veltkamp"

    def _round_nodes(self, x: ir.Value, p: Precision, tag: str) -> tuple[list[ir.Node], ir.Value]:
        """Nodes computing round_p(x) and their output value."""
        dtype = x.dtype or ir.DataType.FLOAT
        method = self._method(p)
        self.methods[p.value] = method
        base = f"pd_round/{p.value}/{tag}"
        if method == "cast":
            to = ir.DataType.FLOAT16 if p is Precision.FP16 else ir.DataType.BFLOAT16
            down = ir.node("Cast", [x], {"to": to}, name=f"{base}/down")
            up = ir.node("Cast", [down.outputs[0]], {"to": dtype}, name=f"{base}/up")
            nodes = [down, up]
        else:
            bits = _SPLIT_BITS[p] + (29 if dtype == ir.DataType.DOUBLE else 0)
            np_dtype = np.float64 if dtype == ir.DataType.DOUBLE else np.float32
            const = ir.node("Constant", [], {"value": ir.tensor(np_dtype(2.0**bits + 1.0))},
                            name=f"{base}/k")
            c = ir.node("Mul", [x, const.outputs[0]], name=f"{base}/c")
            d = ir.node("Sub", [c.outputs[0], x], name=f"{base}/d")
            hi = ir.node("Sub", [c.outputs[0], d.outputs[0]], name=f"{base}/hi")
            nodes = [const, c, d, hi]
        for i, n in enumerate(nodes):
            for o in n.outputs:
                o.name = f"{base}/{i}"
        out = nodes[-1].outputs[0]
        out.dtype = dtype
        out.shape = x.shape
        return nodes, out

    def rounded_input(self, x: ir.Value, p: Precision, before: ir.Node) -> ir.Value:
        """A value equal to round_p(x), created once per (x, p)."""
        key = (id(x), p)
        if key in self.cache:
            return self.cache[key]
        const = x.const_value if x.is_initializer() else const_tensor(x)
        if const is not None:
            name = f"{x.name}__pd_{p.value}"
            stored = ir_external_key(const, p.value)
            tensor: ir.TensorProtocol
            if isinstance(const, ir.ExternalTensor) and stored is not None:
                # External weight: the rounded copy goes to the weight store, once per process.
                source = const
                tensor, computed = stored_copy(
                    source, stored, source.dtype, name,
                    lambda: round_to(source.numpy(), p).astype(source.dtype.numpy()))
                if computed:
                    source.release()  # unmap the source weights
            else:
                array = const.numpy()
                tensor = ir_tensor(round_to(array, p).astype(array.dtype), name=name)
            new = ir.Value(name=name, type=x.type, shape=x.shape, const_value=tensor)
            self.graph.register_initializer(new)
            self.n_init += 1
        else:
            nodes, new = self._round_nodes(x, p, f"in/{x.name}")
            self.graph.insert_before(before, nodes)
            self.n_act += 1
        self.rounded[p].add(id(new))
        self.cache[key] = new
        return new

    def round_output(self, node: ir.Node, out: ir.Value, p: Precision) -> None:
        """Round ``out`` in place: consumers and graph outputs see the rounded value, which
        keeps the original tensor name (so layerwise comparison finds it)."""
        uses = list(out.uses())
        original = out.name
        out.name = f"{original}__pd_raw"
        nodes, rounded = self._round_nodes(out, p, f"out/{original}")
        rounded.name = original
        self.graph.insert_after(node, nodes)
        for use in uses:
            use.node.replace_input_with(use.idx, rounded)
        for i, g_out in enumerate(self.graph.outputs):
            if g_out is out:
                self.graph.outputs[i] = rounded
        self.rounded[p].add(id(rounded))
        self.n_act += 1

    # -- the pass ------------------------------------------------------------------------
    def is_float(self, v: ir.Value | None) -> bool:
        if v is None:
            return False
        if v.dtype is None:
            if v.name and v.name not in self.unknown:
                self.unknown.append(v.name)
            return False
        return v.dtype in _FLOATS

    def run(self) -> None:
        for node in list(self.graph):
            if node.op_type in DATA_MOVEMENT_OPS and node.op_type not in CAST_OPS:
                self._follow_producer(node)
                continue
            p = self.plan.precision_of(node.name or "")
            if p is Precision.FP32:
                continue
            if p is Precision.TF32:
                if node.op_type in TF32_OPS and node.domain in ("", "ai.onnx") \
                        and not _depthwise(node):
                    self._tf32_node(node, p)
                continue
            self._low_precision_node(node, p)

    def _tf32_node(self, node: ir.Node, p: Precision) -> None:
        """Round the two multiplicands of a TF32 MatMul/Gemm/Conv."""
        for i in (0, 1):
            v = node.inputs[i] if i < len(node.inputs) else None
            if v is not None and self.is_float(v):
                node.replace_input_with(i, self.rounded_input(v, p, node))

    def _constant(self, v: ir.Value) -> bool:
        """Whether ``v`` is a weight, a Constant's output, or data movement on those only."""
        if id(v) in self.constants:
            return True
        producer = v.producer()
        return v.is_initializer() or v.const_value is not None or (
            producer is not None and producer.op_type == "Constant")

    def _follow_producer(self, node: ir.Node) -> None:
        """A data-movement node: its outputs are in a format when all its float inputs are.

        Constants do not vote, as in the writer (``precision.writer.decide``): a constant that
        meets an FP16 tensor in a data-movement node (``Where(c, x, Expand(b))``) is stored in
        FP16 there and rounded here, unless the plan names the node FP32 (found by
        tests/fuzz). Data movement on constants only stays a constant."""
        floats = [v for v in node.inputs if v is not None and self.is_float(v)]
        voters = [v for v in floats if not self._constant(v)]
        if not voters:
            self.constants.update(id(o) for o in node.outputs if self.is_float(o))
            return
        pinned = self.plan.overrides.get(node.name or "")
        fp32 = pinned is not None and pinned.precision is Precision.FP32
        for p in (Precision.FP16, Precision.BF16):
            if not all(id(v) in self.rounded[p] for v in voters):
                continue
            if fp32 and len(voters) < len(floats):
                continue  # FP32 by the plan: its constants stay FP32, its output is mixed
            for i, v in enumerate(node.inputs):
                if v is not None and v in floats and v not in voters:
                    node.replace_input_with(i, self.rounded_input(v, p, node))
            self.rounded[p].update(id(o) for o in node.outputs if self.is_float(o))

    def _low_precision_node(self, node: ir.Node, p: Precision) -> None:
        # A Cast reads its input as its producer stored it (FP32 from an FP32 node: a Cast to
        # int64 of an FP32 value is not rounded first); its float output is in the node's format.
        cast = node.op_type in CAST_OPS
        for i, v in enumerate(node.inputs):
            if not cast and v is not None and self.is_float(v) and id(v) not in self.rounded[p]:
                node.replace_input_with(i, self.rounded_input(v, p, node))
        exact = (node.op_type in EXACT_OPS and node.domain in ("", "ai.onnx")
                 and not ("min" in node.attributes or "max" in node.attributes))  # Clip < 11
        for out in node.outputs:
            if not self.is_float(out):
                continue
            if exact:  # already representable: rounding it again would change nothing
                self.rounded[p].add(id(out))
            else:
                self.round_output(node, out, p)


def _depthwise(node: ir.Node) -> bool:
    """A Conv with one input channel per group (weights [C_out, 1, k...]) and group > 1."""
    group = node.attributes.get("group")
    if node.op_type != "Conv" or group is None or group.as_int() <= 1 or len(node.inputs) < 2:
        return False
    w = node.inputs[1]
    shape = w.shape if w is not None else None
    return shape is not None and len(shape) >= 2 and shape[1] == 1


def emulate(model: onnx.ModelProto, plan: PrecisionPlan, conv_bias: str = FUSED
            ) -> tuple[onnx.ModelProto, EmulationInfo]:
    """Build the emulation model of ``model`` under ``plan`` (the input is not modified).

    Args:
        model: FP32 (or FP64) ONNX model.
        plan: Precision of every node.
        conv_bias: Where the engine adds an FP16/BF16 convolution's bias
            (``precision.conv_bias``): ``fused`` (before the one rounding: TensorRT) or
            ``separate`` (after rounding the convolution, rounded again: ONNX Runtime CUDA).

    Returns:
        The emulation model (same inputs and outputs, same names) and what was done.

    Raises:
        PlanError: ``plan`` names nodes the model does not have.
        UnsupportedModelError: Shape/type inference of the model failed.
    """
    plan.validate(model)
    if conv_bias == SEPARATE:
        model, added = split_conv_bias(model, lambda n: plan.precision_of(n.name or "") in (
            Precision.FP16, Precision.BF16))
        plan = plan.with_overrides({add: NodeDecision(plan.precision_of(conv), "engine",
                                                      "bias added after the rounded Conv")
                                    for conv, add in added.items()})
    model, plan = expand_low_precision_stats(model, plan)  # stash_type=0 LayerNorms
    out, info, _ = build_emulation(model, lambda m: _Emulator(m, plan))
    return out, info


def build_emulation(model: onnx.ModelProto, make: Callable[[ir.Model], _E]
                    ) -> tuple[onnx.ModelProto, EmulationInfo, _E]:
    """Infer ``model``'s types, run the emulator ``make`` builds on it, and serialize the
    result (shared by ``emulate`` and ``precision.emulate_switch``).

    Raises:
        UnsupportedModelError: Shape/type inference of the model failed.
    """
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception as exc:  # inference can fail on custom ops; fall back to the bare model
        raise UnsupportedModelError(
            f"ONNX shape inference failed ({exc}); the emulator needs tensor dtypes. Run "
            "onnx.shape_inference or export with value_info.") from exc
    ir_model = ir.serde.deserialize_model(inferred)
    _contrib_dtypes(inferred, ir_model)
    emulator = make(ir_model)
    emulator.run()
    subgraph_nodes = sum(1 for _ in ir_model.graph.all_nodes()) - len(list(ir_model.graph))
    out = ir.serde.serialize_model(ir_model)
    _keep_value_info(out)
    info = EmulationInfo(emulator.n_act, emulator.n_init, dict(sorted(emulator.methods.items())),
                         tuple(emulator.unknown), subgraph_nodes)
    return out, info, emulator


def _keep_value_info(out: onnx.ModelProto) -> None:
    """Keep the inferred ``value_info`` of the emulation model's tensors (a rounded tensor
    keeps its name, element type and shape; its raw value is typed like it), dropping only
    entries whose tensor no node writes any more. ONNX Runtime's fusions read it: without it
    ``SkipLayerNormFusion`` does not fire on a quantized MiniLM, which moves its FP32 output
    by 0.10 relative L2 (8-bit activation rounding flips), so even the all-FP32 plan would not
    be the reference (``search.invariant``)."""
    written = {o for n in out.graph.node for o in n.output}
    keep = [vi for vi in out.graph.value_info if vi.name in written]
    del out.graph.value_info[:]
    out.graph.value_info.extend(keep)


def _contrib_dtypes(inferred: onnx.ModelProto, ir_model: ir.Model) -> None:
    """Give the outputs of ops ONNX inference cannot type (``com.microsoft`` Gelu, ...), and
    what inference then left untyped after them, their element type from ONNX Runtime's
    schema, as the writer does
    (``precision.writer.validate.inferred_dtypes``): an FP16 node reading such a float output
    rounds it, as the written model casts it (found by tests/fuzz)."""
    if not any(v.dtype is None for n in ir_model.graph for v in n.outputs
               if n.domain not in ("", "ai.onnx")):
        return
    from precision_doctor.precision.writer.validate import inferred_dtypes

    types = inferred_dtypes(inferred)  # also what ONNX inference left untyped downstream
    for v in (v for n in ir_model.graph for v in n.outputs if v.dtype is None):
        dtype = types.get(v.name or "")
        if dtype is not None:
            v.dtype = dtype


def describe_method(model: onnx.ModelProto, precision: Precision) -> str:
    """One line saying how activations are rounded for ``precision`` on this model's opset."""
    if precision is Precision.FP16:
        return "Cast to float16 and back (RNE, IEEE-754 binary16)"
    if precision is Precision.BF16 and opset_of(model) >= 13:
        return "Cast to bfloat16 and back (RNE)"
    if precision is Precision.FP32:
        return "no rounding"
    return f"Veltkamp split to {23 - _SPLIT_BITS[precision]} mantissa bits (ties may round away)"
