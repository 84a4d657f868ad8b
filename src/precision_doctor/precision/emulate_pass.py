"""The emulation pass (``precision.emulate``) over a shape-inferred model's protobuf: its nodes
are edited in place and re-emitted in order with the rounding nodes between them, so a search
that builds one emulation per plan pays for no object graph per build (``precision.emulate``
gives the semantics and the cost).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from precision_doctor.formats import Precision, round_to
from precision_doctor.graph.constants import constant_attr_array
from precision_doctor.graph.external import is_external, read_names, tensor_array
from precision_doctor.graph.load import opset_of
from precision_doctor.graph.weight_store import stored_proto_copy
from precision_doctor.precision.plan import CAST_OPS, DATA_MOVEMENT_OPS, PrecisionPlan

TF32_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose"})
# Ops whose every output element is one of their (rounded) input elements, its negation, its
# absolute value or a (rounded) bound: the output of such a node in FP16/BF16 is already in the
# format, so its output round trip is skipped (same values, two Casts fewer per tensor).
EXACT_OPS = frozenset({"Relu", "Clip", "MaxPool", "Abs", "Neg", "Max", "Min", "ReduceMax",
                       "ReduceMin"})
_T = onnx.TensorProto
_FLOATS = {_T.FLOAT, _T.DOUBLE}
SPLIT_BITS = {Precision.TF32: 13, Precision.BF16: 16}  # FP32 mantissa bits dropped (23 - kept)


class Emulator:
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
            bits = SPLIT_BITS[p] + (29 if dtype == _T.DOUBLE else 0)
            np_dtype = np.float64 if dtype == _T.DOUBLE else np.float32
            k = numpy_helper.from_array(np.array(2.0**bits + 1.0, np_dtype))
            nodes = [helper.make_node("Constant", [], [names[0]], name=f"{base}/k", value=k),
                     helper.make_node("Mul", [x, names[0]], [names[1]], name=f"{base}/c"),
                     helper.make_node("Sub", [names[1], x], [names[2]], name=f"{base}/d"),
                     helper.make_node("Sub", [names[1], names[2]], [names[3]],
                                      name=f"{base}/hi")]
        self._typed(names[-1], x)
        return nodes, names[-1]

    def _const_value(self, x: str) -> onnx.TensorProto | np.ndarray | None:
        """The weight (its ``TensorProto``) or ``Constant`` value behind tensor ``x``, or None."""
        if x in self.inits:
            return self.inits[x]
        node = self.producers.get(x)
        if node is None or node.op_type != "Constant" or node.domain not in ("", "ai.onnx") \
                or len(node.attribute) != 1:
            return None
        return constant_attr_array(node.attribute[0])

    def rounded_input(self, x: str, p: Precision) -> str:
        """A tensor equal to round_p(x), created once per (x, p)."""
        key = (x, p)
        if key in self.cache:
            return self.cache[key]
        const = self._const_value(x)
        if const is not None:
            new = f"{x}__pd_{p.value}"
            if isinstance(const, onnx.TensorProto) and is_external(const):  # once per process
                tensor = stored_proto_copy(
                    const, p.value, new, lambda a: round_to(a, p).astype(a.dtype))
            else:
                array = tensor_array(const) if isinstance(const, onnx.TensorProto) else const
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
        read = read_names(graph, {v.name for v in graph.input})  # subgraphs' reads too
        kept = [t for t in graph.initializer if t.name in read]
        del graph.initializer[:]
        graph.initializer.extend(kept + self.added_inits)
        io = {v.name for v in (*graph.input, *graph.output)}
        written = [o for n in self.emitted for o in n.output if o and o not in io]
        del graph.value_info[:]
        graph.value_info.extend(onnx.ValueInfoProto(name=o, type=self.types[o])
                                for o in written if o in self.types)
        return self.model


def subgraph_nodes(nodes) -> int:
    """Nodes inside the subgraphs of ``nodes``, at any depth."""
    count = 0
    for node in nodes:
        for attr in node.attribute:
            for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                count += len(g.node) + subgraph_nodes(g.node)
    return count
