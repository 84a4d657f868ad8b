"""What a cure must cover: the nodes that keep an out-of-range value out of the format.

Keeping only the node that overflows in FP32 cures nothing when the next node reads its output
back in the low format: a strongly typed engine (and the emulator, ``precision.emulate``)
rounds every input of a low-precision node to the format, so an FP32 result of 3.1e5 becomes
inf again at the first FP16 consumer. The cure is the *overflow region*: every node that
produces a tensor whose reference magnitude exceeds the format max, plus every node that
reads one, followed through data-movement ops (Reshape, Expand, ...: they carry their
producer's precision, ``precision.plan.DATA_MOVEMENT_OPS``). Inside the region values are
computed and stored in FP32; the region ends where the reference is back in range.

Example (Magika's LayerNorm, jax2tf): ``Sum_1 = ReduceSum(Square(x))`` reaches 3.1e5 > 65504
and ``Mul(Sum_1, 1/N)`` brings it back to 599: the region is ``{Sum_1, Mul}``; keeping
``Sum_1`` alone in FP32 measured no improvement at all, the region removes the error.
"""

from __future__ import annotations

from typing import Collection, Mapping, Sequence

import onnx

from precision_doctor.diagnosis.causes.mechanisms import MAX_CONE, PERIODIC_OPS, periodic_rule
from precision_doctor.formats import FORMATS, Precision
from precision_doctor.graph.outputs import consumers
from precision_doctor.layerwise.compare import LayerwiseResult
from precision_doctor.layerwise.stats import LayerRecord
from precision_doctor.precision.plan import DATA_MOVEMENT_OPS


def layerwise_regions(model: onnx.ModelProto, layerwise: LayerwiseResult
                      ) -> dict[str, tuple[str, ...]]:
    """``overflow_regions`` of what ``layerwise`` measured: the tensors whose finite FP32
    magnitude exceeds the target format's max, and the tensor where the candidate's NaN/Inf
    is born (an overflow from finite inputs the reference keeps in range)."""
    limit = FORMATS[Precision(layerwise.target)].max
    tensors = {r.tensor for r in layerwise.records if r.ref_max_abs > limit}
    if layerwise.nan_birth:
        tensors.add(layerwise.nan_birth)
    return overflow_regions(model, tensors)


def overflow_regions(model: onnx.ModelProto, tensors: Collection[str]
                     ) -> dict[str, tuple[str, ...]]:
    """The overflow region (module docstring) of every out-of-range tensor's producer.

    Connected out-of-range tensors (one's reader produces the next) share one region.

    Args:
        model: The FP32 model (nodes named).
        tensors: Out-of-range tensors (``layerwise_regions`` finds them).

    Returns:
        Producer node name -> its region's node names, in graph (topological) order; every
        node of a region maps to the same tuple.
    """
    producer = {o: n for n in model.graph.node for o in n.output if o}
    readers = consumers(model)
    order = {n.name: i for i, n in enumerate(model.graph.node)}
    regions: dict[str, tuple[str, ...]] = {}
    for start in sorted((t for t in tensors if t in producer),
                        key=lambda t: order[producer[t].name]):
        if producer[start].name in regions:
            continue
        nodes: set[str] = set()
        todo, seen = [start], set()
        while todo:
            tensor = todo.pop()
            if tensor in seen:
                continue
            seen.add(tensor)
            if tensor in tensors and tensor in producer:
                nodes.add(producer[tensor].name)
            for c in readers.get(tensor, ()):
                if c.op_type in DATA_MOVEMENT_OPS:  # carries the producer's precision
                    todo.extend(o for o in c.output if o)
                    continue
                nodes.add(c.name)
                todo.extend(o for o in c.output if o and o in tensors)
        region = tuple(sorted(nodes, key=order.__getitem__))
        for name in region:
            regions.setdefault(name, region)
    return regions


def periodic_cures(layerwise: LayerwiseResult, inputs_of: Mapping[str, Sequence[str]]
                   ) -> list[tuple[LayerRecord, tuple[LayerRecord, ...], tuple[str, ...]]]:
    """The cure of each periodic argument that loses its phase in the target format
    (``mechanisms.periodic_rule``: Sin/Cos/Tan of |x| >= 128 in FP16): the argument computed
    and kept in FP32 through the periodic ops. A node kept in FP32 alone reads its argument
    back in the low format, already rounded, so the cure is the argument's producers (walked
    back from the argument through every recorded producer, nearest first, at most
    ``mechanisms.MAX_CONE`` nodes) and every periodic op that reads it.

    Returns:
        ``(argument record, periodic readers' records, cure nodes)`` per argument tensor, in
        topological order; the cure nodes in topological order too. Arguments that are graph
        inputs (no record) are left to attribution.
    """
    limit_u = FORMATS[Precision(layerwise.target)].unit_roundoff
    recs = {r.tensor: r for r in layerwise.records}
    readers: dict[str, list[LayerRecord]] = {}
    for r in layerwise.records:
        if r.op_type in PERIODIC_OPS:
            for t in inputs_of.get(r.tensor, ())[:1]:  # the argument is the only input
                readers.setdefault(t, []).append(r)
    out = []
    for tensor, periodic in readers.items():
        arg = recs.get(tensor)
        if arg is None or periodic_rule(periodic[0].op_type, arg.ref_max_abs, limit_u) is None:
            continue
        cone: list[LayerRecord] = []
        todo, seen = [tensor], {tensor}
        while todo and len(cone) < MAX_CONE:  # breadth first: the nearest producers first
            rec = recs.get(todo.pop(0))
            if rec is None:
                continue
            cone.append(rec)
            for t in inputs_of.get(rec.tensor, ()):
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        nodes = sorted({r.index: r.node for r in (*cone, *periodic)}.items())
        out.append((arg, tuple(periodic), tuple(dict.fromkeys(n for _, n in nodes))))
    return sorted(out, key=lambda x: x[0].index)


def absorbed_wrongly(records: Sequence[LayerRecord], inputs_of: Mapping[str, Sequence[str]],
                     threshold: float, after: int = -1) -> LayerRecord | None:
    """The first tensor (topological order, index > ``after``) that turns an upstream NaN/Inf
    into a finite but wrong value: the candidate is finite there, some compared input of its
    producer is not, and its rel L2 exceeds ``threshold``. Decided by value: 1/sqrt(inf) = 0
    where FP32 computes 0.19 is this; exp(-inf) = 0 where FP32's exp(-3.4e38) is 0 too is
    not (its error stays below the threshold).
    """
    by_name = {r.tensor: r for r in records}
    for r in records:
        if r.index <= after or r.cand_nan or r.cand_inf or r.ref_nonfinite:
            continue
        ups = [by_name[i] for i in inputs_of.get(r.tensor, ()) if i in by_name]
        if any(u.cand_nan or u.cand_inf for u in ups) and r.rel_l2 > threshold:
            return r
    return None


def expand_with_regions(ranking: Sequence[str], regions: Mapping[str, tuple[str, ...]]
                        ) -> list[str]:
    """``ranking`` with each region's other nodes right after its first ranked node, so that a
    prefix of the ranking that holds an overflowing node also holds what cures it."""
    allowed = set(ranking)
    out: list[str] = []
    seen: set[str] = set()
    for name in ranking:
        for n in (name, *regions.get(name, ())):
            if n not in seen and n in allowed:
                seen.add(n)
                out.append(n)
    return out


__all__ = ["absorbed_wrongly", "expand_with_regions", "layerwise_regions", "overflow_regions",
           "periodic_cures"]
