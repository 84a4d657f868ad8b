"""Explain the error: findings, their measured cures, attribution and the mechanisms' names.

Stages (each measured, none by pattern alone):

1. Findings from the hazard scan and the layerwise table (``diagnosis.causes.findings``); an
   overflow's cure is its overflow region (``diagnosis.causes.cures``).
2. Impact of each finding: the share of the output error removed when its nodes run in FP32
   (one emulated evaluation each, at most ``findings.MAX_FINDINGS``, within the wall-time
   budget of ``trials.ImpactTrials``), then all findings jointly (``explained_share``). A
   finding left without one says why (``Finding.not_measured``).
3. Attribution (``diagnosis.causes.attribution``) when the findings explain less than half of a
   failing output's error, the error is beyond ``ROUNDING_FACTOR`` x the rounding expectation
   and no benign decision flips account for it: the small FP32 set that removes >= 90%.
   Before it, the all-FP32 invariant (``search.invariant``) is checked once: a node the plan
   cannot reach is a tool defect (``InvariantError``), never "unexplained".
3b. Joint causes (``diagnosis.causes.joint``): when the cures together remove the error and
   none does alone, the minimal set that does, reported as one group; then what the main cure
   (the joint one, or on a destroyed output the one finding that makes it finite) leaves,
   each other cause measured on top of it (``joint.residual_shares``).
4. Names: every amplifier and every attributed group gets its mechanism from the operands
   measured on the worst sample (``diagnosis.causes.mechanisms``), or ``unnamed-mechanism``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.diagnosis.assessment import (
    ROUNDING_FACTOR,
    catastrophic_gain,
    decisions_explain,
    defect_candidates,
    share_removed,
)
from precision_doctor.diagnosis.causes.attribution import Attribution, attribute, worst_samples
from precision_doctor.diagnosis.causes.cures import absorbed_wrongly
from precision_doctor.diagnosis.causes.findings import NOT_MEASURED, Finding, build_findings
from precision_doctor.diagnosis.causes.groups import FindingGroup, pattern_groups
from precision_doctor.diagnosis.causes.hazards import Hazard
from precision_doctor.diagnosis.causes.joint import (
    JointCause,
    find_joint_cause,
    mark_members,
    residual_shares,
    unmask,
)
from precision_doctor.diagnosis.causes.mechanisms import ORDER, name_mechanism, remedy
from precision_doctor.diagnosis.causes.operands import measure_operands
from precision_doctor.diagnosis.causes.trials import (
    FINDINGS_MIN_SECONDS,
    ImpactTrials,
    affordable,
    group_findings,
    measured_first,
    rank_findings,
)
from precision_doctor.diagnosis.decisions.records import DecisionSummary
from precision_doctor.formats import FORMATS, Precision
from precision_doctor.graph.source import node_modules
from precision_doctor.layerwise.candidates import (
    Candidate,
    reference_factory,
)
from precision_doctor.layerwise.compare import LayerwiseResult
from precision_doctor.layerwise.gain import local_gains

Outputs = Mapping[str, Sequence[np.ndarray]]
AMPLIFIER = "accumulated-rounding"


@dataclass(frozen=True)
class Explanation:
    """What ``explain`` found.

    Attributes:
        findings: Ranked, grouped findings.
        explained: Share of the worst output's error removed by all findings jointly, or None.
        defect_share: The same for the defect candidates alone, or None.
        measured: Whether impacts were measured (emulated candidate, failing output,
            ``measure_impact``).
        attribution: The attribution search, when it ran.
        seconds: Wall time per stage (``findings``, ``attribution``, ``mechanisms``).
        joint: Findings that cure the error only together (``diagnosis.causes.joint``).
        groups: Findings repeated per block, and the joint cause, as groups
            (``diagnosis.causes.groups``).
    """

    findings: tuple[Finding, ...]
    explained: float | None
    defect_share: float | None
    measured: bool = False
    attribution: Attribution | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    joint: JointCause | None = None
    groups: tuple[FindingGroup, ...] = ()


def explain(model: onnx.ModelProto, samples: Sequence, target: Precision, candidate: Candidate,
            layerwise: LayerwiseResult | None, hazards: Sequence[Hazard],
            errors: Mapping[str, tuple[float, bool]], reference: Outputs, cand: Outputs,
            decisions: Sequence[DecisionSummary], inputs_of: Mapping[str, Sequence[str]],
            regions: Mapping[str, tuple[str, ...]], expected: float,
            progress: Callable[[str, int, int], None] | None = None,
            budget_s: float = 0.0, measure_impact: bool = True,
            explained_elsewhere: bool = False) -> Explanation:
    """Findings with measured impacts, attribution when they fall short, mechanism names.

    Args:
        model / samples / target / candidate: As ``diagnosis.diagnose.diagnose``.
        layerwise: The layerwise comparison (None: not run).
        hazards: The static hazard scan.
        errors: Output name -> (rel L2, passed) for every compared output.
        reference / cand: The plain runs' outputs (name -> one array per sample).
        decisions: The decision outputs' summaries.
        inputs_of: ``graph.outputs.producer_inputs(model)``.
        regions: ``diagnosis.causes.cures.overflow_regions`` of the model.
        expected: The rounding expectation sqrt(D) * u (``diagnosis.assessment``).
        progress: ``progress(stage, done, total)``.
        budget_s: Wall-time budget of the attribution search (``attribution.MIN_SECONDS`` at
            least); ``diagnose`` gives it 4x the time of its plain runs and layerwise pass.
            The findings' own measurements (impacts, joint cause, residual shares, groups)
            have as much again, at least ``trials.FINDINGS_MIN_SECONDS``; what is left
            unmeasured says so (``Finding.not_measured``).
        measure_impact: Measure impacts (emulated candidates only); False: findings and names
            from the measurements already made, no extra evaluation and no attribution.
        explained_elsewhere: A measured cure outside the findings already explains the error
            (a near-tie length decision, ``diagnosis.lengths``): no unmasking, no attribution.

    Returns:
        The ``Explanation``.
    """
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    failing = {n: e for n, (e, ok) in errors.items() if not ok}
    findings = build_findings(hazards, layerwise, target, bool(failing), inputs_of,
                              candidate.tf32, regions)
    names = list(errors)
    plan = candidate.plan if measure_impact and failing else None
    measure = None
    if plan is not None:
        measure = ImpactTrials(model, plan, candidate.conv_bias, samples, reference, names,
                               max(FINDINGS_MIN_SECONDS, budget_s))
        # what rank_findings and _joint will ask, at once (shape by shape on a GPU)
        measure.prefetch([findings[i].nodes for i in measured_first(findings)]
                         + [_remedy_nodes(findings)])

    baseline = max((e for e, _ in errors.values()), default=0.0)
    if math.isnan(baseline):  # a NaN error is a destroyed output, as an infinite one
        baseline = math.inf
    findings = rank_findings(findings, measure, baseline)
    explained = _joint(findings, measure, baseline)
    seconds["findings"] = time.perf_counter() - t0
    if measure is not None and layerwise is not None and math.isinf(baseline) \
            and (explained or 0.0) < 0.5 and affordable(measure, ()) \
            and not explained_elsewhere:
        # causes masked by the ones found (joint.unmask)
        t0 = time.perf_counter()
        first = worst_samples(reference, cand, list(failing), 1)[0]
        masked = unmask(model, samples[first].feeds, candidate, findings, measure, baseline,
                        layerwise.threshold)
        if masked:
            findings = rank_findings(list(findings) + masked, measure, baseline)
            explained = _joint(findings, measure, baseline)
        seconds["unmasking"] = time.perf_counter() - t0
    attribution = None
    worst = max(failing.values(), default=0.0)
    if (plan is not None and layerwise is not None and not explained_elsewhere
            and (explained or 0.0) < 0.5 and not decisions_explain(decisions, failing)
            and _suspicious(worst, expected, decisions, failing, layerwise, inputs_of,
                            target)):
        t0 = time.perf_counter()
        attribution = attribute(model, samples, reference, cand, plan, failing,
                                layerwise, inputs_of, regions, seconds=budget_s,
                                progress=progress, conv_bias=candidate.conv_bias)
        clusters = rank_findings([_cluster_finding(c) for c in attribution.clusters],
                                 measure, baseline)
        if clusters:
            covered = {n for c in attribution.clusters for n in c}
            kept = [f for f in findings if not set(f.nodes) <= covered]
            findings = rank_findings(kept + clusters, None, baseline)  # sort, no new runs
            explained = _joint(findings, measure, baseline)
        seconds["attribution"] = time.perf_counter() - t0
    joint = None
    if measure is not None:  # independent causes: each cure alone leaves the output destroyed
        t0 = time.perf_counter()
        joint = find_joint_cause(findings, measure, baseline, explained)
        findings = residual_shares(mark_members(findings, joint), joint, measure, baseline)
        seconds["joint"] = time.perf_counter() - t0
    if layerwise is not None:
        findings = [_with_absorber(f, layerwise, inputs_of) for f in findings]
    t0 = time.perf_counter()
    findings = _name_mechanisms(model, samples, target, candidate, layerwise, findings,
                                reference, cand, failing, inputs_of)
    seconds["mechanisms"] = time.perf_counter() - t0
    findings = group_findings(findings)
    defect_share = _defect_share(findings, measure, baseline, explained, target)
    groups = pattern_groups(findings, measure, baseline, joint, node_modules(model))
    if measure is not None:
        measure.close()
    findings = _why_not_measured(findings, measure is not None and baseline > 0, measure_impact,
                                 candidate.plan is not None, bool(failing))
    return Explanation(tuple(findings), explained, defect_share, plan is not None, attribution,
                       seconds, joint, groups)


def _why_not_measured(findings: Sequence[Finding], measured: bool, asked: bool,
                      emulated: bool, failing: bool) -> list[Finding]:
    """Each finding without an impact carries why (``findings.NOT_MEASURED``): the reason of
    the whole diagnosis when nothing was measured; ``rank_findings`` sets the others'."""
    if measured:
        return list(findings)
    key = ("off" if not asked else "engine" if not emulated else "passed" if not failing
           else "no-error")
    return [replace(f, not_measured=NOT_MEASURED[key])
            if f.impact is None and not f.not_measured else f for f in findings]


def _suspicious(worst: float, expected: float, decisions: Sequence[DecisionSummary],
                failing: Mapping[str, float], layerwise: LayerwiseResult,
                inputs_of: Mapping[str, Sequence[str]], target: Precision) -> bool:
    """Whether the error may not be rounding: beyond ``ROUNDING_FACTOR`` x the expectation, a
    damaged decision on a failing output, or a catastrophic local gain somewhere."""
    if worst > ROUNDING_FACTOR * expected:
        return True
    if any(d.output in failing and (d.damage or d.destroyed) for d in decisions):
        return True
    limit = catastrophic_gain(target)
    return any(math.isfinite(g.gain) and g.gain >= limit and g.record.rel_l2 > layerwise.threshold
               for g in local_gains(layerwise.records, inputs_of,
                                    FORMATS[target].unit_roundoff))


def _joint(findings: Sequence[Finding], measure, baseline: float) -> float | None:
    """Share of the output error removed by all findings' remedies jointly (None: not
    measured)."""
    if measure is None or baseline <= 0:
        return None
    nodes = _remedy_nodes(findings)
    return share_removed(baseline, measure(nodes)) if nodes else 0.0


def _remedy_nodes(findings: Sequence[Finding]) -> list[str]:
    """The nodes all remedies keep in FP32 (a reference mismatch has no FP32 remedy)."""
    return list(dict.fromkeys(n for f in findings if f.kind != "reference-mismatch"
                              for n in f.nodes))


def _defect_share(findings: Sequence[Finding], measure, baseline: float,
                  explained: float | None, target: Precision) -> float | None:
    if measure is None or baseline <= 0:
        return None
    defects = list(dict.fromkeys(n for f in defect_candidates(findings, target)
                                 for n in f.nodes))
    if not defects:
        return None
    if set(defects) == set(_remedy_nodes(findings)) and explained is not None:
        return explained
    return share_removed(baseline, measure(defects))


def _with_absorber(f: Finding, layerwise: LayerwiseResult,
                   inputs_of: Mapping[str, Sequence[str]]) -> Finding:
    """An overflow / NaN-Inf finding with the node that turns its Inf into finite wrong values
    downstream (``diagnosis.causes.cures.absorbed_wrongly``), when there is one."""
    if f.kind not in ("activation-overflow", "nan-source"):
        return f
    rec = layerwise.record(f.tensor) if f.tensor else None
    after = rec.index if rec is not None else -1
    r = absorbed_wrongly(layerwise.records, inputs_of, layerwise.threshold, after)
    if r is None:
        return f
    return replace(f, summary=f.summary + (
        f"; downstream, {r.op_type} {r.node} turns the Inf into finite but wrong values "
        f"(rel L2 {r.rel_l2:.3g}; FP32 values up to {r.ref_max_abs:.3g}): the output looks "
        "finite and is wrong"), evidence={**f.evidence, "absorbed_by": r.node,
                                         "absorbed_rel_l2": r.rel_l2})


def _cluster_finding(nodes: tuple[str, ...]) -> Finding:
    """A placeholder finding for an attributed group (named in ``_name_mechanisms``)."""
    return Finding("unnamed-mechanism", nodes[0], "", "", "", {"found_by": "attribution",
                                                               "cure_nodes": len(nodes)},
                   remedy("unnamed-mechanism", nodes), "error", tuple(nodes))


def _name_mechanisms(model, samples, target: Precision, candidate: Candidate,
                     layerwise: LayerwiseResult | None, findings: Sequence[Finding],
                     reference: Outputs, cand: Outputs, failing: Mapping[str, float],
                     inputs_of) -> list[Finding]:
    """Rename amplifier and attributed findings by the first taxonomy rule that accounts for
    the measured gain (``diagnosis.causes.mechanisms``); ``unnamed-mechanism`` otherwise."""
    todo = [i for i, f in enumerate(findings)
            if f.kind == AMPLIFIER or f.evidence.get("found_by") == "attribution"]
    if not todo or layerwise is None:
        return list(findings)
    u = FORMATS[target].unit_roundoff
    gains: dict[str, float] = {}
    for g in local_gains(layerwise.records, inputs_of, u):
        if math.isfinite(g.gain):
            gains[g.record.node] = max(gains.get(g.record.node, 0.0), g.gain)
    nodes = list(dict.fromkeys(n for i in todo for n in findings[i].nodes))
    sample = worst_samples(reference, cand, list(failing) or list(reference), 1)[0]
    facts = measure_operands(model, nodes, samples[sample].feeds, reference_factory,
                             candidate.factory if candidate.plan is not None else None, gains,
                             u, bool(candidate.tf32) or target is Precision.TF32,
                             fp32_accumulation=candidate.plan is not None)
    records = {r.node: r for r in layerwise.records}
    out = list(findings)
    for i in todo:
        f = findings[i]
        named = [m for m in (name_mechanism(facts[n]) for n in f.nodes if n in facts) if m]
        named.sort(key=lambda m: (ORDER.index(m.kind), -m.evidence.get("gain", 0.0)))
        top = named[0] if named else None
        anchor = top.node if top else max(f.nodes, key=lambda n: gains.get(n, 0.0))
        rec = records.get(anchor)
        kind = top.kind if top else "unnamed-mechanism"
        op = top.op_type if top else (rec.op_type if rec else f.op_type)
        gain = gains.get(anchor, 0.0)
        why = (top.rule if top else f"no rule of the taxonomy accounts for its local error "
               f"gain of {gain:.3g}x")
        cure = (f"; the FP32 fallback of {len(f.nodes)} node(s) ({f.nodes[0]} .. "
                f"{f.nodes[-1]}) was found by measurement" if len(f.nodes) > 1 else "")
        summary = f"{op} {anchor}: {why}{cure}"
        evidence = {**f.evidence, **(top.evidence if top else {}), "gain": gain,
                    "mechanism": kind}
        if rec is not None:
            evidence.update(rel_l2=rec.rel_l2, ref_max_abs=rec.ref_max_abs)
        out[i] = replace(f, kind=kind, node=anchor, op_type=op,
                         tensor=rec.tensor if rec else f.tensor, summary=summary,
                         evidence=evidence, remedy=remedy(kind, f.nodes),
                         severity="error" if f.evidence.get("found_by") else f.severity)
    return out


__all__ = ["Explanation", "explain"]
