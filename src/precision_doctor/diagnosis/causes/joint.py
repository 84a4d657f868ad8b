"""Joint causes: findings whose cures work only together.

Each finding's impact is measured alone (``findings.rank_findings``): the share of the output
error removed when its nodes run in FP32. Where several independent causes each destroy the
output (every block of a quantized encoder overflows at its accumulator Cast, each Inf turns
into NaN on its own), every single cure leaves the output NaN and measures 0%, although all of
them together remove it all. Then:

1. the union of the findings' cures is measured (``explain``'s ``explained_share``);
2. when it removes at least ``JOINT_MIN_SHARE`` of the error and no finding alone does, the
   cause findings (``CAUSE_KINDS``: range events, mechanisms, harmful flushes, amplifiers,
   tensors close to the format max; at most ``MAX_UNITS``, hard events first) are reduced to
   a minimal set whose joint cure still removes ``KEEP_SHARE`` of what the union removes, by
   QuickXplain's divide and conquer
   (``_reduce``): findings that play no part go by halves. When the first ``MAX_UNITS`` fall
   short (a UNet with 25 blocks that each overflow), every finding with a cure takes part;
   when the range events among them (``HARD_KINDS``) suffice alone, only they do (one
   measurement, made even when the findings' budget is spent: on a real diffusion UNet it
   leaves the lost timestep phase out of a joint cause of overflows). When the evaluations
   or the budget run out first, the reduction keeps what it could not test (``minimal``
   False: sufficient, measured, not proven minimal);
3. that set is one ``JointCause``: its members, their joint share and each one's share alone.

So a union of cures that removes the error always ends as a measured joint cause (or as one
finding that explains it alone): the assessment never calls a model unexplained whose findings
explain it.

Causes can also hide behind each other: downstream of the first NaN/Inf birth every tensor is
NaN, so a later, independent overflow is never *born* in the layerwise comparison. ``unmask``
finds them: while the findings' cures leave the output destroyed, the cured plan is compared
layer by layer again and its NaN birth becomes a finding (at most ``UNMASK_ROUNDS`` rounds).

Members get ``evidence["joint_cause"]`` (the group's share and size), so the reports show them
as one group and the assessment counts the joint cure (``explained_share``). Every measurement
goes through the caller's ``measure`` (``trials.ImpactTrials``: remembered, so a subset
measured twice costs one evaluation); at most ``MAX_EVALS`` new measurements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.diagnosis.assessment import (
    DEFECT_MIN_SHARE,
    HARD_KINDS,
    MECHANISM_KINDS,
    share_removed,
)
from precision_doctor.diagnosis.causes.cures import layerwise_regions
from precision_doctor.diagnosis.causes.findings import Finding
from precision_doctor.formats import FORMATS
from precision_doctor.layerwise.candidates import Candidate, emulated, reference_factory
from precision_doctor.layerwise.compare import compare_layerwise

JOINT_MIN_SHARE = DEFECT_MIN_SHARE  # the union must remove at least half of the error
KEEP_SHARE = 0.9  # the minimal set keeps >= 90% of what the union removes
MAX_EVALS = 64  # new measurements of one reduction (each also within the findings budget)
MAX_UNITS = 24
UNMASK_ROUNDS = 4
# Other causes measured on top of the main cure, one evaluation each: 4 is a third of the
# findings measured one by one (findings.MAX_FINDINGS), enough for the distinct mechanisms a
# destroyed output hides (a lost phase, a cancellation), errors first
RESIDUAL_MEASURED = 4
# Findings that can be a cause, in the order the reduction prefers them; a tensor with little
# headroom in FP32 can overflow in the emulation (its inputs already rounded): last.
CAUSE_KINDS = (*HARD_KINDS, *MECHANISM_KINDS, "underflow", "accumulated-rounding", "headroom")


@dataclass(frozen=True)
class JointCause:
    """Findings that cure the error only together.

    Attributes:
        members: ``(kind, node)`` of each member finding, in the findings' order.
        nodes: The FP32 set of their cures (union of their nodes), in order of first use.
        share: Share of the worst output's error their joint cure removes (0..1).
        alone: Each member's share alone, in ``members`` order.
        evaluations: Measurements the reduction needed (remembered ones not counted).
        minimal: Whether the reduction finished within ``MAX_EVALS`` (False: some members
            were kept untested; the set is sufficient, its share measured).
    """

    members: tuple[tuple[str, str], ...]
    nodes: tuple[str, ...]
    share: float
    alone: tuple[float, ...]
    evaluations: int = 0
    minimal: bool = True

    def to_dict(self) -> dict:
        return {"members": [{"kind": k, "node": n} for k, n in self.members],
                "nodes": list(self.nodes), "share": self.share, "alone": list(self.alone),
                "evaluations": self.evaluations, "minimal": self.minimal}

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
    # cause findings, the hard range events first: the reduction prefers earlier units
    every = sorted((i for i, f in enumerate(findings)
                    if f.nodes and f.kind != "reference-mismatch"),
                   key=lambda i: (_rank(findings[i].kind), i))
    units = [i for i in every if findings[i].kind in CAUSE_KINDS][:MAX_UNITS]
    if union_share is None or union_share < JOINT_MIN_SHARE or len(every) < 2 \
            or not baseline > 0:
        return None
    if any((findings[i].impact or 0.0) >= JOINT_MIN_SHARE for i in every):
        return None
    calls = [0]

    def share(subset: Sequence[int]) -> float:
        calls[0] += 1
        nodes = list(dict.fromkeys(n for i in subset for n in findings[i].nodes))
        return share_removed(baseline, measure(nodes)) if nodes else 0.0

    need = KEEP_SHARE * union_share
    if len(units) < 2 or share(units) < need:
        units = every  # the first cause findings fall short: every finding with a cure
    hard = [i for i in units if findings[i].kind in HARD_KINDS]
    if 2 <= len(hard) < len(units) and share(hard) >= need:
        units = hard  # the range events alone suffice: one measurement, even past the budget
    ran_out = [False]

    def passes(subset: Sequence[int]) -> bool:
        nodes = list(dict.fromkeys(n for i in subset for n in findings[i].nodes))
        if calls[0] >= MAX_EVALS or not _affordable(measure, nodes):
            ran_out[0] = True
            return False  # untested: keep it (the set stays sufficient)
        return share(subset) >= need

    kept = sorted(_reduce(units, passes))
    joint = share(kept)
    if len(kept) < 2 or joint < JOINT_MIN_SHARE:
        return None
    nodes = tuple(dict.fromkeys(n for i in kept for n in findings[i].nodes))
    return JointCause(tuple((findings[i].kind, findings[i].node) for i in kept), nodes, joint,
                      tuple(findings[i].impact or 0.0 for i in kept), calls[0],
                      not ran_out[0])


def _affordable(measure: Callable[[Sequence[str]], float], nodes: Sequence[str]) -> bool:
    """``trials.affordable`` (kept here: trials imports this module's neighbours)."""
    check = getattr(measure, "affordable", None)
    return True if check is None else bool(check(nodes))


def _rank(kind: str) -> int:
    """The reduction's preference: ``CAUSE_KINDS`` in order, any other kind after them."""
    return CAUSE_KINDS.index(kind) if kind in CAUSE_KINDS else len(CAUSE_KINDS)


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


def unmask(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], candidate: Candidate,
           findings: Sequence[Finding], measure: Callable[[Sequence[str]], float],
           baseline: float, threshold: float, rounds: int = UNMASK_ROUNDS) -> list[Finding]:
    """Causes hidden behind others: new findings for the NaN/Inf births that appear only once
    the findings' cures run in FP32.

    A layerwise comparison sees where NaN/Inf is *born* from finite inputs; downstream of the
    first birth every tensor is already NaN, so a second, independent overflow (a later
    int32-to-float Cast of a quantized encoder, close to the format max in FP32 and beyond it
    in the emulation) is never born and never found. While the findings' joint cure leaves the
    output destroyed (NaN/Inf), the candidate's plan with every cure in FP32 is compared layer
    by layer on one sample (``feeds``, the worst), its NaN birth becomes a finding whose cure is
    its overflow region (``cures.layerwise_regions``), and the next round starts from there; at
    most ``rounds`` rounds.

    Args:
        model / candidate: The FP32 model and the emulated candidate (its plan is the start).
        findings: The findings so far (their ``nodes`` are the cures).
        measure: Output error with the given nodes in FP32 (``trials.ImpactTrials``).
        baseline: The candidate's output error (rel L2; inf when destroyed).
        threshold: Layerwise divergence threshold (rel L2).

    Returns:
        The new findings (``activation-overflow`` or ``nan-source``, evidence
        ``found_by: unmasking``), in the order found; empty when the cures already leave the
        output finite or no birth is found.
    """
    plan = candidate.plan
    if plan is None:
        return []
    nodes = list(dict.fromkeys(n for f in findings if f.kind != "reference-mismatch"
                               for n in f.nodes))
    limit = FORMATS[plan.default].max
    found: list[Finding] = []
    for _ in range(rounds):
        if not _affordable(measure, ()) or np.isfinite(measure(nodes)):  # no time, or cured
            break
        cured = emulated(plan.keep_fp32(nodes, "diagnose"), candidate.conv_bias)
        lw = compare_layerwise(model, [dict(feeds)], reference_factory, cured.factory,
                               plan.default, threshold)
        birth = lw.record(lw.nan_birth) if lw.nan_birth else None
        if birth is None:
            break
        region = layerwise_regions(model, lw).get(birth.node, (birth.node,))
        new = [n for n in region if n not in nodes]
        if not new:
            break
        kind = "activation-overflow" if birth.cand_inf else "nan-source"
        found.append(Finding(
            kind, birth.node, birth.op_type, birth.tensor,
            f"{birth.op_type} {birth.node} produces {birth.cand_inf} Inf and {birth.cand_nan} "
            f"NaN (reference max |x| {birth.ref_max_abs:.3g}, {plan.default.value.upper()} max "
            f"{limit:g}) once the causes above run in FP32: a cause they masked",
            {"found_by": "unmasking", "ref_max_abs": birth.ref_max_abs,
             "cand_inf": birth.cand_inf, "cand_nan": birth.cand_nan, "cure_nodes": len(region)},
            f"keep its overflow region in FP32 ({region[0]} .. {region[-1]}), with the other "
            "causes", "error", tuple(region)))
        nodes.extend(new)
    return found


def residual_shares(findings: Sequence[Finding], joint: JointCause | None,
                    measure: Callable[[Sequence[str]], float], baseline: float = 0.0
                    ) -> list[Finding]:
    """What each other cause removes of the error the main cure leaves.

    With a destroyed output (infinite baseline) any finite result counts as 100% removed, so
    a cause that only matters once the output is finite again (a timestep embedding's lost
    phase behind 25 overflowing blocks) measures 0% alone and plays no part in the joint
    cause. Here the main cure's own error is the baseline: the joint cause's cure, or, on a
    destroyed output without one, the cure of the finding that alone removes at least
    ``JOINT_MIN_SHARE``. For at most ``RESIDUAL_MEASURED`` other cause findings (errors first,
    in their order), one evaluation each of the main cure plus theirs (within the findings'
    budget, but the first one, and the main cure's own, always). Each measured one gets
    ``evidence["residual_share"]`` (0..1), ``residual_before`` and ``residual_after`` (rel L2)
    and ``residual_cure`` (``joint cause`` or ``<kind> at <node>``).

    Returns:
        ``findings`` with those measurements; unchanged without a main cure or when it leaves
        no finite error.
    """
    if joint is not None:
        members, cure, name = set(joint.members), tuple(joint.nodes), "joint cause"
    else:
        top = max((f for f in findings if f.impact is not None and f.nodes),
                  key=lambda f: f.impact or 0.0, default=None)
        if top is None or not math.isinf(baseline) or (top.impact or 0.0) < JOINT_MIN_SHARE:
            return list(findings)
        members, cure, name = {(top.kind, top.node)}, top.nodes, f"{top.kind} at {top.node}"
    left = measure(list(cure))
    if not (math.isfinite(left) and left > 0):
        return list(findings)
    cured = set(cure)
    todo = sorted((i for i, f in enumerate(findings)
                   if (f.kind, f.node) not in members and f.kind in CAUSE_KINDS and f.nodes
                   and not set(f.nodes) <= cured),
                  key=lambda i: (findings[i].severity != "error", i))[:RESIDUAL_MEASURED]
    out = list(findings)
    for k, i in enumerate(todo):
        f = findings[i]
        nodes = list(dict.fromkeys((*cure, *f.nodes)))
        if k and not _affordable(measure, nodes):  # the first one even past the budget
            break
        after = measure(nodes)
        out[i] = replace(f, evidence={**f.evidence, "residual_share": share_removed(left, after),
                                      "residual_before": left, "residual_after": after,
                                      "residual_cure": name})
    return out


def mark_members(findings: Sequence[Finding], joint: JointCause | None) -> list[Finding]:
    """``findings`` with each member of ``joint`` carrying ``evidence["joint_cause"]``
    (``{"share", "members", "alone", "minimal"}``: the group's joint share, its size, the
    largest share of a member alone, whether the reduction finished)."""
    if joint is None:
        return list(findings)
    members = set(joint.members)
    mark = {"share": joint.share, "members": len(joint.members),
            "alone": max(joint.alone, default=0.0), "minimal": joint.minimal}
    return [replace(f, evidence={**f.evidence, "joint_cause": mark})
            if (f.kind, f.node) in members else f for f in findings]


__all__ = ["JointCause", "find_joint_cause", "mark_members", "residual_shares", "unmask"]
