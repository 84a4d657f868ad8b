"""Residual streams that only scale-invariant normalizations read: which tensors, which
constants scale them, and what blocks a stream.

A stream is the smallest set S of float tensors, grown from the data input of each
``GroupNormalization``, ``InstanceNormalization``, ``LayerNormalization`` and
``RMSNormalization`` (opset 23: x / sqrt(mean(x^2) + eps), as scale-invariant), such that every
consumer of a tensor of S is

* such a normalization reading it as its data (input 0; a LayerNormalization whose Mean or
  InvStdDev output is read blocks; PyTorch's export of GroupNorm before opset 18,
  Reshape -> InstanceNormalization -> Reshape -> Mul -> Add, is one through data movement),
* a decomposed RMSNorm (``rms``: T5's and LLaMA's export of x * rsqrt(mean(x^2) + eps)),
* ``Shape``/``Size`` (they read its shape only), or
* a further part of the stream: ``Add``/``Sub``/``Concat``/``Sum`` (their output joins S, and
  so do their other activation operands), a positively homogeneous op of one data input
  (data movement, a Cast to a float type, Resize, MaxPool, AveragePool, Relu, LeakyRelu, a Mul
  or Div by a constant: f(s x) = s f(x) for s > 0; output joins S), or a
  Conv/ConvTranspose/MatMul/Gemm with constant weights reading it as data
  (W (s x) + s b = s (W x + b): output joins S, only its bias is scaled);

and every tensor of S is produced by a part of the stream or by a *scalable producer*: a
Conv/ConvTranspose/Gemm/MatMul with constant weights (weights and bias scaled), a ``Mul`` by a
constant (the constant scaled), a homogeneous op of a constant (a ``Gather`` from an
embedding table: the table scaled), a normalization (gamma x_hat + beta: its constant scale
and bias scaled; a post-norm block's h = Norm(h + f(h)) starts the next stream there), or a
graph input (a ``Mul`` by s inserted). Anything else (a graph output, a SiLU reading the
stream, a computed weight) blocks the stream, and the reason names it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import onnx_ir as ir

from precision_doctor.precision.rewrites.graph_edit import constant_array, describe_source
from precision_doctor.precision.rewrites.ranges.rms import DecomposedRms, from_head, rms_reading

NORM_OPS = frozenset({"GroupNormalization", "InstanceNormalization", "LayerNormalization",
                      "RMSNormalization"})
SUM_OPS = frozenset({"Add", "Sub", "Concat", "Sum"})
HOMOGENEOUS_OPS = frozenset({"Reshape", "Transpose", "Identity", "Squeeze", "Unsqueeze",
                             "Flatten", "Resize", "Upsample", "MaxPool", "AveragePool", "Relu",
                             "LeakyRelu", "DepthToSpace", "SpaceToDepth", "Slice", "Expand",
                             "Tile", "Gather"})
LINEAR_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
SHAPE_OPS = frozenset({"Shape", "Size"})
FLOAT_CASTS = frozenset({1, 10, 11, 16})  # Cast to float, float16, double, bfloat16: s x -> s x
BIAS_INPUT = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2}
MAX_TENSORS = 4096  # a stream larger than this is left alone (bounds the walk)
Join = Callable[[ir.Value | None], None]


@dataclass
class Stream:
    """One residual stream.

    Attributes:
        tensors: The values of S, in discovery order.
        seeds: The normalized values it was grown from.
        norms: The normalizations reading S (their epsilon gets scaled by s^2).
        rms: The decomposed RMSNorms reading S (``rms``; their epsilon constant too).
        inputs: Graph inputs in S (each gets a ``Mul`` by s: nothing else can scale them).
        scaled: (node, input index) of every constant to multiply by s.
        blocked: Why the stream cannot be scaled (empty when it can).
    """

    tensors: list[ir.Value] = field(default_factory=list)
    seeds: list[ir.Value] = field(default_factory=list)
    norms: list[ir.Node] = field(default_factory=list)
    rms: list[DecomposedRms] = field(default_factory=list)
    inputs: list[ir.Value] = field(default_factory=list)
    scaled: list[tuple[ir.Node, int]] = field(default_factory=list)
    blocked: str = ""

    def names(self) -> list[str]:
        """Names of the stream's tensors."""
        return [v.name or "" for v in self.tensors]


def _op(node: ir.Node) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def _is_const(value: ir.Value | None) -> bool:
    return value is not None and constant_array(value) is not None


def _homogeneous(node: ir.Node) -> bool:
    """f(s x) = s f(x) for s > 0 in the op's data input (input 0)."""
    if node.op_type == "Cast" and node.domain in ("", "ai.onnx"):
        to = node.attributes.get("to")
        return to is not None and to.as_int() in FLOAT_CASTS
    return _op(node) in HOMOGENEOUS_OPS


def _weight_index(node: ir.Node) -> int | None:
    """Input index of the constant weight of a linear op (the other operand is the data)."""
    if node.op_type in ("Conv", "ConvTranspose"):
        return 1 if _is_const(node.inputs[1]) else None
    consts = [i for i in (0, 1) if _is_const(node.inputs[i])]
    return consts[0] if len(consts) == 1 else None


def find_streams(graph: ir.Graph) -> list[Stream]:
    """Every residual stream of ``graph`` read by a scale-invariant normalization.

    Args:
        graph: The main graph (subgraphs are not walked; a tensor they read blocks).

    Returns:
        The streams in the order of their first normalization; a blocked one has ``blocked``
        set and may be partial.
    """
    owner: dict[ir.Value, Stream] = {}
    streams: list[Stream] = []
    for node in graph:
        seed = node.inputs[0] if _op(node) in NORM_OPS and node.inputs else None
        if node.op_type in ("Pow", "Mul"):
            rms = from_head(node)
            seed = rms.source if rms is not None else None
        if seed is not None and seed not in owner:
            stream = _grow([seed])
            # a walk that meets an earlier stream (stopped early by a block, or reaching it
            # through a linear consumer) is one stream with it: grown again from both seeds
            met = next((owner[v] for v in stream.tensors if v in owner), None)
            if met is not None:
                stream = _grow([*met.seeds, seed])
                streams[streams.index(met)] = stream
            else:
                streams.append(stream)
            owner.update(dict.fromkeys(stream.tensors, stream))
    return streams


def _grow(seeds: list[ir.Value]) -> Stream:
    stream = Stream(seeds=list(seeds))
    members: set[ir.Value] = set()
    work: list[ir.Value] = []

    def join(value: ir.Value | None) -> None:
        if value is not None and value not in members:
            members.add(value)
            stream.tensors.append(value)
            work.append(value)

    for seed in seeds:
        join(seed)
    while work and not stream.blocked:
        if len(members) > MAX_TENSORS:
            stream.blocked = f"the stream has more than {MAX_TENSORS} tensors"
            break
        value = work.pop()
        stream.blocked = _consumers(value, stream, join) or _producer(value, join)
    if not stream.blocked:
        stream.blocked = _collect_scaled(stream, members)
    return stream


def _consumers(value: ir.Value, stream: Stream, join: Join) -> str:
    if value.is_graph_output():
        return f"'{value.name}' is a graph output"
    for use in value.uses():
        node, idx = use.node, use.idx
        op = _op(node)
        if node.graph is not value.graph:
            return f"'{value.name}' is read inside a subgraph ({op} '{node.name}')"
        if op in SHAPE_OPS:
            continue  # reads the shape only (a decomposed GroupNorm's Reshape target)
        rms = rms_reading(node, value)
        if rms is not None:
            if all(r.head is not rms.head for r in stream.rms):
                stream.rms.append(rms)
            continue
        if op in NORM_OPS and idx == 0:
            extra = [o for o in node.outputs[1:] if o.uses() or o.is_graph_output()]
            if extra:
                return (f"{op} '{node.name}' also outputs its statistics '{extra[0].name}', "
                        "which scale with the stream")
            if node not in stream.norms:
                stream.norms.append(node)
        elif op in SUM_OPS or (_homogeneous(node) and idx == 0):
            join(node.outputs[0])
        elif op in ("Mul", "Div") and idx in (0, 1 if op == "Mul" else 0) \
                and _is_const(node.inputs[1 - idx]):
            join(node.outputs[0])
        elif op in LINEAR_OPS and _weight_index(node) not in (None, idx) and idx in (0, 1):
            join(node.outputs[0])
        else:
            return (f"{op} '{node.name}' reads '{value.name}' (input {idx}) and is not "
                    "scale-invariant")
    return ""


def _producer(value: ir.Value, join: Join) -> str:
    node = value.producer()
    if node is None:
        if value.is_graph_input():
            return ""  # scaled by an inserted Mul (``Stream.inputs``)
        return f"the stream starts at {describe_source(value)}: no constant to scale"
    op = _op(node)
    if op in NORM_OPS:  # its output scale * x_hat + bias: scale and bias scaled
        return ""
    if op in SUM_OPS:
        for v in node.inputs:
            if v is not None and not _is_const(v):
                join(v)
        return ""
    if _homogeneous(node):
        if node.inputs and node.inputs[0] is not None and not _is_const(node.inputs[0]):
            join(node.inputs[0])
        return ""
    if op in LINEAR_OPS:
        if _weight_index(node) is None:
            return f"{op} '{node.name}' produces '{value.name}' from a computed weight"
        return ""
    if op == "Mul" and sum(_is_const(v) for v in node.inputs) == 1:
        return ""
    if op == "Div" and _is_const(node.inputs[1]) and not _is_const(node.inputs[0]):
        join(node.inputs[0])  # x / c is in the stream only when x is
        return ""
    return f"{op} '{node.name}' produces '{value.name}' and has no constant to scale it by"


def _collect_scaled(stream: Stream, members: set[ir.Value]) -> str:
    """Fill ``stream.scaled``: the constants whose scaling scales every tensor of S."""
    for value in stream.tensors:
        node = value.producer()
        if node is None:
            stream.inputs.append(value)  # a graph input (``_producer`` let nothing else by)
            continue
        op = _op(node)
        if op in NORM_OPS:
            for i in range(1, min(len(node.inputs), 3)):
                if node.inputs[i] is not None and not _is_const(node.inputs[i]):
                    return f"{op} '{node.name}' has a computed scale or bias"
                if node.inputs[i] is not None:
                    stream.scaled.append((node, i))
            continue
        if op in SUM_OPS:
            stream.scaled.extend((node, i) for i, v in enumerate(node.inputs) if _is_const(v))
            if op == "Concat" and any(v not in members for v in node.inputs if v is not None
                                      and not _is_const(v)):
                return f"Concat '{node.name}' joins the stream with a tensor outside it"
        elif op in LINEAR_OPS:
            w = _weight_index(node)
            assert w is not None
            data = node.inputs[1 - w] if op in ("MatMul", "Gemm") else node.inputs[0]
            if data not in members:
                stream.scaled.append((node, w))
            bias = BIAS_INPUT.get(op)
            if bias is not None and len(node.inputs) > bias and node.inputs[bias] is not None:
                if not _is_const(node.inputs[bias]):
                    return f"{op} '{node.name}' has a computed bias"
                stream.scaled.append((node, bias))
        elif _homogeneous(node) and _is_const(node.inputs[0]):
            stream.scaled.append((node, 0))  # f(s c) = s f(c): an embedding table, say
        elif op == "Mul" and not any(v in members for v in node.inputs):
            stream.scaled.append(next((node, i) for i, v in enumerate(node.inputs)
                                      if _is_const(v)))
    return ""
