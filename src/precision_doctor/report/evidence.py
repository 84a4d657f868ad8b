"""The assessment's evidence in sentences with units, for the HTML report.

``Assessment.evidence`` (``diagnosis.assess``) is a flat ``{name: scalar}`` map for the JSON;
a reader of the page wants "worst relative L2 error 1.00e-03 on output y (tolerance 1.00e-02)",
not ``worst_rel_l2``. Each rule below reads the keys it names (those present) and writes one
sentence; a key no rule reads is written as ``key: value``, so nothing in the evidence is hidden.
Numbers are ``numbers.fmt3`` (3 significant digits, as everywhere in the reports), shares are
percentages.

It also says which decision flips a report lists (``listed_flips``: those that changed a
decision at a margin that matters, or the task) and counts the others in one line
(``flip_counts``), for the terminal and the HTML alike.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Callable, Mapping

from precision_doctor.diagnosis.decisions.records import DecisionFlip
from precision_doctor.diagnosis.report import DiagnosisReport
from precision_doctor.layerwise.compare import LayerRecord, LayerwiseResult
from precision_doctor.numbers import fmt3, fmt_share

Rule = tuple[tuple[str, ...], Callable[[Mapping[str, Any], str], str | None]]


def tightest(lw: LayerwiseResult | None) -> LayerRecord | None:
    """The tensor with the least headroom to the format's max among those that fit it
    (``headroom_bits`` >= 0, a non-zero finite range): how close the model comes to overflow.
    A tensor already beyond the max (a -FLT_MAX attention mask, an overflow) is a finding of
    its own, not headroom; None when no tensor fits or no layerwise comparison ran."""
    fits = [r for r in (lw.records if lw else ())
            if r.ref_max_abs > 0 and math.isfinite(r.headroom_bits) and r.headroom_bits >= 0]
    return min(fits, key=lambda r: r.headroom_bits, default=None)


def _worst(e: Mapping[str, Any], target: str) -> str:
    tol = e.get("tolerance_rel_l2")
    where = f" on output {e['worst_output']}" if e.get("worst_output") else ""
    return (f"worst relative L2 error {fmt3(e.get('worst_rel_l2'))}{where}"
            + (f" (tolerance {fmt3(tol)})" if tol is not None else ""))


def _expected(e: Mapping[str, Any], target: str) -> str:
    depth = e.get("depth")
    return (f"rounding alone is expected to give about {fmt3(e.get('expected_rel_l2'))} "
            f"(sqrt(depth) x unit roundoff" + (f", depth {depth} ops" if depth else "") + ")")


def _gain(e: Mapping[str, Any], target: str) -> str:
    node = f" at node {e['max_gain_node']}" if e.get("max_gain_node") else ""
    gain = e.get("max_local_gain")
    if isinstance(gain, float) and math.isinf(gain):
        return f"an infinite local error gain{node} (Inf or NaN born from finite inputs)"
    cat = e.get("catastrophic_gain")
    return (f"largest local error gain {fmt3(e.get('max_local_gain'))}x{node}"
            + (f" (catastrophic from {fmt3(cat)}x)" if cat is not None else ""))


def _rewritten(e: Mapping[str, Any], target: str) -> str:
    parts = []
    if e.get("rewritten_verdict") is not None:
        parts.append(f"after the safe rewrites the emulation is {e['rewritten_verdict']}"
                     + (f", worst relative L2 error {fmt3(e['rewritten_worst_rel_l2'])}"
                        if e.get("rewritten_worst_rel_l2") is not None else ""))
    if e.get("rewritten_share") is not None:
        parts.append(f"the safe rewrites alone remove {fmt_share(e['rewritten_share'])} of the "
                     "error")
    return "; ".join(parts)


def _defect(e: Mapping[str, Any], target: str) -> str:
    what = " ".join(str(e[k]) for k in ("defect_kind",) if e.get(k))
    if what == "union":  # assess._union_defect: all findings' cures together
        what = "the union of all findings' cures"
    node = f" at node {e['defect_node']}" if e.get("defect_node") else ""
    share = (f"; the defect candidates' cure removes {fmt_share(e['defect_share'])} of the error"
             if e.get("defect_share") is not None else "")
    n = e.get("defect_findings")
    count = f" ({n} finding(s) are defect candidates)" if n else ""
    return f"defect: {what or 'a defect'}{node}{share}{count}"


def _joint(e: Mapping[str, Any], target: str) -> str:
    return (f"{e.get('joint_members')} independent causes together remove "
            f"{fmt_share(e.get('joint_share'))} of the error; each alone at most "
            f"{fmt_share(e.get('joint_alone'))}")


def _residual(e: Mapping[str, Any], target: str) -> str:
    if e.get("residual_kind") is None:  # measured; no other cause removes most of it
        return f"what the main cure leaves: relative L2 error {fmt3(e.get('residual_rel_l2'))}"
    return (f"what the main cure leaves (relative L2 error {fmt3(e.get('residual_rel_l2'))}) "
            f"is {e.get('residual_kind')} at node {e.get('residual_node')}: its cure removes "
            f"{fmt_share(e.get('residual_share'))} of that")


def _decision(e: Mapping[str, Any], target: str) -> str:
    flips, positions = e.get("flips"), e.get("positions")
    out = f" of output {e['decision_output']}" if e.get("decision_output") else ""
    text = f"{flips} of {positions} decisions{out} flipped"
    if e.get("flip_error_share") is not None:
        text += f", carrying {fmt_share(e['flip_error_share'], 1)} of the squared error"
    return text


def _reading(e: Mapping[str, Any], target: str) -> str | None:
    counts = [(e.get(k), label) for k, label in (("near_ties", "near-tie"),
              ("task_neutral", "task-neutral"), ("damaged_flips", "damage")) if e.get(k)]
    if not counts:
        return None
    margin = (f" (damaged at FP32 margins around {fmt3(e['damage_margin'])})"
              if e.get("damage_margin") is not None else "")
    return "flips read as " + ", ".join(f"{n} {label}" for n, label in counts) + margin


RULES: tuple[Rule, ...] = (
    (("worst_output", "worst_rel_l2", "tolerance_rel_l2"), _worst),
    (("expected_rel_l2", "depth"), _expected),
    (("unit_roundoff",), lambda e, t: f"{t.upper()} unit roundoff {fmt3(e['unit_roundoff'])}"),
    (("rounding_ratio",), lambda e, t: f"the error is {fmt3(e['rounding_ratio'])}x what rounding "
                                       "alone is expected to give"),
    (("max_local_gain", "max_gain_node", "catastrophic_gain"), _gain),
    (("rewritten_verdict", "rewritten_worst_rel_l2", "rewritten_share"), _rewritten),
    (("defect_kind", "defect_node", "defect_share", "defect_findings"), _defect),
    (("joint_members", "joint_share", "joint_alone"), _joint),
    (("residual_kind", "residual_node", "residual_share", "residual_rel_l2"), _residual),
    (("output_nonfinite",), lambda e, t: f"{e['output_nonfinite']} NaN/Inf value(s) in the "
                                         "outputs"),
    (("decision_output", "flips", "positions", "flip_error_share"), _decision),
    (("near_ties", "task_neutral", "damaged_flips", "damage_margin"), _reading),
    (("rel_l2",), lambda e, t: f"relative L2 error of that output {fmt3(e['rel_l2'])}"),
    (("rel_l2_without_flips",), lambda e, t: "relative L2 error without the flips "
                                             f"{fmt3(e['rel_l2_without_flips'])}"),
    (("typical_error",), lambda e, t: f"typical error of a position {fmt3(e['typical_error'])}"),
    (("task_agreement",), lambda e, t: None if e["task_agreement"] is None else
     f"task agreement {fmt_share(e['task_agreement'], 1)}"),
    (("suggested_metric",), lambda e, t: None if not e["suggested_metric"] else
     f"suggested task metric: --metric {e['suggested_metric']}"),
    (("destroyed",), lambda e, t: "the output is destroyed" if e["destroyed"] else None),
    (("synthetic_inputs",), lambda e, t: "measured on synthetic (random) inputs: real data "
                                         "decides" if e["synthetic_inputs"] else None),
)


def listed_flips(report: DiagnosisReport) -> list[DecisionFlip]:
    """The flips worth a line: a decision changed at a margin that matters (``damage``) or the
    task result changed; near-tie and task-neutral flips are counted, not listed."""
    return [f for f in report.decision_flips if f.reading == "damage" or f.task_changed]


def flip_counts(report: DiagnosisReport) -> str | None:
    """One line for the flips not listed (``12 near-tie flips, none changes the task``), or
    None when every flip is listed."""
    listed = {id(f) for f in listed_flips(report)}
    rest = [f for f in report.decision_flips if id(f) not in listed]
    if not rest:
        return None
    counts = Counter(f.reading or "unread" for f in rest)
    what = ", ".join(f"{n} {r}" for r, n in sorted(counts.items()))
    unknown = sum(f.task_changed is None for f in rest)
    tail = ("none changes the task" if not unknown else
            f"none measured to change the task ({unknown} without a task result)")
    return f"{what} flip(s), {tail}"


def evidence_sentences(evidence: Mapping[str, Any], target: str) -> list[str]:
    """The evidence as sentences (see the module docstring), in ``RULES`` order, then
    ``key: value`` for every key no rule reads.

    Args:
        evidence: ``Assessment.evidence`` (JSON scalars; floats may be inf/nan).
        target: The diagnosed format (``fp16``...), for the unit roundoff's sentence.

    Returns:
        One sentence per rule whose keys are present (without a final period).
    """
    used: set[str] = set()
    out: list[str] = []
    for keys, rule in RULES:
        present = [k for k in keys if k in evidence]
        if not present:
            continue
        used.update(present)
        sentence = rule(evidence, target)
        if sentence:
            out.append(sentence[0].upper() + sentence[1:])
    out += [f"{k}: {fmt3(v) if isinstance(v, float) else v}" for k, v in evidence.items()
            if k not in used]
    return out


__all__ = ["RULES", "evidence_sentences", "flip_counts", "listed_flips"]
