"""``assess``: classify a diagnosis by the rules of ``diagnosis.assessment`` and say it.

Each kind's sentence carries the numbers behind it; the remedy says what to do.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import Sequence

from precision_doctor.diagnosis.assessment import (
    DEFECT_MIN_SHARE,
    ROUNDING_FACTOR,
    Assessment,
    AssessmentInputs,
    benign_hit,
    catastrophic_gain,
    defect_candidates,
    share_removed,
    worst_rel_l2,
)
from precision_doctor.diagnosis.decisions.records import DecisionSummary
from precision_doctor.diagnosis.lengths.assess import with_lengths
from precision_doctor.formats import FORMATS
from precision_doctor.numbers import fmt3


def _g(x: float | None) -> str:
    """3 significant digits as every report writes them (``precision_doctor.numbers.fmt3``)."""
    return "n/a" if x is None else fmt3(x)


def assess(x: AssessmentInputs) -> Assessment:
    """Classify the result (rules: module docstring).

    Returns:
        The ``Assessment``; its ``evidence`` always has ``worst_output``, ``worst_rel_l2``,
        ``expected_rel_l2`` (``sqrt(depth) * u``) and ``depth``.
    """
    u = FORMATS[x.target].unit_roundoff
    worst = max(x.outputs, key=lambda o: (not o[3], o[1]), default=("", 0.0, None, True, 0))
    expected = math.sqrt(max(x.depth, 1)) * u
    ev: dict = {"worst_output": worst[0], "worst_rel_l2": worst[1],
                "tolerance_rel_l2": worst[2], "expected_rel_l2": expected, "depth": x.depth,
                "unit_roundoff": u}
    if x.max_gain is not None:
        ev.update(max_local_gain=x.max_gain[1], max_gain_node=x.max_gain[0],
                  catastrophic_gain=catastrophic_gain(x.target))
    rw_note, rw_remedy = rewritten_note(x, ev)
    result = with_lengths(_classify(x, ev, worst, expected, rw_note, rw_remedy), x.lengths)
    return on_random_data(result) if x.synthetic else result


def _classify(x: AssessmentInputs, ev: dict, worst, expected: float, rw_note: str,
              rw_remedy: str) -> Assessment:
    share = x.explained_share
    if x.passed:
        flips = sum(d.flips for d in x.decisions)
        summary = (f"All {len(x.outputs)} output(s) meet their tolerance (worst rel L2 "
                   f"{_g(worst[1])} on {worst[0]}"
                   + (f", tolerance {_g(worst[2])}" if worst[2] is not None else "") + ")"
                   + (f"; {flips} decision(s) flipped" if flips else "") + ".")
        return Assessment("within-tolerance", summary, ev, "nothing to do", share)
    defect = _defect(x, ev, share, rw_note, rw_remedy)
    if defect is not None:
        return defect
    flipped = _decision_flips(x, ev, share, rw_note, rw_remedy)
    if flipped is not None:
        return flipped
    flagged = defect_candidates(x.findings, x.target)
    if flagged and x.defect_share is not None:
        ev["defect_share"] = x.defect_share
    ratio = worst[1] / expected if expected > 0 else math.inf
    ev["rounding_ratio"] = ratio
    failing = {o[0] for o in x.outputs if not o[3]}
    damaged = [d for d in x.decisions if d.output in failing and (d.damage or d.destroyed)]
    gain_text = (f"; the largest local error gain is {_g(x.max_gain[1])}x at {x.max_gain[0]} "
                 f"(catastrophic from {_g(catastrophic_gain(x.target))}x)"
                 if x.max_gain else "")
    tol = f" (tolerance {_g(worst[2])})" if worst[2] is not None else ""
    events = (f" The {len(flagged)} flagged event(s) explain only {x.defect_share:.1%} of it."
              if flagged and x.defect_share is not None else "")
    if ratio <= ROUNDING_FACTOR and not damaged:
        summary = (f"Ordinary {x.target.value.upper()} rounding: worst rel L2 {_g(worst[1])} on "
                   f"{worst[0]}{tol} is {_g(ratio)}x the {_g(expected)} expected from "
                   f"sqrt({x.depth}) x u over {x.depth} rounded layers (within "
                   f"{ROUNDING_FACTOR:g}x){gain_text}; no decision is damaged." + events
                   + rw_note)
        remedy = rw_remedy or ("this is what the format's rounding gives this model: judge it "
                               "by its task (--metric), set the tolerance from the observed "
                               "error, or let `precision-doctor fix` keep a few nodes in FP32")
        return Assessment("rounding", summary, ev, remedy, share)
    if x.measured and share is not None and share >= DEFECT_MIN_SHARE:
        return _union_defect(x, ev, share, rw_note, rw_remedy)
    why = (f"worst rel L2 {_g(worst[1])} on {worst[0]}{tol} is {_g(ratio)}x the "
           f"{_g(expected)} that {x.target.value.upper()} rounding explains (sqrt({x.depth}) x "
           f"u; rounding stays within {ROUNDING_FACTOR:g}x)")
    summary = ("Not explained: " + why + damage_text(damaged, ev) + gain_text + "."
               + events + attribution_text(x, share) + rw_note)
    metric = next((d.suggested_metric for d in damaged if d.suggested_metric), None) or next(
        (d.suggested_metric for d in x.decisions if d.suggested_metric), None)
    remedy = rw_remedy or (
        "do not loosen the tolerance: the error is not ordinary rounding"
        + ("; decisions far from any tie flip" if damaged else "")
        + ". Run `precision-doctor fix`" + (f" --metric {metric}" if metric else "")
        + " to find the FP32 set that meets the target, and look at the largest local "
        "error gains in the layerwise table")
    return Assessment("unexplained", summary, ev, remedy, share)


def _defect(x: AssessmentInputs, ev: dict, share, rw_note: str, rw_remedy: str
            ) -> Assessment | None:
    cands = defect_candidates(x.findings, x.target)
    nonfinite = sum(o[4] for o in x.outputs)
    if x.measured:
        ok = bool(cands) and x.defect_share is not None and x.defect_share >= DEFECT_MIN_SHARE
    else:
        gross = worst_rel_l2(x) >= math.sqrt(FORMATS[x.target].unit_roundoff)
        ok = nonfinite > 0 or (gross and any(f.kind in ("activation-overflow", "nan-source")
                                             for f in cands))
    if not ok:
        return None
    if not cands:  # NaN/Inf in the outputs with no localized cause
        summary = (f"A defect: {nonfinite} NaN/Inf value(s) in the outputs; the layerwise "
                   "comparison did not localize where they are born." + rw_note)
        return Assessment("defect", summary, {**ev, "output_nonfinite": nonfinite},
                          rw_remedy or "run diagnose with layerwise comparison on", share)
    top = cands[0]
    nodes = tuple(dict.fromkeys(n for f in cands for n in f.nodes))
    ev.update(defect_kind=top.kind, defect_node=top.node, defect_share=x.defect_share,
              defect_findings=len(cands))
    joint = (f"; keeping the {len(nodes)} named node(s) in FP32 removes "
             f"{x.defect_share:.1%} of the output error" if x.defect_share is not None else "")
    more = f" and {len(cands) - 1} more" if len(cands) > 1 else ""
    summary = (f"A defect: {top.kind} at {top.op_type} {top.node}{more} ({top.summary}){joint}."
               + rw_note)
    group = top.evidence.get("joint_cause")
    first_remedy = top.remedy
    if isinstance(group, dict):  # independent causes (diagnosis.causes.joint)
        members = [f for f in cands if "joint_cause" in f.evidence]
        kinds = Counter(f.kind for f in members)
        ev.update(joint_members=group["members"], joint_share=group["share"],
                  joint_alone=group["alone"])
        counted = ", ".join(f"{n} {k}" for k, n in kinds.most_common())
        if group.get("minimal", True):
            summary = (f"A defect with {group['members']} independent causes ({counted}), the "
                       f"first at {top.op_type} {top.node}. Their cures together remove "
                       f"{group['share']:.1%} of the output error; each alone at most "
                       f"{group['alone']:.1%}: each one alone still leaves the output "
                       "destroyed." + rw_note)
        else:  # joint.find_joint_cause ran out of evaluations or budget before it was minimal
            summary = (f"A defect: the cures of {group['members']} findings together "
                       f"({counted}, the first at {top.op_type} {top.node}) remove "
                       f"{group['share']:.1%} of the output error; each alone at most "
                       f"{group['alone']:.1%}. The set was not narrowed further (the "
                       "measurements ran out first): some members may not be needed; "
                       "`precision-doctor fix` searches the smallest set." + rw_note)
        cure = len(dict.fromkeys(n for f in members for n in f.nodes))
        first_remedy = (f"keep the cures of all {group['members']} causes in FP32 together "
                        f"({cure} nodes, each cause's own: the findings list them), or rescale "
                        "where the values grow")
    rest = _residual(x, ev)
    left = next((f.evidence["residual_before"] for f in x.findings
                 if isinstance(f.evidence.get("residual_before"), float)), None)
    if rest is None and left is not None:  # measured, and no other cause removes most of it
        ev["residual_rel_l2"] = left
        summary += (f" What {'their' if isinstance(group, dict) else 'its'} cure leaves: rel "
                    f"L2 {_g(left)}" + (f" (tolerance {_g(worst_tol(x))})"
                                        if worst_tol(x) is not None else "") + ".")
    if rest is not None:
        summary += (f" What {'their' if isinstance(group, dict) else 'its'} cure leaves (rel "
                    f"L2 {_g(rest.evidence['residual_before'])}) is "
                    f"{rest.kind} at {rest.op_type} {rest.node}: its cure removes "
                    f"{rest.evidence['residual_share']:.1%} of that.")
        nodes = tuple(dict.fromkeys((*nodes, *rest.nodes)))
        first_remedy += f"; then {rest.remedy}"
    remedy = first_remedy + ("; the safe rewrites alone also cure it: " + rw_remedy
                             if rw_remedy else "")
    if "precision-doctor fix" not in remedy:
        remedy += ("; `precision-doctor fix` writes the cured model (safe rewrites first, then "
                   "the smallest FP32 set that meets the target)")
    return Assessment("defect", summary, ev, remedy, share, nodes)


def worst_tol(x: AssessmentInputs) -> float | None:
    """The tolerance (rel L2) of the worst failing output, or None."""
    failing = [o for o in x.outputs if not o[3]]
    return max(failing, key=lambda o: o[1])[2] if failing else None


def _residual(x: AssessmentInputs, ev: dict):
    """The finding that removes most of what the main cure leaves (``joint.residual_shares``:
    at least half of it), or None; its share goes into ``ev``."""
    best = max((f for f in x.findings if isinstance(f.evidence.get("residual_share"), float)),
               key=lambda f: f.evidence["residual_share"], default=None)
    if best is None or best.evidence["residual_share"] < DEFECT_MIN_SHARE:
        return None
    ev.update(residual_kind=best.kind, residual_node=best.node,
              residual_share=best.evidence["residual_share"],
              residual_rel_l2=best.evidence.get("residual_before"))
    return best


def _union_defect(x: AssessmentInputs, ev: dict, share: float, rw_note: str, rw_remedy: str
                  ) -> Assessment:
    """A defect by the union of all findings' cures: they remove ``share`` (>= 50%) of the
    error together although no defect-kind subset was measured to (``diagnosis.causes.joint``
    reduces such a union to a joint cause; this is what stays when it could not). Never
    "unexplained" beside an explained share of half or more."""
    nodes = tuple(dict.fromkeys(n for f in x.findings if f.kind != "reference-mismatch"
                                for n in f.nodes))
    kinds = ", ".join(sorted({f.kind for f in x.findings}))
    ev.update(defect_kind="union", defect_share=share, defect_findings=len(x.findings))
    summary = (f"A defect: keeping the {len(nodes)} nodes of all {len(x.findings)} findings "
               f"({kinds}) in FP32 together removes {share:.1%} of the output error; no "
               "smaller set of them was measured to." + rw_note)
    remedy = rw_remedy or ("keep the findings' nodes in FP32; `precision-doctor fix` writes "
                           "the cured model (safe rewrites first, then the smallest FP32 set "
                           "that meets the target)")
    return Assessment("defect", summary, ev, remedy, share, nodes)


def _decision_flips(x: AssessmentInputs, ev: dict, share, rw_note: str, rw_remedy: str
                    ) -> Assessment | None:
    failing = {o[0] for o in x.outputs if not o[3]}
    hits = [d for d in x.decisions if benign_hit(d, failing)]
    if not hits:
        return None
    d = max(hits, key=lambda h: h.flip_error_share)
    mine = [f for f in x.flips if f.output == d.output]
    margins = ", ".join(_g(f.fp32_margin) for f in mine[:5])
    rel = next((o[1] for o in x.outputs if o[0] == d.output), None)
    ev.update(decision_output=d.output, flips=d.flips, positions=d.positions,
              flip_error_share=d.flip_error_share, rel_l2=rel, near_ties=d.near_ties,
              task_neutral=d.task_neutral, typical_error=d.typical_error,
              rel_l2_without_flips=d.rel_l2_without_flips, task_agreement=d.task_agreement,
              suggested_metric=d.suggested_metric)
    task = ""
    if d.task_agreement is not None:
        task = f"; {d.task_metric} agreement {d.task_agreement:.1%}"
    reading = []
    if d.near_ties:
        reading.append(f"{d.near_ties} near-tie(s) (FP32 margin within 3x the typical error "
                       f"{_g(d.typical_error)})")
    if d.task_neutral:
        reading.append(f"{d.task_neutral} that leave the task result unchanged (e.g. a CTC "
                       "alignment shift)")
    summary = (f"Decision flips: {d.flips} of {d.positions} decisions of {d.output} changed "
               f"(FP32 margins {margins}): " + " and ".join(reading) + f"; they carry "
               f"{d.flip_error_share:.1%} of its squared error; without them rel L2 is "
               f"{_g(d.rel_l2_without_flips)} (relative to the whole output; with them "
               f"{_g(rel)}){task}." + rw_note)
    remedy = rw_remedy or (
        f"judge the model by its task: --metric {d.suggested_metric} ({d.why})"
        if d.suggested_metric else "judge the model by its task metric (--metric)")
    return Assessment("decision-flips", summary, ev, remedy, share)


def damage_text(damaged: Sequence[DecisionSummary], ev: dict) -> str:
    if not damaged:
        return ""
    d = max(damaged, key=lambda s: s.damage)
    ev.update(decision_output=d.output, flips=d.flips, positions=d.positions,
              damaged_flips=d.damage, damage_margin=d.damage_margin,
              typical_error=d.typical_error, destroyed=d.destroyed)
    state = " (the output is destroyed)" if d.destroyed else ""
    margin = f" at FP32 margins around {_g(d.damage_margin)}" if d.damage_margin else ""
    typical = (f", far above the typical error {_g(d.typical_error)}"
               if d.typical_error is not None else "")
    return (f"; {d.damage} of {d.positions} decisions of {d.output} flipped{margin}"
            f"{typical}: damage, not near-ties{state}")


def attribution_text(x: AssessmentInputs, share: float | None) -> str:
    a = x.attribution
    if not x.measured:
        return (" Impact cannot be measured with a real engine as the candidate: diagnose "
                "with the emulator (the default runner) to attribute the error.")
    if a is None:
        return "" if share is None else f" The findings explain {share:.1%} of it."
    if a.get("status") == "spread":
        return (f" No set of at most {a['small_limit']} nodes in FP32 removes 90% of it: the "
                f"attribution search ({a['evaluations']} evaluations) needed "
                f"{a['kept_size']}; the error is spread over the model.")
    if a.get("status") == "budget":
        return (f" The attribution search ran out of its budget ({a['evaluations']} "
                f"evaluations, {fmt3(a['seconds'])} s) at {a['kept_size']} nodes before it "
                "narrowed them to a small set: `precision-doctor fix` searches further.")
    if a.get("status") == "none":
        return (" The attribution search ended without a set that removes 90% of it on the "
                f"worst samples ({a['evaluations']} evaluations), although every candidate in "
                "FP32 is the FP32 reference (checked before it: search.invariant): please "
                "report this model.")
    return (f" Attribution found {len(a['nodes'])} node(s) whose FP32 fallback removes 90% on "
            f"the worst samples; on all samples the findings explain "
            f"{(share or 0.0):.1%}.")


def on_random_data(a: Assessment) -> Assessment:
    """The same assessment, said to hold for random data only (module docstring)."""
    return replace(
        a, summary="On random inputs only: " + a.summary,
        remedy=a.remedy + ("; the inputs are random data, which reaches ranges real inputs do "
                           "not and misses the ones they do: rerun with real samples (--data "
                           "a folder of images, .npy/.npz or Polygraphy JSON) before acting"),
        evidence={**a.evidence, "synthetic_inputs": True})


def rewritten_note(x: AssessmentInputs, ev: dict) -> tuple[str, str]:
    rw = x.rewritten
    if not rw:
        return "", ""
    rel = max((float(o["metrics"]["rel_l2"]) if not isinstance(o["metrics"]["rel_l2"], str)
               else math.inf for o in rw.get("outputs", ())), default=None)
    ev.update(rewritten_verdict=rw.get("verdict"), rewritten_worst_rel_l2=rel)
    worst = worst_rel_l2(x)
    if rel is not None and worst > 0 and math.isfinite(rel):
        # share of the error the safe rewrites alone remove (the rewrite remedy's impact)
        ev["rewritten_share"] = share_removed(worst, rel)
    names = ", ".join(rw.get("rewrites", ())) or "none"
    if rw.get("verdict") == "pass":
        return (f" The numerically safe rewrites that engines apply anyway ({names}) alone bring "
                f"the model within tolerance (worst rel L2 {_g(rel)}).",
                f"apply the safe rewrites ({names}): engines such as TensorRT do this; "
                "`precision-doctor fix` writes the rewritten model")
    return (f" The engine's safe rewrites ({names}) leave worst rel L2 {_g(rel)}.", "")


__all__ = ["assess"]
