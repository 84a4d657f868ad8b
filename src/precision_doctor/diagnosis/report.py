"""The diagnosis result: a frozen, versioned record that round-trips through JSON.

JSON schema (``schema`` = ``precision-doctor/diagnosis``, ``schema_version`` = 3):

    {
      "schema": "precision-doctor/diagnosis", "schema_version": 3, "tool_version": "0.1.0",
      "verdict": "pass" | "fail",
      "assessment": {"kind": "within-tolerance" | "rounding" | "decision-flips" | "defect"
                             | "unexplained",
                     "summary", "evidence": {name: scalar}, "remedy", "explained_share",
                     "nodes": [str]} | null,
      "explained_share": float | null,
      "decision_flips": [{"output", "sample", "position": [int], "fp32_margin", "fp32_noise",
                          "task_changed", "error_share", "fp32_top": [int, int],
                          "candidate_top", "detail",
                          "reading": "near-tie" | "task-neutral" | "damage"}],
      "decisions": [{"output", "kind", "axis", "positions", "flips", "argmax_agreement",
                     "task_agreement", "task_metric", "suggested_metric", "why",
                     "rel_l2_without_flips", "flip_error_share", "near_ties",
                     "task_neutral", "damage", "typical_error", "damage_margin",
                     "destroyed"}],
      "rewritten": {"rewrites": [str], "outputs": [<output>], "verdict"} | null,
      "model": {"path", "opset", "nodes", "sha256",
                "shipped_precision", "reference"},   (the last two only for a model shipped in
                FP16/BF16: "fp16" | "bf16" | "mixed", and the sentence saying its reference is
                its FP32 upcast, ``graph.upcast``)
      "target": "fp16", "reference": "ort-cpu", "candidate": "emulate-fp16",
      "samples": [{"name", "shapes": {input: [dims]}}],
      "outputs": [{"name", "passed", "reason", "tolerance": {...}, "metrics": {...},
                   "noise_floor", "noise_multiple"}],
      "noise": {"per_output", "probes", "skipped"} | null,
      "findings": [{"kind", "node", "op_type", "tensor", "summary", "evidence", "remedy",
                    "severity", "nodes", "impact", "group": "main" | "minor",
                    "not_measured": str,
                    "source": {"file", "line", "code", "module"} | null}],
                    (``source``: the Python line and module path the node was exported
                    from, ``graph.source``; ``not_measured``: why ``impact`` is null, ""
                    when it is not; ``evidence.residual_share`` / ``residual_before`` /
                    ``residual_after``: what the finding removes of the error a joint cause's
                    cure leaves, ``diagnosis.causes.joint.residual_shares``)
      "hazards": [{"kind", "node", "op_type", "tensor", "detail", "severity", "nodes", "evidence"}],
      "layerwise": {"target", "threshold", "first_divergence", "largest_jump", "nan_birth",
                    "chunks",
                    "missing", "records": [{"tensor", "node", "op_type", "index", "numel",
                    "ref_max_abs", "cand_max_abs", "max_abs_err", "mean_abs_err", "rel_l2",
                    "cand_nan", "cand_inf", "ref_nonfinite", "overflow", "flush_to_zero",
                    "subnormal", "lost_to_zero", "headroom_bits", "source"}]} | null,
      "emulation": {"default", "fp32_nodes", "rounding", "conv_bias"} | null,
      "timings_s": {stage: seconds}, "warnings": [str],
      "recording": null | {"statement", "source", "format", "runner", "engine",
                  "tensorrt_version", "iterations", "tensors", "notes", "recorded_tensors",
                  "matched_tensors", "missing": {tensor: reason}, "missing_by_reason",
                  "unmatched", "cross_check": {"emulator", "fp32_nodes", "outputs", "layers",
                  "worse_than_emulated"} | null}   (``layerwise.recording.recording_section``)
      "transformer": {"layernorms", "attention", "blocks", "statistics", "stress"} | null,
      "attribution": {"status": "found" | "spread" | "none", "nodes": [str],
                      "clusters": [[str]], "samples": [int], "evaluations", "seconds",
                      "small_limit", "kept_size"} | null,
      "joint_cause": {"members": [{"kind", "node", "source"}], "nodes": [str], "share",
                      "alone": [float],
                      "evaluations", "minimal"}   (only when findings cure the error only
                      together: ``diagnosis.causes.joint``)
      "finding_groups": [{"kind", "op_type", "pattern", "blocks": [int], "members": [node],
                          "magnitude": [min, max] | null, "impact", "remedy", "severity",
                          "group", "joint", "not_measured"}]   (only when some findings repeat
                      per block or region or form a joint cause: ``diagnosis.causes.groups``;
                      the members stay in ``findings``; ``not_measured`` only when the impact
                      is null and a reason is known)
      "lengths": {"changes": [{"output", "sample", "reference": [dims],
                               "candidate": [dims]}],
                  "decisions": [{"node", "op", "tensor", "source", "rounding", "sets_shape",
                                 "samples", "samples_changed", "positions", "changed", "up",
                                 "down", "max_step", "total_ratio", "boundary_ulps",
                                 "typical_ulps", "nonfinite",
                                 "reading": "near-tie" | "damage" | "destroyed", "detail",
                                 "origin"}],
                  "roots": [node], "reading", "summary", "cure_nodes": [node],
                  "cure_rel_l2", "cure_restores", "spectral": {output: dB} | null,
                  "seconds"}   (only when an output came out in another shape than the
                  reference's: ``diagnosis.lengths``; such an output's ``metrics`` count
                  ``shape_changed`` samples, left out of its statistics, and its ``rel_l2``
                  is inf)
    }

``source`` on a layerwise record and a joint cause's member, and ``origin`` on a length
decision (its ``source`` is the float tensor it rounds), is the finding's ``source`` object
(``{"file", "line", "code", "module"}`` or null), present when the model carries the PyTorch
exporter's metadata or TorchScript node names (``graph.source``).

Finding kinds: the range events and amplifiers of ``diagnosis.causes.findings`` and the
mechanisms of ``diagnosis.causes.mechanisms`` (``cancellation``, ``small-divisor``,
``exponent-amplification``, ``saturation``, ``long-reduction``, ``tf32``,
``unnamed-mechanism``).

``transformer``: per-block FP16 headroom of a model with LayerNorms or attention
(``diagnosis.headroom.records.TransformerReport.to_dict``; ``stress`` from
``diagnosis.headroom.stress``).

Non-finite floats are written as the strings "inf", "-inf", "nan" (JSON has no such numbers).

Version 2 (this version) added ``assessment`` (rules in ``diagnosis.assessment``),
``explained_share``, ``decision_flips`` and ``decisions`` (``diagnosis.decisions.reading``),
``rewritten`` (the emulation of the model after the safe rewrites an engine applies anyway),
each finding's ``group`` and ``layerwise.largest_jump`` (the first divergence by error jump,
``layerwise.gain.largest_jump``; ``first_divergence`` stays the first tolerance crossing).
Version 3 added the ``unexplained`` assessment, the mechanism finding kinds, ``attribution``
(``diagnosis.causes.attribution``), each flip's ``reading`` and the decisions' reading counts;
``rel_l2_without_flips`` is now relative to the whole output's norm.
``from_dict`` reads versions 1 to 3; a version-1 report has no assessment (None).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from precision_doctor import __version__
from precision_doctor.compare.metrics import OutputMetrics
from precision_doctor.compare.tolerance import Tolerance
from precision_doctor.diagnosis.assessment import Assessment
from precision_doctor.diagnosis.causes.findings import Finding
from precision_doctor.diagnosis.causes.groups import FindingGroup
from precision_doctor.diagnosis.causes.hazards import Hazard
from precision_doctor.diagnosis.decisions.records import DecisionFlip, DecisionSummary
from precision_doctor.diagnosis.lengths.records import LengthReport
from precision_doctor.diagnosis.noise import NoiseFloor
from precision_doctor.graph.source import Source
from precision_doctor.jsonable import from_json_float, json_float
from precision_doctor.layerwise.compare import LayerwiseResult

SCHEMA = "precision-doctor/diagnosis"
SCHEMA_VERSION = 3


@dataclass(frozen=True)
class OutputResult:
    """Verdict and statistics of one model output.

    Attributes:
        name: Output name.
        passed: Whether it meets its tolerance.
        reason: Why (the violated bound with numbers, or the bound met).
        tolerance: The bound applied.
        metrics: Error statistics over all samples.
        noise_floor: FP32 noise floor (relative L2), None if not measured.
        noise_multiple: metrics.rel_l2 / noise_floor (None if not measured or floor is 0).
    """

    name: str
    passed: bool
    reason: str
    tolerance: Tolerance
    metrics: OutputMetrics
    noise_floor: float | None = None
    noise_multiple: float | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "passed": self.passed, "reason": self.reason,
                "tolerance": self.tolerance.to_dict(), "metrics": self.metrics.to_dict(),
                "noise_floor": json_float(self.noise_floor) if self.noise_floor is not None
                else None,
                "noise_multiple": json_float(self.noise_multiple)
                if self.noise_multiple is not None else None}

    @classmethod
    def from_dict(cls, d: Mapping) -> OutputResult:
        nf, nm = d.get("noise_floor"), d.get("noise_multiple")
        return cls(d["name"], d["passed"], d["reason"], Tolerance.from_dict(d["tolerance"]),
                   OutputMetrics.from_dict(d["metrics"]),
                   from_json_float(nf) if nf is not None else None,
                   from_json_float(nm) if nm is not None else None)


@dataclass(frozen=True)
class DiagnosisReport:
    """Everything ``diagnose`` found. See the module docstring for the JSON layout.

    Attributes:
        verdict: ``pass`` when every output meets its tolerance, else ``fail``.
        model: ``{"path", "opset", "nodes", "sha256"}`` of the diagnosed model; for a model
            shipped in FP16/BF16 also ``shipped_precision`` (``fp16``/``bf16``/``mixed``) and
            ``reference`` (the headline sentence: the reference is its FP32 upcast).
        target: The precision diagnosed (``fp16``, ``bf16``, ``tf32``, ``fp32``).
        reference: The reference runner's name (``ort-cpu``: ONNX Runtime CPU in FP32).
        candidate: The candidate runner's name (``emulate-fp16``, ``ort-cuda`` ...).
        samples: ``{"name", "shapes": {input: [dims]}}`` per sample, in order.
        outputs: Verdict, tolerance, metrics and FP32 noise multiple of each output.
        findings: Root causes with evidence, remedy and measured impact, ranked by impact.
        hazards: The static scan: parameters out of range, risky ops, decomposed LayerNorms.
        layerwise: Every intermediate tensor compared (None with ``layerwise=False``).
        noise: The FP32 noise floor per output (None with ``noise=False``).
        emulation: What the emulator ran: its plan's FP32 nodes and settings (None for a
            real engine).
        timings_s: Wall time per stage, seconds.
        warnings: What the user should know (assumptions, fallbacks, skipped probes).
        tool_version: The precision-doctor version that wrote the report.
        assessment: Which kind of result this is, with its evidence and remedy
            (``diagnosis.assessment``; None in a version-1 report).
        explained_share: Share of the output error that disappears when every finding's
            remedy is applied at once (None when not measured).
        decision_flips: Decisions (argmax, thresholded maps, decoded text) the candidate
            flipped, with their FP32 margins.
        decisions: Per decision output: agreement, flips and the ``--metric`` that ``fix``
            should target.
        rewritten: The emulation of the model after the safe rewrites an engine applies
            anyway (``{"rewrites", "outputs", "verdict"}``), or None.
        largest_jump: The tensor whose local error gain is largest (the first divergence by
            error jump), or None.
        recording: With a recorded candidate (``candidate_results``): who recorded it, what
            is missing, and the emulated vs recorded cross-check; else None.
        transformer: Per-block FP16 headroom of LayerNorms and attention
            (``diagnosis.headroom.records.TransformerReport.to_dict``), or None.
        finding_groups: Findings repeated per block (and the joint cause) as groups
            (``diagnosis.causes.groups``); the members stay in ``findings``.
        lengths: Outputs that came out in another shape than the reference's, the integer
            decisions that changed them and their measured cure (``diagnosis.lengths``);
            None when every output kept its shape.
        sources: Node -> the Python line and module it was exported from
            (``graph.source``) for the nodes of the findings, the joint cause, the layerwise
            records and the length decisions; empty when the model carries no exporter
            metadata. In the JSON it is a ``source`` on each such record (``origin`` on a
            length decision, whose ``source`` is its float input tensor).
    """

    verdict: str
    model: dict
    target: str
    reference: str
    candidate: str
    samples: tuple[dict, ...]
    outputs: tuple[OutputResult, ...]
    findings: tuple[Finding, ...]
    hazards: tuple[Hazard, ...]
    layerwise: LayerwiseResult | None = None
    noise: NoiseFloor | None = None
    emulation: dict | None = None
    timings_s: dict = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    tool_version: str = __version__
    assessment: Assessment | None = None
    explained_share: float | None = None
    decision_flips: tuple[DecisionFlip, ...] = ()
    decisions: tuple[DecisionSummary, ...] = ()
    rewritten: dict | None = None
    largest_jump: str | None = None
    recording: dict | None = None  # recorded candidate: runner, version, cross-check
    transformer: dict | None = None  # diagnosis.headroom.records.TransformerReport.to_dict()
    attribution: dict | None = None  # diagnosis.causes.attribution.Attribution.to_dict()
    joint_cause: dict | None = None  # diagnosis.causes.joint.JointCause.to_dict()
    finding_groups: tuple[FindingGroup, ...] = ()
    lengths: LengthReport | None = None
    sources: Mapping[str, Source] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """Whether every output meets its tolerance (``verdict == "pass"``)."""
        return self.verdict == "pass"

    def to_dict(self) -> dict:
        """The JSON report (``schema`` = ``precision-doctor/diagnosis``; module docstring)."""
        return {
            "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "tool_version": self.tool_version,
            "verdict": self.verdict, "model": dict(self.model), "target": self.target,
            "reference": self.reference, "candidate": self.candidate,
            "samples": [dict(s) for s in self.samples],
            "outputs": [o.to_dict() for o in self.outputs],
            "noise": self.noise.to_dict() if self.noise else None,
            "findings": [f.to_dict() for f in self.findings],
            "hazards": [h.to_dict() for h in self.hazards],
            "layerwise": ({**self.layerwise.to_dict(), "largest_jump": self.largest_jump,
                           "records": _placed([r.to_dict() for r in self.layerwise.records],
                                              self.sources)}
                          if self.layerwise else None),
            "emulation": self.emulation, "timings_s": dict(self.timings_s),
            "warnings": list(self.warnings),
            "assessment": self.assessment.to_dict() if self.assessment else None,
            "explained_share": json_float(self.explained_share),
            "decision_flips": [f.to_dict() for f in self.decision_flips],
            "decisions": [d.to_dict() for d in self.decisions],
            "rewritten": self.rewritten,
            "recording": self.recording,
            "transformer": self.transformer,
            "attribution": self.attribution,
            **({"joint_cause": {**self.joint_cause, "members": _placed(
                self.joint_cause.get("members", []), self.sources)}}
               if self.joint_cause is not None else {}),
            **({"finding_groups": [g.to_dict() for g in self.finding_groups]}
               if self.finding_groups else {}),
            **({"lengths": {**(lengths := self.lengths.to_dict()), "decisions": _placed(
                lengths["decisions"], self.sources, "origin")}}
               if self.lengths is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> DiagnosisReport:
        """Inverse of ``to_dict``.

        Raises:
            ValueError: Not a precision-doctor diagnosis, or a newer schema version.
        """
        if d.get("schema") != SCHEMA:
            raise ValueError(f"not a precision-doctor diagnosis (schema={d.get('schema')!r})")
        if int(d.get("schema_version", 0)) > SCHEMA_VERSION:
            raise ValueError(f"diagnosis schema {d['schema_version']} is newer than this tool "
                             f"understands ({SCHEMA_VERSION}); upgrade precision-doctor")
        layerwise = d.get("layerwise")
        if layerwise:
            layerwise = {**layerwise, "records": [{k: v for k, v in r.items() if k != "source"}
                                                  for r in layerwise["records"]]}
        return cls(
            d["verdict"], dict(d["model"]), d["target"], d["reference"], d["candidate"],
            tuple(d.get("samples", ())), tuple(OutputResult.from_dict(o) for o in d["outputs"]),
            tuple(Finding.from_dict(f) for f in d.get("findings", ())),
            tuple(Hazard.from_dict(h) for h in d.get("hazards", ())),
            LayerwiseResult.from_dict(layerwise) if layerwise else None,
            NoiseFloor.from_dict(d["noise"]) if d.get("noise") else None,
            d.get("emulation"), dict(d.get("timings_s", {})), tuple(d.get("warnings", ())),
            d.get("tool_version", __version__),
            Assessment.from_dict(d["assessment"]) if d.get("assessment") else None,
            from_json_float(share) if (share := d.get("explained_share")) is not None else None,
            tuple(DecisionFlip.from_dict(f) for f in d.get("decision_flips", ())),
            tuple(DecisionSummary.from_dict(x) for x in d.get("decisions", ())),
            d.get("rewritten"), (d.get("layerwise") or {}).get("largest_jump"),
            recording=d.get("recording"), transformer=d.get("transformer"),
            attribution=d.get("attribution"), joint_cause=d.get("joint_cause"),
            finding_groups=tuple(FindingGroup.from_dict(g)
                                 for g in d.get("finding_groups", ())),
            lengths=LengthReport.from_dict(d["lengths"]) if d.get("lengths") else None,
            sources=_read_sources(d))


def _placed(rows: list[dict], sources: Mapping[str, Source], key: str = "source"
            ) -> list[dict]:
    """``rows`` (records with a ``node``) each with ``key``: its node's source as a dict, or
    None; unchanged when no node of the model has a source."""
    if not sources:
        return rows
    return [{**r, key: sources[r["node"]].to_dict() if r.get("node") in sources else None}
            for r in rows]


def _read_sources(d: Mapping) -> dict[str, Source]:
    """Node -> ``Source`` of the ``source``/``origin`` objects of a JSON report's records."""
    rows = [(r, "source") for r in (d.get("layerwise") or {}).get("records", ())]
    rows += [(r, "source") for r in (d.get("joint_cause") or {}).get("members", ())]
    rows += [(r, "origin") for r in (d.get("lengths") or {}).get("decisions", ())]
    rows += [(f, "source") for f in d.get("findings", ())]
    return {r["node"]: Source.from_dict(r[key]) for r, key in rows
            if isinstance(r.get(key), Mapping) and r.get("node")}
