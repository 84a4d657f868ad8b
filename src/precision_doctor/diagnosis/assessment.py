"""The assessment: which kind of failure this is, read first, beside the pass/fail verdict.

Kinds and rules (applied in this order; the exit code stays tied to the verdict). A cause is
established by a measured cure: keeping named nodes in FP32 (or a numerically safe rewrite)
removes the error in an emulated evaluation; a pattern only names it.

``within-tolerance``
    Every output meets its tolerance. Nothing to do.
``defect``
    A concrete cause that FP32 for a few named nodes (or a numerically safe rewrite) cures: a
    range event (a parameter out of range, an activation that overflowed, a NaN/Inf birth, a
    harmful flush-to-zero), a mechanism of the taxonomy (``diagnosis.causes.mechanisms``:
    periodic argument, cancellation, small divisor, exponent amplification, saturation, long
    reduction, TF32), an
    unnamed mechanism found by attribution (``diagnosis.causes.attribution``), or a *catastrophic
    amplifier*. Rule: keeping the nodes of the main-group findings of those kinds in FP32,
    jointly, removes at least ``DEFECT_MIN_SHARE`` (50%) of the worst output's error. When
    impact cannot be measured (a real engine as candidate), only a hard event counts: NaN/Inf
    in an output, or an overflow / NaN/Inf birth inside the model together with an output that
    lost at least half of the format's significant bits (worst rel L2 >= sqrt(u)).
``decision-flips``
    Near-ties: on a failing decision output, the flipped positions carry at least
    ``DECISION_MIN_SHARE`` (50%) of the squared error, are at most ``FEW_FLIPS`` (5%) of its
    decisions, and every flip is a near-tie (FP32 margin within 3x the output's typical error)
    or leaves the task result unchanged (``diagnosis.decisions.reading``). A flip at a margin far
    above the FP32 noise and the error elsewhere is damage, never a near-tie.
``rounding``
    The error is the accumulation of the format's rounding, and that is measured, not assumed:
    the worst error is within ``ROUNDING_FACTOR`` (10x) of the expectation and no decision is
    damaged. For ``D`` rounded layers on the longest path, independent relative rounding
    errors of size ``u`` (unit roundoff, 2^-11 for FP16, 2^-8 for BF16) add up like a random
    walk to about ``sqrt(D) * u`` (the probabilistic bound of Higham & Mary, "A new approach to
    probabilistic rounding error analysis", SIAM J. Sci. Comput. 2019); the factor 10 allows
    for the bound's constant (about 3 at 99% probability) and a well-conditioned model's
    gains of 1 to ~3. No catastrophic amplifier's FP32 fallback cures the output (it would be
    a ``defect``).
``unexplained``
    Otherwise: the error is beyond 10x what rounding explains, or decisions are damaged, and
    no small set of nodes in FP32 removes most of it (the attribution search says what it
    tried). Never "loosen the tolerance": judge by the task and let ``fix`` search.

Catastrophic amplifier: a node whose local error gain is at least ``1/sqrt(u)`` (45 for FP16,
16 for BF16). Such a step destroys half of the format's significant bits at once: an input
rounded to ``u`` leaves it with an error of at least ``sqrt(u)`` (2.2e-2 for FP16), above the
default FP16 tolerance of 1e-2 by itself. Well-conditioned ops have gains of 1 to ~10.

Random inputs: when any input is synthetic (``random:``), every summary says that the verdict
holds for random data only and the remedy points to real samples (the first field report
measured FP16 errors on random inputs far above those on real images).

``explained_share`` is the share of the worst output's error that disappears when all findings'
remedies are applied together (their nodes in FP32) in one emulated evaluation; the rest is
stated as unexplained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import onnx

from precision_doctor.diagnosis.causes.findings import Finding
from precision_doctor.diagnosis.decisions.records import DecisionFlip, DecisionSummary
from precision_doctor.diagnosis.lengths.records import LengthReport
from precision_doctor.formats import FORMATS, Precision
from precision_doctor.jsonable import from_json_float, json_float
from precision_doctor.numbers import fmt3

DEFECT_MIN_SHARE = 0.5
DECISION_MIN_SHARE = 0.5
FEW_FLIPS = 0.05
ROUNDING_FACTOR = 10.0
HARD_KINDS = ("parameter-out-of-range", "activation-overflow", "nan-source")
DEFECT_KINDS = (*HARD_KINDS, "underflow")
# The taxonomy of ``diagnosis.causes.mechanisms``: a defect when its measured cure is in the
# main group.
MECHANISM_KINDS = ("periodic-argument", "cancellation", "small-divisor",
                   "exponent-amplification", "saturation", "long-reduction", "tf32",
                   "unnamed-mechanism")
# Ops that move or reshape data without arithmetic (no rounding): not counted in the depth.
NO_ROUNDING_OPS = frozenset({
    "Constant", "Identity", "Shape", "Size", "Reshape", "Transpose", "Squeeze", "Unsqueeze",
    "Flatten", "Concat", "Split", "Slice", "Gather", "GatherElements", "GatherND", "Expand",
    "Tile", "Pad", "Cast", "CastLike", "ConstantOfShape", "Range", "DepthToSpace",
    "SpaceToDepth", "Relu", "MaxPool", "Max", "Min", "Clip", "Where", "Equal", "Greater",
    "Less", "Not", "And", "Or", "ArgMax", "ArgMin", "NonZero", "TopK"})
KINDS = ("within-tolerance", "rounding", "decision-flips", "defect", "unexplained")


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
    """Main-group findings of a defect kind (module docstring): range events (of severity
    error, or whose own measured cure removes at least ``DEFECT_MIN_SHARE`` of the error: a
    graph output of x * 1e-9, flushed to zero in FP16, is a warning by the static rule and
    fully cured in FP32, found by tests/fuzz), mechanisms of the taxonomy whose cure was
    measured, and catastrophic amplifiers (``accumulated-rounding`` with gain >=
    ``catastrophic_gain``). A member of a joint cause (``diagnosis.causes.joint``: its cure
    measured jointly with the others) counts whatever its kind and severity."""
    limit = catastrophic_gain(target)
    out = []
    for f in findings:
        if f.group != "main":
            continue
        gain = f.evidence.get("gain")
        cured = f.impact is not None and f.impact >= DEFECT_MIN_SHARE
        if (f.kind in DEFECT_KINDS and (f.severity == "error" or cured)) \
                or "joint_cause" in f.evidence \
                or (f.kind in MECHANISM_KINDS and f.impact is not None) or (
                f.kind in ("accumulated-rounding", *MECHANISM_KINDS)
                and isinstance(gain, (int, float)) and gain >= limit):
            out.append(f)
    return out


def decisions_explain(decisions: Sequence[DecisionSummary], failing: Mapping[str, float]
                      ) -> bool:
    """Whether benign flips (near-ties, task-neutral; none damaged) on a failing decision
    output carry most of its error (``decision-flips``, module docstring)."""
    return any(benign_hit(d, failing) for d in decisions)


def benign_hit(d: DecisionSummary, failing) -> bool:
    return (d.output in failing and d.flips > 0 and d.positions > 0 and d.benign
            and d.flip_error_share >= DECISION_MIN_SHARE and d.flips <= FEW_FLIPS * d.positions)


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
        decisions / flips: From ``diagnosis.decisions.reading``.
        explained_share: Joint share of all findings' remedies (None: not measured).
        defect_share: Joint share of the defect candidates' remedies (None: not measured).
        measured: Whether impacts were measured (emulated candidate, failing verdict).
        max_gain: Largest finite local error gain and its node, or None.
        rewritten: The rewritten model's run (``DiagnosisReport.rewritten``) or None.
        synthetic: Some input is random data (``random:``).
        attribution: ``diagnosis.causes.attribution.Attribution.to_dict()`` when it ran, else None.
        lengths: The length report when an output changed shape (``diagnosis.lengths``).
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
    synthetic: bool = False
    attribution: dict | None = None
    lengths: LengthReport | None = None


def share_removed(baseline: float, after: float) -> float:
    """Share (0..1) of the ``baseline`` output error removed when a remedy leaves ``after``
    (an infinite baseline counts as fully removed when ``after`` is finite)."""
    if math.isinf(baseline):
        return 1.0 if math.isfinite(after) else 0.0
    return max(0.0, (baseline - after) / baseline) if baseline > 0 else 0.0



def worst_rel_l2(x: AssessmentInputs) -> float:
    """The largest rel L2 error over the outputs (0.0 without outputs)."""
    return max((o[1] for o in x.outputs), default=0.0)


__all__ = ["Assessment", "AssessmentInputs", "KINDS", "ROUNDING_FACTOR", "benign_hit",
           "catastrophic_gain", "decisions_explain", "defect_candidates", "rounding_depth"]
