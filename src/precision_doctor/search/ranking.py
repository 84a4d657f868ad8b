"""Sensitivity ranking for the search: which nodes to try in FP32 first.

Scores come from one layerwise comparison of the start plan (``layerwise.gain``): +inf where a
node's output overflows or NaN/Inf is born, otherwise its local error gain. ``upstream_first``
moves the nodes a decision output reads to the front.
"""

from __future__ import annotations

import math
from typing import Sequence

import onnx

from precision_doctor.formats import FORMATS, Precision
from precision_doctor.layerwise.compare import LayerwiseResult
from precision_doctor.layerwise.gain import local_gains


def rank_by_sensitivity(layerwise: LayerwiseResult, candidates: Sequence[str],
                        inputs_of: dict[str, list[str]], priority: Sequence[str] = ()
                        ) -> list[str]:
    """Candidates ordered by how much error they add, most sensitive first.

    Score of a node = ``layerwise.gain.Gain.sensitivity``: +inf where its output overflows the
    format or NaN/Inf is born; otherwise rel_l2(output) / max(largest rel_l2 of its inputs,
    unit roundoff), the local error gain.
    ``priority`` nodes (e.g. hazard findings) come first, in their given order. Scores are
    compared to 1 significant digit; ties and nodes without a measurement keep topological
    order (an early node's rounding travels through more of the network). Measured
    2026-11-24 (``benchmarks/search.py``, 2 cores): exact scores, which moved with ~1e-4 relative
    summation differences, gave det 11 or 9 FP32 nodes in 127-140 evaluations; 1 digit gives
    3 nodes in 52 on det and 2 in 35 on rec (2 digits: 3 in 59 and 3 in 31; octaves: det 9
    nodes that fail on ONNX Runtime CPU).
    """
    u = FORMATS[Precision(layerwise.target)].unit_roundoff
    score: dict[str, float] = {}
    for g in local_gains(layerwise.records, inputs_of, u):
        score[g.record.node] = max(score.get(g.record.node, 0.0), g.sensitivity)
    order = {n: i for i, n in enumerate(candidates)}
    first = [n for n in dict.fromkeys(priority) if n in order]
    rest = sorted((n for n in candidates if n not in set(first)),
                  key=lambda n: (-_bucket(score.get(n, 0.0)), order[n]))
    return first + rest


def _bucket(score: float) -> float:
    """A sensitivity score to 1 significant digit: the local gain separates orders of
    magnitude (catastrophic, large, ordinary rounding), not the last digits, which move with
    the statistics' float32 summation order."""
    if score <= 0 or math.isinf(score):
        return score
    return float(f"{score:.1g}")


def upstream_first(ranking: Sequence[str], model: onnx.ModelProto, output: str) -> list[str]:
    """``ranking`` with the nodes that feed graph output ``output`` first (their order kept),
    then the others: rounding in a node the decision does not read cannot flip it."""
    producer = {o: n for n in model.graph.node for o in n.output if o}
    cone: set[str] = set()
    todo = [output]
    seen: set[str] = set()
    while todo:
        tensor = todo.pop()
        node = producer.get(tensor)
        if node is None or tensor in seen:
            continue
        seen.add(tensor)
        cone.add(node.name)
        todo.extend(i for i in node.input if i)
    return ([n for n in ranking if n in cone] + [n for n in ranking if n not in cone])
