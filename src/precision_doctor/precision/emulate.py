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

The pass edits the protobuf of the shape-inferred model in place and re-emits its nodes in order
with the rounding nodes between them; the FP32 weights no node reads any more are dropped. A
search builds one emulation per plan: on PP-OCRv4 det in FP16 this takes about a quarter of
the time of the same pass over onnx-ir's object graph (deserialized and serialized back), with
the same nodes, names and values (``benchmarks/probes/emulation_cost.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, TypeVar

import numpy as np
import onnx
from onnx import helper, numpy_helper

from precision_doctor.errors import UnsupportedModelError
from precision_doctor.formats import Precision, round_to
from precision_doctor.graph.external import is_external, tensor_array
from precision_doctor.graph.load import opset_of
from precision_doctor.graph.weight_store import stored_proto_copy
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
_T = onnx.TensorProto
_FLOATS = {_T.FLOAT, _T.DOUBLE}
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
    """Mutable state of one emulation pass over a shape-inferred ``onnx.ModelProto`` that the
    pass owns: nodes are edited in place and re-emitted in order (``emitted``), the rounding of
    a node's inputs before it, of its outputs after it (``after``). Tensors are named: a rounded
    output keeps its name (consumers and graph outputs read it), its raw value is renamed."""

    def __init__(self, model: onnx.ModelProto, plan: PrecisionPlan,
                 dtypes: dict[str, int], types: dict[str, onnx.TypeProto]) -> None:
        self.model = model
        self.graph = model.graph
        self.plan = plan
        self.opset = opset_of(model)
        self.dtypes = dtypes  # tensor name -> element type (known types only)
        self.types = types  # tensor name -> type, for value_info
        self.inits = {t.name: t for t in self.graph.initializer}
        self.producers = {o: n for n in self.graph.node for o in n.output if o}
        self.emitted: list[onnx.NodeProto] = []
        self.after: list[onnx.NodeProto] = []
        self.added_inits: list[onnx.TensorProto] = []
        self.cache: dict[tuple[str, Precision], str] = {}
        self.rounded: dict[Precision, set[str]] = {p: set() for p in Precision}
        self.n_act = 0
        self.n_init = 0
        self.unknown: dict[str, None] = {}
        self.methods: dict[str, str] = {}
        self.constants: set[str] = set()  # tensors computed from constants only

    # -- rounding primitives -------------------------------------------------------------
    def _method(self, p: Precision) -> str:
        if p is Precision.FP16 or (p is Precision.BF16 and self.opset >= 13):
            return "cast"
        return "veltkamp"

    def _typed(self, name: str, like: str) -> None:
        """Give tensor ``name`` the element type and value_info type of tensor ``like``."""
        self.dtypes[name] = self.dtypes.get(like) or _T.FLOAT
        self.types[name] = self.types.get(like) or helper.make_tensor_type_proto(
            self.dtypes[name], None)

    def _round_nodes(self, x: str, p: Precision, tag: str, out: str | None = None
                     ) -> tuple[list[onnx.NodeProto], str]:
        """Nodes computing round_p(x) (their last output named ``out`` if given) and the name
        of their output."""
        dtype = self.dtypes.get(x) or _T.FLOAT
        method = self._method(p)
        self.methods[p.value] = method
        base = f"pd_round/{p.value}/{tag}"
        names = [f"{base}/{i}" for i in range(2 if method == "cast" else 4)]
        if out is not None:
            names[-1] = out
        if method == "cast":
            to = _T.FLOAT16 if p is Precision.FP16 else _T.BFLOAT16
            nodes = [helper.make_node("Cast", [x], [names[0]], name=f"{base}/down", to=to),
                     helper.make_node("Cast", [names[0]], [names[1]], name=f"{base}/up",
                                      to=dtype)]
        else:
            bits = _SPLIT_BITS[p] + (29 if dtype == _T.DOUBLE else 0)
            np_dtype = np.float64 if dtype == _T.DOUBLE else np.float32
            k = numpy_helper.from_array(np.array(2.0**bits + 1.0, np_dtype))
            nodes = [helper.make_node("Constant", [], [names[0]], name=f"{base}/k", value=k),
                     helper.make_node("Mul", [x, names[0]], [names[1]], name=f"{base}/c"),
                     helper.make_node("Sub", [names[1], x], [names[2]], name=f"{base}/d"),
                     helper.make_node("Sub", [names[1], names[2]], [names[3]],
                                      name=f"{base}/hi")]
        self._typed(names[-1], x)
        return nodes, names[-1]

    def _const_tensor(self, x: str) -> onnx.TensorProto | None:
        """The weight or ``Constant`` value behind tensor ``x``, or None."""
        if x in self.inits:
            return self.inits[x]
        node = self.producers.get(x)
        if node is None or node.op_type != "Constant" or node.domain not in ("", "ai.onnx") \
                or len(node.attribute) != 1:
            return None
        attr = node.attribute[0]
        if attr.name == "value":
            return attr.t
        if attr.name in ("value_float", "value_floats"):
            values = attr.f if attr.name == "value_float" else list(attr.floats)
            return numpy_helper.from_array(np.array(values, np.float32))
        return None

    def rounded_input(self, x: str, p: Precision) -> str:
        """A tensor equal to round_p(x), created once per (x, p)."""
        key = (x, p)
        if key in self.cache:
            return self.cache[key]
        const = self._const_tensor(x)
        if const is not None:
            new = f"{x}__pd_{p.value}"
            if is_external(const):  # rounded into the weight store, once per process
                tensor = stored_proto_copy(
                    const, p.value, new, lambda a: round_to(a, p).astype(a.dtype))
            else:
                array = tensor_array(const)
                tensor = numpy_helper.from_array(round_to(array, p).astype(array.dtype), new)
            self.added_inits.append(tensor)
            self.n_init += 1
        else:
            nodes, new = self._round_nodes(x, p, f"in/{x}")
            self.emitted.extend(nodes)
            self.n_act += 1
        self.rounded[p].add(new)
        self.cache[key] = new
        return new

    def round_output(self, node: onnx.NodeProto, index: int, p: Precision) -> None:
        """Round output ``index`` of ``node`` after it: consumers and graph outputs read the
        rounded value under the original name (so layerwise comparison finds it)."""
        original = node.output[index]
        raw = f"{original}__pd_raw"
        node.output[index] = raw
        self._typed(raw, original)
        nodes, _ = self._round_nodes(raw, p, f"out/{original}", out=original)
        self.after.extend(nodes)
        self.rounded[p].add(original)
        self.n_act += 1

    # -- the pass ------------------------------------------------------------------------
    def is_float(self, name: str) -> bool:
        if not name:
            return False
        dtype = self.dtypes.get(name)
        if dtype is None:
            self.unknown[name] = None
            return False
        return dtype in _FLOATS

    def run(self) -> None:
        for node in list(self.graph.node):
            self.after = []
            if node.op_type in DATA_MOVEMENT_OPS and node.op_type not in CAST_OPS:
                self._follow_producer(node)
            else:
                p = self.plan.precision_of(node.name)
                if p is Precision.TF32:
                    if node.op_type in TF32_OPS and node.domain in ("", "ai.onnx") \
                            and not self._depthwise(node):
                        self._tf32_node(node, p)
                elif p is not Precision.FP32:
                    self._low_precision_node(node, p)
            self.emitted.append(node)
            self.emitted.extend(self.after)

    def _tf32_node(self, node: onnx.NodeProto, p: Precision) -> None:
        """Round the two multiplicands of a TF32 MatMul/Gemm/Conv."""
        for i in range(min(2, len(node.input))):
            if self.is_float(node.input[i]):
                node.input[i] = self.rounded_input(node.input[i], p)

    def _constant(self, v: str) -> bool:
        """Whether ``v`` is a weight, a Constant's output, or data movement on those only."""
        if v in self.constants or v in self.inits:
            return True
        producer = self.producers.get(v)
        return producer is not None and producer.op_type == "Constant"

    def _follow_producer(self, node: onnx.NodeProto) -> None:
        """A data-movement node: its outputs are in a format when all its float inputs are.

        Constants do not vote, as in the writer (``precision.writer.decide``): a constant that
        meets an FP16 tensor in a data-movement node (``Where(c, x, Expand(b))``) is stored in
        FP16 there and rounded here, unless the plan names the node FP32 (found by
        tests/fuzz). Data movement on constants only stays a constant."""
        floats = [v for v in node.input if self.is_float(v)]
        voters = [v for v in floats if not self._constant(v)]
        if not voters:
            self.constants.update(o for o in node.output if self.is_float(o))
            return
        pinned = self.plan.overrides.get(node.name)
        fp32 = pinned is not None and pinned.precision is Precision.FP32
        for p in (Precision.FP16, Precision.BF16):
            if not all(v in self.rounded[p] for v in voters):
                continue
            if fp32 and len(voters) < len(floats):
                continue  # FP32 by the plan: its constants stay FP32, its output is mixed
            for i, v in enumerate(node.input):
                if v in floats and v not in voters:
                    node.input[i] = self.rounded_input(v, p)
            self.rounded[p].update(o for o in node.output if self.is_float(o))

    def _exact(self, node: onnx.NodeProto) -> bool:
        """Whether ``node``'s outputs are already in the format (``EXACT_OPS``; Clip < 11
        takes its bounds as attributes, which are not rounded)."""
        return node.op_type in EXACT_OPS and node.domain in ("", "ai.onnx") \
            and not any(a.name in ("min", "max") for a in node.attribute)

    def _low_precision_node(self, node: onnx.NodeProto, p: Precision) -> None:
        # A Cast reads its input as its producer stored it (FP32 from an FP32 node: a Cast to
        # int64 of an FP32 value is not rounded first); its float output is in the node's format.
        if node.op_type not in CAST_OPS:
            for i, v in enumerate(node.input):
                if self.is_float(v) and v not in self.rounded[p]:
                    node.input[i] = self.rounded_input(v, p)
        exact = self._exact(node)
        for i, out in enumerate(node.output):
            if not self.is_float(out):
                continue
            if exact:  # already representable: rounding it again would change nothing
                self.rounded[p].add(out)
            else:
                self.round_output(node, i, p)

    def _depthwise(self, node: onnx.NodeProto) -> bool:
        """A Conv with one input channel per group (weights [C_out, 1, k...]) and group > 1."""
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        if node.op_type != "Conv" or group <= 1 or len(node.input) < 2:
            return False
        w = node.input[1]
        if w in self.inits:
            dims = list(self.inits[w].dims)
        else:
            shape = self.types[w].tensor_type.shape if w in self.types else None
            dims = [d.dim_value if d.HasField("dim_value") else None for d in shape.dim] \
                if shape is not None else []
        return len(dims) >= 2 and dims[1] == 1

    def finish(self) -> onnx.ModelProto:
        """The emulation model: the emitted nodes, the weights some node still reads (an FP32
        weight every reader of which now reads its rounded copy goes, as ONNX Runtime would
        drop it at session creation) plus the rounded ones, and the value_info of every typed
        tensor a node writes (ONNX Runtime's fusions read it: without it
        ``SkipLayerNormFusion`` does not fire on a quantized MiniLM, which moves its FP32
        output by 0.10 relative L2, so even the all-FP32 plan would not be the reference,
        ``search.invariant``)."""
        graph = self.graph
        del graph.node[:]
        graph.node.extend(self.emitted)
        read = {v for n in self.emitted for v in n.input} | _outer_reads(self.emitted)
        read.update(v.name for v in (*graph.input, *graph.output))
        kept = [t for t in graph.initializer if t.name in read]
        del graph.initializer[:]
        graph.initializer.extend(kept + self.added_inits)
        io = {v.name for v in (*graph.input, *graph.output)}
        written = [o for n in self.emitted for o in n.output if o and o not in io]
        del graph.value_info[:]
        graph.value_info.extend(onnx.ValueInfoProto(name=o, type=self.types[o])
                                for o in written if o in self.types)
        return self.model


def _outer_reads(nodes: list[onnx.NodeProto]) -> set[str]:
    """Every tensor name read inside the subgraphs of ``nodes`` (outer-scope reads included)."""
    read: set[str] = set()
    for node in nodes:
        for attr in node.attribute:
            for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                read.update(v for n in g.node for v in n.input)
                read.update(_outer_reads(list(g.node)))
    return read


def _subgraph_nodes(nodes) -> int:
    """Nodes inside the subgraphs of ``nodes``, at any depth."""
    count = 0
    for node in nodes:
        for attr in node.attribute:
            for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                count += len(g.node) + _subgraph_nodes(g.node)
    return count


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
    out, info, _ = build_emulation(model, lambda m, d, t: _Emulator(m, plan, d, t))
    return out, info


def build_emulation(model: onnx.ModelProto, make: Callable[..., _E]
                    ) -> tuple[onnx.ModelProto, EmulationInfo, _E]:
    """Infer ``model``'s types, run the emulator ``make(inferred, dtypes, types)`` builds on
    the inferred copy, and return the result (shared by ``emulate`` and
    ``precision.emulate_switch``).

    Raises:
        UnsupportedModelError: Shape/type inference of the model failed.
    """
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception as exc:  # inference can fail on custom ops; fall back to the bare model
        raise UnsupportedModelError(
            f"ONNX shape inference failed ({exc}); the emulator needs tensor dtypes. Run "
            "onnx.shape_inference or export with value_info.") from exc
    graph = inferred.graph
    types = {v.name: v.type for v in (*graph.input, *graph.value_info, *graph.output)
             if v.type.HasField("tensor_type")}
    dtypes = {name: t.tensor_type.elem_type for name, t in types.items()
              if t.tensor_type.elem_type}
    dtypes.update((t.name, t.data_type) for t in graph.initializer)
    _contrib_dtypes(inferred, dtypes, types)
    emulator = make(inferred, dtypes, types)
    emulator.run()
    subgraph_nodes = _subgraph_nodes(graph.node)
    out = emulator.finish()
    info = EmulationInfo(emulator.n_act, emulator.n_init, dict(sorted(emulator.methods.items())),
                         tuple(emulator.unknown), subgraph_nodes)
    return out, info, emulator


def _contrib_dtypes(inferred: onnx.ModelProto, dtypes: dict[str, int],
                    types: dict[str, onnx.TypeProto]) -> None:
    """Give the outputs of ops ONNX inference cannot type (``com.microsoft`` Gelu, ...), and
    what inference then left untyped after them, their element type from ONNX Runtime's
    schema, as the writer does
    (``precision.writer.validate.inferred_dtypes``): an FP16 node reading such a float output
    rounds it, as the written model casts it (found by tests/fuzz)."""
    if not any(o and o not in dtypes for n in inferred.graph.node
               if n.domain not in ("", "ai.onnx") for o in n.output):
        return
    from precision_doctor.precision.writer.validate import inferred_dtypes

    found = inferred_dtypes(inferred)  # also what ONNX inference left untyped downstream
    for name in (o for n in inferred.graph.node for o in n.output if o and o not in dtypes):
        dtype = found.get(name)
        if dtype is not None:
            dtypes[name] = int(dtype)
            types[name] = helper.make_tensor_type_proto(int(dtype), None)


def describe_method(model: onnx.ModelProto, precision: Precision) -> str:
    """One line saying how activations are rounded for ``precision`` on this model's opset."""
    if precision is Precision.FP16:
        return "Cast to float16 and back (RNE, IEEE-754 binary16)"
    if precision is Precision.BF16 and opset_of(model) >= 13:
        return "Cast to bfloat16 and back (RNE)"
    if precision is Precision.FP32:
        return "no rounding"
    return f"Veltkamp split to {23 - _SPLIT_BITS[precision]} mantissa bits (ties may round away)"
