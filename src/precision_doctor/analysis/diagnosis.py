"""The diagnosis result: a frozen, versioned record that round-trips through JSON.

JSON schema (``schema`` = ``precision-doctor/diagnosis``, ``schema_version`` = 1)::

    {
      "schema": "precision-doctor/diagnosis", "schema_version": 1, "tool_version": "0.1.0",
      "verdict": "pass" | "fail",
      "model": {"path", "opset", "nodes", "sha256"},
      "target": "fp16", "reference": "ort-cpu", "candidate": "emulate-fp16",
      "samples": [{"name", "shapes": {input: [dims]}}],
      "outputs": [{"name", "passed", "reason", "tolerance": {...}, "metrics": {...},
                   "noise_floor", "noise_multiple"}],
      "noise": {"per_output", "probes", "skipped"} | null,
      "findings": [{"kind", "node", "op_type", "tensor", "summary", "evidence", "remedy",
                    "severity", "nodes", "impact"}],
      "hazards": [{"kind", "node", "op_type", "tensor", "detail", "severity", "nodes", "evidence"}],
      "layerwise": {"target", "threshold", "first_divergence", "nan_birth", "chunks",
                    "missing", "records": [{"tensor", "node", "op_type", "index", "numel",
                    "ref_max_abs", "cand_max_abs", "max_abs_err", "mean_abs_err", "rel_l2",
                    "cand_nan", "cand_inf", "ref_nonfinite", "overflow", "flush_to_zero",
                    "subnormal", "lost_to_zero", "headroom_bits"}]} | null,
      "emulation": {...} | null, "timings_s": {stage: seconds}, "warnings": [str],
      "transformer": {"layernorms", "attention", "blocks", "statistics", "stress"} | null
    }

``transformer``: per-block FP16 headroom of a model with LayerNorms or attention
(``analysis.transformer.TransformerReport.to_dict``; ``stress`` from ``analysis.stress``).

Non-finite floats are written as the strings "inf", "-inf", "nan" (JSON has no such numbers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from precision_doctor import __version__
from precision_doctor.analysis.hazards import Hazard
from precision_doctor.analysis.layerwise import LayerwiseResult
from precision_doctor.analysis.noise import NoiseFloor
from precision_doctor.analysis.rootcause import Finding
from precision_doctor.compare.metrics import OutputMetrics
from precision_doctor.compare.tolerance import Tolerance
from precision_doctor.jsonable import from_json_float, json_float

SCHEMA = "precision-doctor/diagnosis"
SCHEMA_VERSION = 1


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
    """Everything ``diagnose`` found. See the module docstring for the JSON layout."""

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
    transformer: dict | None = None  # analysis.transformer.TransformerReport.to_dict()

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "tool_version": self.tool_version,
            "verdict": self.verdict, "model": dict(self.model), "target": self.target,
            "reference": self.reference, "candidate": self.candidate,
            "samples": [dict(s) for s in self.samples],
            "outputs": [o.to_dict() for o in self.outputs],
            "noise": self.noise.to_dict() if self.noise else None,
            "findings": [f.to_dict() for f in self.findings],
            "hazards": [h.to_dict() for h in self.hazards],
            "layerwise": self.layerwise.to_dict() if self.layerwise else None,
            "emulation": self.emulation, "timings_s": dict(self.timings_s),
            "warnings": list(self.warnings),
            "transformer": self.transformer,
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
        return cls(
            d["verdict"], dict(d["model"]), d["target"], d["reference"], d["candidate"],
            tuple(d.get("samples", ())), tuple(OutputResult.from_dict(o) for o in d["outputs"]),
            tuple(Finding.from_dict(f) for f in d.get("findings", ())),
            tuple(Hazard.from_dict(h) for h in d.get("hazards", ())),
            LayerwiseResult.from_dict(d["layerwise"]) if d.get("layerwise") else None,
            NoiseFloor.from_dict(d["noise"]) if d.get("noise") else None,
            d.get("emulation"), dict(d.get("timings_s", {})), tuple(d.get("warnings", ())),
            d.get("tool_version", __version__), d.get("transformer"))
