"""Cut a graph into consecutive segments that run on their own, one after the other.

Layerwise comparison runs each segment once per precision and feeds it the boundary tensors
the previous segments produced, so every node executes once and memory holds one segment's
activations and weights, never the whole model's.

A segment is a contiguous range of nodes in graph order (ONNX requires topological order).
Its graph inputs are every tensor its nodes consume that an earlier segment produced (floats,
int64 shape tensors, booleans alike) plus the model inputs it reads; its outputs are the
tensors it was asked for plus every tensor a later segment consumes. It carries only the
initializers its nodes read (external-data initializers stay references: only the proto is
copied) and a copy of each ``Constant`` node outside it whose value it reads, so constants are
never turned into run-time inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

SEGMENT_KEY = "precision_doctor.segment"  # metadata_props key: "<index>/<count>"


@dataclass(frozen=True)
class Segment:
    """One contiguous range of nodes.

    Attributes:
        index: Position of the segment (0-based).
        start / stop: Node range ``[start, stop)`` in graph order.
        model_inputs: Model graph inputs its nodes read (fed from the sample).
        boundary: Tensors it reads from earlier segments, in first-use order.
        carry: Tensors it produces that later segments read.
        release: Boundary tensors no segment after this one reads.
    """

    index: int
    start: int
    stop: int
    model_inputs: tuple[str, ...]
    boundary: tuple[str, ...]
    carry: tuple[str, ...]
    release: tuple[str, ...]


def why_not_segmentable(model: onnx.ModelProto) -> str | None:
    """Why the graph cannot be cut into segments, or None when it can.

    Cuts are impossible around control flow (If/Loop/Scan bodies read outer-scope tensors
    implicitly) and in graphs that consume a tensor before producing it (not topologically
    sorted).
    """
    graph = model.graph
    known = {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
    known |= {t.values.name for t in graph.sparse_initializer}
    known.add("")
    for node in graph.node:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for a in node.attribute):
            return (f"control flow: node {node.name!r} ({node.op_type}) has subgraphs that read "
                    "outer-scope tensors, which a segment cut cannot see")
        for name in node.input:
            if name not in known:
                return (f"node {node.name!r} reads {name!r} before any node produces it (the "
                        "graph is not topologically sorted)")
        known.update(node.output)
    return None


def _initializer_bytes(t: onnx.TensorProto) -> int:
    numel = 1
    for d in t.dims:
        numel *= d
    try:
        itemsize = helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except Exception:  # noqa: BLE001 - exotic types (int4, string): a conservative guess
        itemsize = 4
    return numel * itemsize


def plan_segments(model: onnx.ModelProto, output_bytes: Sequence[int], budget_bytes: int
                  ) -> list[Segment]:
    """Cut the graph greedily into consecutive segments that fit ``budget_bytes``.

    A segment's size is the bytes of its nodes' outputs (``output_bytes[i]`` for node ``i``,
    one runner, one sample) plus the bytes of the initializers it reads. A node larger than
    the budget gets a segment of its own. Call ``why_not_segmentable`` first.

    Args:
        model: The model (topologically sorted, no control flow).
        output_bytes: Estimated output bytes of every node, in graph order.
        budget_bytes: Bytes one segment may hold (activations + weights).

    Returns:
        Segments covering every node, in order.
    """
    graph = model.graph
    nodes = list(graph.node)
    init_bytes = {t.name: _initializer_bytes(t) for t in graph.initializer}
    cuts = [0]
    used, seen = 0, set[str]()
    for i, node in enumerate(nodes):
        new_inits = {n for n in node.input if n in init_bytes and n not in seen}
        size = output_bytes[i] + sum(init_bytes[n] for n in new_inits)
        if i > cuts[-1] and used + size > budget_bytes:
            cuts.append(i)
            used, seen = 0, set()
            new_inits = {n for n in node.input if n in init_bytes}
            size = output_bytes[i] + sum(init_bytes[n] for n in new_inits)
        used += size
        seen |= new_inits
    cuts.append(len(nodes))
    return _describe(model, cuts)


def balanced_segments(model: onnx.ModelProto, node_cost: Sequence[float],
                      tensor_bytes: Mapping[str, int], count: int) -> list[Segment]:
    """Cut the graph into about ``count`` segments of similar cost, each cut where few bytes
    cross it.

    The i-th cut aims at i/count of the total cost; within half a segment's cost of that aim
    it goes where the tensors crossing the cut (produced before it, read after it; graph
    outputs do not count) take the fewest bytes, the nearest to the aim among equals. Call
    ``why_not_segmentable`` first.

    Args:
        model: The model (topologically sorted, no control flow).
        node_cost: Cost of every node in graph order (e.g. its output bytes).
        tensor_bytes: Tensor name -> bytes of one sample (unknown names count as 0).
        count: Segments wanted (fewer when the graph has fewer nodes).

    Returns:
        Segments covering every node, in order.
    """
    nodes = list(model.graph.node)
    n = len(nodes)
    if n == 0 or count <= 1:
        return _describe(model, [0, n])
    constant = {o for nd in nodes if nd.op_type == "Constant" for o in nd.output}
    last_use: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            last_use[name] = i
    crossing = [0] * (n + 1)  # bytes crossing a cut right before node p
    live, dying = 0, [0] * (n + 1)
    for p, node in enumerate(nodes):
        crossing[p] = live
        live -= dying[p]
        for o in node.output:
            end = last_use.get(o, -1)
            if o and o not in constant and end > p:
                live += tensor_bytes.get(o, 0)
                dying[end] += tensor_bytes.get(o, 0)
    before = [0.0] * (n + 1)  # cost of the nodes before position p
    for p, c in enumerate(node_cost):
        before[p + 1] = before[p] + max(float(c), 0.0)
    total = before[n] or 1.0
    cuts = [0]
    for k in range(1, count):
        aim, half = k * total / count, total / (2 * count)
        window = [p for p in range(cuts[-1] + 1, n) if abs(before[p] - aim) <= half]
        if window:
            cuts.append(min(window, key=lambda p: (crossing[p], abs(before[p] - aim), p)))
    cuts.append(n)
    return _describe(model, cuts)


def _describe(model: onnx.ModelProto, cuts: Sequence[int]) -> list[Segment]:
    graph = model.graph
    nodes = list(graph.node)
    initialized = {t.name for t in graph.initializer}
    initialized |= {t.values.name for t in graph.sparse_initializer}
    model_inputs = {vi.name for vi in graph.input} - initialized
    constant = {o for n in nodes if n.op_type == "Constant" for o in n.output}
    last_use: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            last_use[name] = i
    segments = []
    for k, (start, stop) in enumerate(zip(cuts[:-1], cuts[1:])):
        produced: set[str] = set()
        feeds: list[str] = []
        boundary: list[str] = []
        for node in nodes[start:stop]:
            for name in node.input:
                if not name or name in produced or name in initialized or name in constant:
                    continue
                target = feeds if name in model_inputs else boundary
                if name not in target:
                    target.append(name)
            produced.update(o for o in node.output if o)
        carry = sorted(n for n in produced if last_use.get(n, -1) >= stop and n not in constant)
        release = tuple(n for n in boundary if last_use[n] < stop)
        segments.append(Segment(k, start, stop, tuple(feeds), tuple(boundary), tuple(carry),
                                release))
    return segments


def segment_model(model: onnx.ModelProto, segment: Segment, outputs: Sequence[str],
                  types: Mapping[str, onnx.TypeProto], count: int) -> onnx.ModelProto:
    """The sub-model running ``segment``'s nodes.

    Args:
        model: The full model.
        segment: From ``plan_segments``.
        outputs: Tensors produced in the segment to expose (``segment.carry`` is added).
        types: Tensor name -> type (``graph.shapes.infer_types``); every boundary tensor
            needs one.
        count: Number of segments (recorded in the metadata with the index).

    Returns:
        A model with its own inputs, outputs, initializers and Constant nodes; metadata
        ``precision_doctor.segment`` = ``"<index>/<count>"``.

    Raises:
        KeyError: A boundary tensor has no type (check with ``missing_types`` first).
    """
    src = model.graph
    nodes = src.node[segment.start:segment.stop]
    read = {n for node in nodes for n in node.input if n}
    produced = {o for node in nodes for o in node.output if o}
    g = onnx.GraphProto(name=f"{src.name}_segment{segment.index}")
    g.node.extend(n for n in src.node[:segment.start]
                  if n.op_type == "Constant" and n.output[0] in read)
    g.node.extend(nodes)
    g.input.extend(vi for vi in src.input if vi.name in segment.model_inputs)
    for name in segment.boundary:
        g.input.append(helper.make_value_info(name, types[name]))
    g.initializer.extend(t for t in src.initializer if t.name in read)
    g.sparse_initializer.extend(t for t in src.sparse_initializer if t.values.name in read)
    if model.ir_version < 4:  # initializers must be listed as graph inputs before IR 4
        g.input.extend(vi for vi in src.input if vi.name in read
                       and vi.name not in segment.model_inputs)
    names = list(dict.fromkeys([*outputs, *segment.carry]))
    for name in names:
        if name in types:
            g.output.append(helper.make_value_info(name, types[name]))
        else:
            g.output.append(helper.make_empty_tensor_value_info(name))
    exposed = set(names)
    g.value_info.extend(vi for vi in src.value_info if vi.name in produced
                        and vi.name not in exposed)
    out = onnx.ModelProto(ir_version=model.ir_version, producer_name=model.producer_name,
                          producer_version=model.producer_version, graph=g)
    out.opset_import.extend(model.opset_import)
    out.functions.extend(model.functions)
    out.metadata_props.add(key=SEGMENT_KEY, value=f"{segment.index}/{count}")
    return out


def cut_like(model: onnx.ModelProto, segments: Sequence[Segment], other: onnx.ModelProto
             ) -> list[Segment] | None:
    """``segments`` of ``model`` carried over to ``other``, a rewrite of ``model`` that keeps
    its node names and adds nodes of its own (e.g. the emulator's rounding round trips).

    Each cut of ``other`` is placed right before the node that starts the segment in
    ``model``, so every node ``other`` inserted after a node (a round trip of its output)
    stays in that node's segment and a tensor produced in segment k of ``model`` is produced
    in segment k of ``other`` too. Boundary tensors are recomputed for ``other``.

    Returns:
        One segment per segment of ``model``, or None when ``other`` lacks a cut node or
        orders the cut nodes differently (the caller then cuts ``model`` itself).
    """
    position = {n.name: i for i, n in enumerate(other.graph.node) if n.name}
    cuts = [0]
    for seg in segments[1:]:
        name = model.graph.node[seg.start].name
        at = position.get(name)
        if not name or at is None or at <= cuts[-1]:
            return None
        cuts.append(at)
    cuts.append(len(other.graph.node))
    return _describe(other, cuts)


def weight_bytes(model: onnx.ModelProto, segment: Segment) -> int:
    """Bytes of the initializers ``segment``'s nodes read (from their dims and type, external
    data included)."""
    read = {n for node in model.graph.node[segment.start:segment.stop] for n in node.input}
    return sum(_initializer_bytes(t) for t in model.graph.initializer if t.name in read)


def missing_types(segments: Sequence[Segment], types: Mapping[str, onnx.TypeProto]
                  ) -> list[str]:
    """Boundary tensors whose type inference could not determine (they cannot be inputs)."""
    return [n for s in segments for n in s.boundary if n not in types]


def is_segment(model: onnx.ModelProto) -> bool:
    """Whether ``model`` was built by ``segment_model``."""
    return any(p.key == SEGMENT_KEY for p in model.metadata_props)


def node_costs(model: onnx.ModelProto, types: Mapping[str, onnx.TypeProto]
               ) -> tuple[list[float], dict[str, int]]:
    """The costs ``balanced_segments`` takes: (per node, its output bytes, a proxy of its work;
    per tensor, its bytes), from ``types`` with one sample's shapes (``graph.shapes
    .infer_types``). A tensor of unknown size counts as the median known one; Constant nodes
    cost nothing."""
    sizes: dict[str, int] = {}
    for name, t in types.items():
        tt = t.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
        if tt.HasField("shape") and all(d >= 0 for d in dims):
            try:
                itemsize = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).itemsize
            except (KeyError, TypeError, ValueError):  # strings, exotic types: a guess
                itemsize = 8
            sizes[name] = int(np.prod(dims, dtype=np.int64)) * itemsize
    fallback = int(np.median(list(sizes.values()))) if sizes else 1
    cost = [0.0 if nd.op_type == "Constant" else
            float(sum(sizes.get(o, fallback) for o in nd.output if o))
            for nd in model.graph.node]
    return cost, {n: sizes.get(n, fallback) for nd in model.graph.node for n in nd.output}
