"""Find the transformer parts of an ONNX graph: LayerNorms (fused or decomposed) and attention.

A *LayerNorm site* is either one ``LayerNormalization`` node (opset >= 17) or the decomposed
chain exporters write below opset 17::

    mean = ReduceMean(x); d = Sub(x, mean); sq = Pow(d, 2) | Mul(d, d); var = ReduceMean(sq)

An *attention site* is a ``Softmax`` whose input comes, through at most a few elementwise or
data-movement nodes (the scale ``Div``/``Mul`` by a constant, the mask ``Add``/``Where``,
``Reshape``/``Cast``), from a ``MatMul``: that MatMul's output is QK^T before any scale.

A *block* is the stretch of the graph that ends with one attention's Softmax and begins after
the previous one's (graph order); the LayerNorms after the last Softmax form a final block
without attention. This follows the data flow of both pre-LN (ViT, Whisper: LN1, attention,
LN2, MLP) and post-LN (BERT: attention, LN, MLP, LN) encoders without relying on node names.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from precision_doctor.graph.external import tensor_array

# Nodes allowed between QK^T and Softmax (scale, mask, reshapes, casts).
# Flatten: onnx.version_converter rewrites an opset < 13 Softmax as Flatten -> Softmax -> Reshape.
_BETWEEN = frozenset({"Div", "Mul", "Add", "Sub", "Where", "Reshape", "Cast", "Transpose",
                      "Squeeze", "Unsqueeze", "Identity", "Flatten"})
_MAX_HOPS = 6


@dataclass(frozen=True)
class LayerNormSite:
    """One LayerNorm of the graph.

    Attributes:
        node: The first node (the ``LayerNormalization``, or the mean's ``ReduceMean``).
        kind: ``fused`` or ``decomposed``.
        input: The normalized tensor x (the residual stream in a transformer).
        axis: First normalized axis (negative: from the end), as LayerNormalization's ``axis``.
        square: Decomposed only: the ``Pow``/``Mul`` output d^2 that overflows in FP16 first.
        square_node: Decomposed only: the node producing ``square``.
        stash_type: Fused only: the ``stash_type`` attribute (1 = FP32 statistics, default).
        index: Graph position of ``node``.
        epsilon: The variance epsilon (attribute, or the constant added to the variance;
            1e-5, the ONNX default, when it cannot be read).
        stats_nodes: Decomposed only: the statistics nodes (mean, Sub, square, variance,
            ``+ eps``, Sqrt), the ones to keep in FP32 for "FP32 statistics" without fusing.
    """

    node: str
    kind: str
    input: str
    axis: int
    square: str | None
    square_node: str | None
    stash_type: int | None
    index: int
    epsilon: float = 1e-5
    stats_nodes: tuple[str, ...] = ()

    @property
    def fp16_statistics(self) -> bool:
        """Whether FP16 is assumed to compute its statistics: decomposed, or fused with
        ``stash_type`` != 1 (``diagnosis.headroom.probe``'s module docstring)."""
        return self.kind == "decomposed" or self.stash_type != 1


def centered(x: np.ndarray, axis: int) -> np.ndarray:
    """x - mean(x) over a LayerNorm's normalized axes (``axis`` to the last), in float64."""
    x64 = x.astype(np.float64)
    return x64 - x64.mean(axis=tuple(range(axis % x.ndim, x.ndim)), keepdims=True)


@dataclass(frozen=True)
class AttentionSite:
    """One attention (QK^T -> ... -> Softmax).

    Attributes:
        softmax: The Softmax node.
        matmul: The MatMul computing QK^T.
        scores: Its output, the raw scores before the 1/sqrt(d) scale.
        softmax_input: The Softmax input (scaled and masked scores).
        scale: The constant factor applied between the MatMul and the Softmax (1/c for a
            ``Div`` by c), None when there is none (pre-scaled Q/K or no scale).
        scale_node: The node applying ``scale`` (None when there is none).
        index: Graph position of the Softmax.
    """

    softmax: str
    matmul: str
    scores: str
    softmax_input: str
    scale: float | None
    scale_node: str | None
    index: int


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    out = {i.name: tensor_array(i) for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output:
            for a in n.attribute:
                if a.name == "value":
                    out[n.output[0]] = numpy_helper.to_array(a.t)
    return out


def _scalar(consts: dict[str, np.ndarray], name: str) -> float | None:
    a = consts.get(name)
    if a is None or a.size != 1 or a.dtype.kind != "f":
        return None
    return float(a.reshape(-1)[0])


def _attr(node: onnx.NodeProto, name: str, default: int | None) -> int | None:
    for a in node.attribute:
        if a.name == name:
            return int(a.i)
    return default


def _reduce_axes(node: onnx.NodeProto, consts: dict[str, np.ndarray]) -> list[int] | None:
    for a in node.attribute:
        if a.name == "axes":
            return list(a.ints)
    if len(node.input) > 1 and node.input[1] in consts:
        return [int(v) for v in consts[node.input[1]].reshape(-1)]
    return None


def find_layernorms(model: onnx.ModelProto) -> list[LayerNormSite]:
    """Every fused and decomposed LayerNorm, in graph order.

    Args:
        model: The ONNX model (nodes named).

    Returns:
        One ``LayerNormSite`` per LayerNorm.
    """
    consts = _constants(model)
    consumers: dict[str, list[tuple[int, onnx.NodeProto]]] = {}
    for i, n in enumerate(model.graph.node):
        for v in n.input:
            consumers.setdefault(v, []).append((i, n))
    sites = []
    for i, n in enumerate(model.graph.node):
        if n.op_type == "LayerNormalization" and n.domain in ("", "ai.onnx"):
            eps = next((float(a.f) for a in n.attribute if a.name == "epsilon"), 1e-5)
            sites.append(LayerNormSite(n.name, "fused", n.input[0], _attr(n, "axis", -1) or -1,
                                       None, None, _attr(n, "stash_type", 1), i, eps))
            continue
        if n.op_type != "ReduceMean" or not n.output:
            continue
        x = n.input[0]
        for _, sub in consumers.get(n.output[0], []):
            if sub.op_type != "Sub" or list(sub.input) != [x, n.output[0]]:
                continue
            for _, sq in consumers.get(sub.output[0], []):
                is_pow = sq.op_type == "Pow" and _scalar(consts, sq.input[1]) == 2.0
                is_mul = sq.op_type == "Mul" and list(sq.input) == [sub.output[0]] * 2
                if not (is_pow or is_mul):
                    continue
                var = [c for _, c in consumers.get(sq.output[0], []) if c.op_type == "ReduceMean"]
                if not var:
                    continue
                adds = [c for _, c in consumers.get(var[0].output[0], []) if c.op_type == "Add"]
                eps = next((e for c in adds for e in (_scalar(consts, c.input[1]),
                                                      _scalar(consts, c.input[0]))
                            if e is not None), 1e-5)
                stats = [n.name, sub.name, sq.name, var[0].name]
                if adds:
                    stats.append(adds[0].name)
                    stats += [c.name for _, c in consumers.get(adds[0].output[0], [])
                              if c.op_type == "Sqrt"][:1]
                axes = _reduce_axes(n, consts)
                axis = min(axes) if axes else -1
                sites.append(LayerNormSite(n.name, "decomposed", x, axis, sq.output[0], sq.name,
                                           None, i, eps, tuple(stats)))
                break
            else:
                continue
            break
    return sites


def find_attention(model: onnx.ModelProto) -> list[AttentionSite]:
    """Every Softmax fed by a MatMul (QK^T) through at most a few scale/mask/reshape nodes.

    Args:
        model: The ONNX model (nodes named).

    Returns:
        One ``AttentionSite`` per attention, in graph order.
    """
    consts = _constants(model)
    producer = {o: n for n in model.graph.node for o in n.output}
    sites = []
    for i, n in enumerate(model.graph.node):
        if n.op_type != "Softmax":
            continue
        value, scale, scale_node, found = n.input[0], None, None, None
        for _ in range(_MAX_HOPS):
            p = producer.get(value)
            if p is None:
                break
            if p.op_type == "MatMul":
                # QK^T multiplies two activations; a constant operand is a projection (a
                # classifier head before its Softmax), not attention.
                found = p if not any(v in consts for v in p.input) else None
                break
            if p.op_type not in _BETWEEN:
                break
            if p.op_type in ("Div", "Mul") and len(p.input) == 2:
                c = _scalar(consts, p.input[1])
                if c is not None and c != 0.0 and scale is None:
                    scale = 1.0 / c if p.op_type == "Div" else c
                    scale_node = p.name
            nxt = [v for v in p.input if v and v not in consts and v in producer]
            if p.op_type == "Where":
                nxt = nxt[1:] or nxt
            if not nxt:
                break
            # the mask is usually the second operand; follow the one that reaches a MatMul
            value = next((v for v in nxt if producer[v].op_type == "MatMul"), nxt[0])
        if found is not None:
            sites.append(AttentionSite(n.name, found.name, found.output[0], n.input[0], scale,
                                       scale_node, i))
    return sites


def assign_blocks(layernorms: list[LayerNormSite], attention: list[AttentionSite]
                  ) -> dict[str, int]:
    """Block index of every site (LayerNorm first-node name or Softmax name).

    Block k holds attention k and the LayerNorms after attention k-1's Softmax, up to attention
    k's Softmax (graph order); LayerNorms after the last Softmax get block ``len(attention)``.
    """
    bounds = sorted(a.index for a in attention)
    out = {a.softmax: k for k, a in enumerate(sorted(attention, key=lambda a: a.index))}
    for ln in layernorms:
        out[ln.node] = sum(1 for b in bounds if b < ln.index)
    return out


__all__ = ["AttentionSite", "LayerNormSite", "assign_blocks", "find_attention",
           "find_layernorms"]
