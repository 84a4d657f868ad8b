"""Joint causes: findings whose cures work only together.

Each finding's impact is measured alone (``findings.rank_findings``): the share of the output
error removed when its nodes run in FP32. Where several independent causes each destroy the
output (every block of a quantized encoder overflows at its accumulator Cast, each Inf turns
into NaN on its own), every single cure leaves the output NaN and measures 0%, although all of
them together remove it all. Then:

1. the union of the findings' cures is measured (``explain``'s ``explained_share``);
2. when it removes at least ``JOINT_MIN_SHARE`` of the error and no finding alone does, the
   cause findings (``CAUSE_KINDS``: range events, mechanisms, harmful flushes, amplifiers; at
   most ``MAX_UNITS``, hard events first) are reduced to a minimal set whose joint cure still
   removes ``KEEP_SHARE`` of what the union removes, by QuickXplain's divide and conquer
   (``_reduce``): findings that play no part go by halves;
3. that set is one ``JointCause``: its members, their joint share and each one's share alone.

Members get ``evidence["joint_cause"]`` (the group's share and size), so the reports show them
as one group and the assessment counts the joint cure (``explained_share``). Every measurement
goes through the caller's ``measure`` (``trials.ImpactTrials``: remembered, so a subset
measured twice costs one evaluation); at most ``MAX_EVALS`` new measurements.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

from precision_doctor.diagnosis.assessment import (
    DEFECT_MIN_SHARE,
    HARD_KINDS,
    MECHANISM_KINDS,
    share_removed,
)
from precision_doctor.diagnosis.causes.findings import Finding

JOINT_MIN_SHARE = DEFECT_MIN_SHARE  # the union must remove at least half of the error
KEEP_SHARE = 0.9  # the minimal set keeps >= 90% of what the union removes
MAX_EVALS = 32
MAX_UNITS = 24
# Findings that can be a cause, in the order the reduction prefers them.
CAUSE_KINDS = (*HARD_KINDS, *MECHANISM_KINDS, "underflow", "accumulated-rounding")


@dataclass(frozen=True)
class JointCause:
    """Findings that cure the error only together.

    Attributes:
        members: ``(kind, node)`` of each member finding, in the findings' order.
        nodes: The FP32 set of their cures (union of their nodes), in order of first use.
        share: Share of the worst output's error their joint cure removes (0..1).
        alone: Each member's share alone, in ``members`` order.
        evaluations: Measurements the reduction needed (remembered ones not counted).
    """

    members: tuple[tuple[str, str], ...]
    nodes: tuple[str, ...]
    share: float
    alone: tuple[float, ...]
    evaluations: int = 0

    def to_dict(self) -> dict:
        return {"members": [{"kind": k, "node": n} for k, n in self.members],
                "nodes": list(self.nodes), "share": self.share, "alone": list(self.alone),
                "evaluations": self.evaluations}

    def sentence(self) -> str:
        """"these 5 together remove 99.9%; each alone at most 0.0%: independent causes"."""
        most = max(self.alone, default=0.0)
        return (f"these {len(self.members)} together remove {self.share:.1%} of the output "
                f"error; each alone at most {most:.1%}: independent causes (each one alone "
                "still leaves the output destroyed)")


def find_joint_cause(findings: Sequence[Finding], measure: Callable[[Sequence[str]], float],
                     baseline: float, union_share: float | None) -> JointCause | None:
    """The minimal set of findings that cures the error jointly, when no single one does.

    Args:
        findings: Ranked findings with measured ``impact`` (None: not measured).
        measure: Output error with the given nodes in FP32 (``trials.ImpactTrials``).
        baseline: The candidate's output error as is (rel L2; may be inf).
        union_share: Share removed by all findings' cures together (``explained_share``).

    Returns:
        The ``JointCause``, or None when a single finding already explains at least
        ``JOINT_MIN_SHARE``, the union does not, or fewer than two findings take part.
    """
    # causes only (a headroom note is no event), the hard range events first: the reduction
    # prefers earlier units
    units = sorted((i for i, f in enumerate(findings) if f.nodes and f.kind in CAUSE_KINDS),
                   key=lambda i: (CAUSE_KINDS.index(findings[i].kind), i))[:MAX_UNITS]
    if union_share is None or union_share < JOINT_MIN_SHARE or len(units) < 2 or baseline <= 0:
        return None
    if any((findings[i].impact or 0.0) >= JOINT_MIN_SHARE for i in units):
        return None
    calls = [0]

    def share(subset: Sequence[int]) -> float:
        calls[0] += 1
        nodes = list(dict.fromkeys(n for i in subset for n in findings[i].nodes))
        return share_removed(baseline, measure(nodes)) if nodes else 0.0

    need = KEEP_SHARE * union_share
    if len(units) < 2 or share(units) < need:
        return None  # the causes without the headroom notes fall short: no joint group
    kept = sorted(_reduce(units, lambda s: calls[0] < MAX_EVALS and share(s) >= need))
    joint = share(kept)
    if len(kept) < 2 or joint < JOINT_MIN_SHARE:
        return None
    nodes = tuple(dict.fromkeys(n for i in kept for n in findings[i].nodes))
    return JointCause(tuple((findings[i].kind, findings[i].node) for i in kept), nodes, joint,
                      tuple(findings[i].impact or 0.0 for i in kept), calls[0])


def _reduce(units: list[int], passes: Callable[[Sequence[int]], bool]) -> list[int]:
    """A minimal subset of ``units`` for which ``passes`` holds (``units`` itself is taken to
    pass), by QuickXplain's divide and conquer (Junker 2004, "QuickXplain: preferred
    explanations and relaxations for over-constrained problems"): keep the first half, minimize
    the second, then minimize the first given what the second kept. Earlier units are
    preferred. About ``2k log2(n/k)`` tests for ``k`` needed of ``n``, where one-at-a-time
    removal needs ``n``: irrelevant findings go by halves."""
    def rec(fixed: list[int], delta: list[int], cands: list[int]) -> list[int]:
        if delta and passes(fixed):
            return []
        if len(cands) <= 1:
            return list(cands)
        half = len(cands) // 2
        first, second = cands[:half], cands[half:]
        kept_second = rec(fixed + first, first, second)
        kept_first = rec(fixed + kept_second, kept_second, first)
        return kept_first + kept_second

    return rec([], [], list(units))


def mark_members(findings: Sequence[Finding], joint: JointCause | None) -> list[Finding]:
    """``findings`` with each member of ``joint`` carrying ``evidence["joint_cause"]``
    (``{"share", "members", "alone"}``: the group's joint share, its size, the largest share
    of a member alone)."""
    if joint is None:
        return list(findings)
    members = set(joint.members)
    mark = {"share": joint.share, "members": len(joint.members),
            "alone": max(joint.alone, default=0.0)}
    return [replace(f, evidence={**f.evidence, "joint_cause": mark})
            if (f.kind, f.node) in members else f for f in findings]


__all__ = ["JointCause", "find_joint_cause", "mark_members"]
