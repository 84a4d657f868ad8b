"""The assessment: which kind of failure this is, read first, beside the pass/fail verdict.

Kinds and rules (applied in this order; the exit code stays tied to the verdict):

``within-tolerance``
    Every output meets its tolerance. Nothing to do.
``defect``
    A concrete cause that FP32 for a few named nodes (or a numerically safe rewrite) cures:
    a parameter out of range, an activation that overflowed, a NaN/Inf birth, a harmful
    flush-to-zero, or a *catastrophic amplifier*. Rule: keeping the nodes of the main-group
    findings of those kinds in FP32, jointly, removes at least ``DEFECT_MIN_SHARE`` (50%) of
    the worst output's error, i.e. the named nodes explain most of it. When impact cannot be
    measured (a real engine as candidate), only a hard event counts: NaN/Inf in an output, or an
    overflow / NaN/Inf birth inside the model together with an output that lost at least half
    of the format's significant bits (worst rel L2 >= sqrt(u)). An out-of-range value alone is
    not enough without measurement: an attention mask filled with -3.4e38 becomes -inf in FP16
    and is harmless before a Softmax.
``decision-flips``
    Most of the error sits at a few positions where the model's decision changed: on a
    failing decision output, the flipped positions carry at least ``DECISION_MIN_SHARE`` (50%)
    of the squared error and are at most ``FEW_FLIPS`` (5%) of its decisions. Above 5% the
    disagreement is systematic, not a handful of near-ties.
``rounding``
    Otherwise: the error is the accumulation of the format's rounding. For ``D`` rounded layers
    on the longest path, independent relative rounding errors of size ``u`` (unit roundoff,
    2^-11 for FP16, 2^-8 for BF16) add up like a random walk to about ``sqrt(D) * u`` (the
    probabilistic bound of Higham & Mary, "A new approach to probabilistic rounding error
    analysis", SIAM J. Sci. Comput. 2019); the model's conditioning multiplies it. The
    evidence gives this expectation and the largest local error gain
    (``layerwise.gain``), which stays below the catastrophic threshold.

Catastrophic amplifier: a node whose local error gain is at least ``1/sqrt(u)`` (45 for FP16,
16 for BF16). Such a step destroys half of the format's significant bits at once: an input
rounded to ``u`` leaves it with an error of at least ``sqrt(u)`` (2.2e-2 for FP16), above the
default FP16 tolerance of 1e-2 by itself. Well-conditioned ops have gains of 1 to ~10.

``explained_share`` is the share of the worst output's error that disappears when all findings'
remedies are applied together (their nodes in FP32) in one emulated evaluation; the rest is
stated as unexplained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import onnx

from precision_doctor.diagnosis.decisions import DecisionFlip, DecisionSummary
from precision_doctor.diagnosis.rootcause import Finding
from precision_doctor.formats import FORMATS, Precision
from precision_doctor.jsonable import from_json_float, json_float
from precision_doctor.numbers import fmt3

DEFECT_MIN_SHARE = 0.5
DECISION_MIN_SHARE = 0.5
FEW_FLIPS = 0.05
HARD_KINDS = ("parameter-out-of-range", "activation-overflow", "nan-source")
DEFECT_KINDS = (*HARD_KINDS, "underflow")
# Ops that move or reshape data without arithmetic (no rounding): not counted in the depth.
NO_ROUNDING_OPS = frozenset({
    "Constant", "Identity", "Shape", "Size", "Reshape", "Transpose", "Squeeze", "Unsqueeze",
    "Flatten", "Concat", "Split", "Slice", "Gather", "GatherElements", "GatherND", "Expand",
    "Tile", "Pad", "Cast", "CastLike", "ConstantOfShape", "Range", "DepthToSpace",
    "SpaceToDepth", "Relu", "MaxPool", "Max", "Min", "Clip", "Where", "Equal", "Greater",
    "Less", "Not", "And", "Or", "ArgMax", "ArgMin", "NonZero", "TopK"})
KINDS = ("within-tolerance", "rounding", "decision-flips", "defect")


@dataclass(frozen=True)
class Assessment:
    """What kind of result this is (module docstring), with the numbers behind it.

    Attributes:
        kind: One of ``KINDS``.
        summary: One sentence with the numbers, read first.
        evidence: Name -> JSON scalar.
        remedy: What to do.
        explained_share: Share (0..1) of the output error removed by all findings' remedies
            jointly, or None when not measured.
        nodes: ``defect``: the nodes the remedy names; else empty.
    """

    kind: str
    summary: str
    evidence: dict = field(default_factory=dict)
    remedy: str = ""
    explained_share: float | None = None
    nodes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"kind": self.kind, "summary": self.summary,
                "evidence": {k: json_float(v) for k, v in self.evidence.items()},
                "remedy": self.remedy, "explained_share": json_float(self.explained_share),
                "nodes": list(self.nodes)}

    @classmethod
    def from_dict(cls, d: Mapping) -> Assessment:
        share = d.get("explained_share")
        return cls(d["kind"], d["summary"],
                   {k: from_json_float(v) if v in ("inf", "-inf", "nan") else v
                    for k, v in d.get("evidence", {}).items()}, d.get("remedy", ""),
                   from_json_float(share) if share is not None else None,
                   tuple(d.get("nodes", ())))


def catastrophic_gain(target: Precision) -> float:
    """``1 / sqrt(u)`` of ``target`` (module docstring): 45.3 for FP16."""
    return 1.0 / math.sqrt(FORMATS[target].unit_roundoff)


def rounding_depth(model: onnx.ModelProto) -> int:
    """Nodes that round (not in ``NO_ROUNDING_OPS``) on the longest input-to-output path."""
    depth: dict[str, int] = {}
    for node in model.graph.node:  # ONNX graphs are topologically sorted
        d = max((depth.get(i, 0) for i in node.input if i), default=0)
        d += node.op_type not in NO_ROUNDING_OPS
        for o in node.output:
            depth[o] = d
    return max((depth.get(o.name, 0) for o in model.graph.output), default=0)


def defect_candidates(findings: Sequence[Finding], target: Precision) -> list[Finding]:
    """Main-group findings of a defect kind (module docstring), including catastrophic
    amplifiers (``accumulated-rounding`` with gain >= ``catastrophic_gain``)."""
    limit = catastrophic_gain(target)
    out = []
    for f in findings:
        if f.group != "main":
            continue
        gain = f.evidence.get("gain")
        if (f.kind in DEFECT_KINDS and f.severity == "error") or (
                f.kind == "accumulated-rounding" and isinstance(gain, (int, float))
                and gain >= limit):
            out.append(f)
    return out


def _g(x: float | None) -> str:
    """3 significant digits as every report writes them (``precision_doctor.numbers.fmt3``)."""
    return "n/a" if x is None else fmt3(x)


@dataclass(frozen=True)
class AssessmentInputs:
    """What :func:`assess` reads (gathered by ``diagnosis.diagnose``).

    Attributes:
        passed: The verdict.
        outputs: ``(name, rel_l2, tolerance rel_l2 or None, passed, nonfinite count)`` per
            compared output.
        target: Target precision.
        depth: ``rounding_depth`` of the model.
        findings: Ranked, grouped findings.
        decisions / flips: From ``diagnosis.decisions``.
        explained_share: Joint share of all findings' remedies (None: not measured).
        defect_share: Joint share of the defect candidates' remedies (None: not measured).
        measured: Whether impacts were measured (emulated candidate, failing verdict).
        max_gain: Largest finite local error gain and its node, or None.
        rewritten: The rewritten model's run (``DiagnosisReport.rewritten``) or None.
    """

    passed: bool
    outputs: tuple[tuple[str, float, float | None, bool, int], ...]
    target: Precision
    depth: int
    findings: tuple[Finding, ...] = ()
    decisions: tuple[DecisionSummary, ...] = ()
    flips: tuple[DecisionFlip, ...] = ()
    explained_share: float | None = None
    defect_share: float | None = None
    measured: bool = False
    max_gain: tuple[str, float] | None = None
    rewritten: dict | None = None


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
    rw_note, rw_remedy = _rewritten_note(x, ev)
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
    events = (f" The {len(flagged)} flagged event(s) explain only {x.defect_share:.1%} of it."
              if flagged and x.defect_share is not None else
              " Nothing overflows, flushes or turns NaN in a way that matters.")
    gain_text = (f"; the largest local error gain is {_g(x.max_gain[1])}x at {x.max_gain[0]} "
                 f"(catastrophic from {_g(catastrophic_gain(x.target))}x)"
                 if x.max_gain else "")
    summary = (f"Ordinary {x.target.value.upper()} rounding: worst rel L2 {_g(worst[1])} on "
               f"{worst[0]}" + (f" (tolerance {_g(worst[2])})" if worst[2] is not None else "")
               + f" against about {_g(expected)} expected from sqrt({x.depth}) x u over "
               f"{x.depth} rounded layers{gain_text}." + events + rw_note)
    remedy = rw_remedy or ("not a bug hunt: loosen the tolerance, judge by a task metric "
                           "(--metric), or let `precision-doctor fix` keep a few nodes in FP32")
    return Assessment("rounding", summary, ev, remedy, share)


def share_removed(baseline: float, after: float) -> float:
    """Share (0..1) of the ``baseline`` output error removed when a remedy leaves ``after``
    (an infinite baseline counts as fully removed when ``after`` is finite)."""
    if math.isinf(baseline):
        return 1.0 if math.isfinite(after) else 0.0
    return max(0.0, (baseline - after) / baseline) if baseline > 0 else 0.0


def _rewritten_note(x: AssessmentInputs, ev: dict) -> tuple[str, str]:
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
    remedy = top.remedy + ("; the safe rewrites alone also cure it: " + rw_remedy
                           if rw_remedy else "")
    return Assessment("defect", summary, ev, remedy, share, nodes)


def worst_rel_l2(x: AssessmentInputs) -> float:
    """The largest rel L2 error over the outputs (0.0 without outputs)."""
    return max((o[1] for o in x.outputs), default=0.0)


def _decision_flips(x: AssessmentInputs, ev: dict, share, rw_note: str, rw_remedy: str
                    ) -> Assessment | None:
    failing = {o[0] for o in x.outputs if not o[3]}
    hits = [d for d in x.decisions if d.output in failing and d.flips and d.positions
            and d.flip_error_share >= DECISION_MIN_SHARE and d.flips <= FEW_FLIPS * d.positions]
    if not hits:
        return None
    d = max(hits, key=lambda h: h.flip_error_share)
    mine = [f for f in x.flips if f.output == d.output]
    margins = ", ".join(_g(f.fp32_margin) for f in mine[:5])
    rel = next((o[1] for o in x.outputs if o[0] == d.output), None)
    ev.update(decision_output=d.output, flips=d.flips, positions=d.positions,
              flip_error_share=d.flip_error_share, rel_l2=rel,
              rel_l2_without_flips=d.rel_l2_without_flips, task_agreement=d.task_agreement,
              suggested_metric=d.suggested_metric)
    changed = [f for f in mine if f.task_changed]
    task = ""
    if d.task_agreement is not None:
        task = f"; {d.task_metric} agreement {d.task_agreement:.1%}"
    if mine and any(f.task_changed is not None for f in mine):
        task += f"; {len(changed)} of {len(mine)} listed flips change the task result"
    summary = (f"Decision flips: {d.flips} of {d.positions} decisions of {d.output} changed "
               f"(FP32 margins {margins}) and carry {d.flip_error_share:.1%} of its squared "
               f"error; without them rel L2 is {_g(d.rel_l2_without_flips)} (with them "
               f"{_g(rel)}){task}." + rw_note)
    remedy = rw_remedy or (
        f"judge the model by its task: --metric {d.suggested_metric} ({d.why})"
        if d.suggested_metric else "judge the model by its task metric (--metric)")
    return Assessment("decision-flips", summary, ev, remedy, share)


__all__ = ["Assessment", "AssessmentInputs", "KINDS", "assess", "catastrophic_gain",
           "defect_candidates", "rounding_depth"]
