"""The records of outputs whose shape changed and of the integer decisions behind them
(definitions: ``diagnosis.lengths.sites`` and ``diagnosis.lengths.measure``). Frozen, JSON
round trip."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from precision_doctor.jsonable import from_json_float, json_float

READINGS = ("near-tie", "damage", "destroyed", "unknown")


@dataclass(frozen=True)
class ShapeChange:
    """One output of one sample whose candidate shape differs from the reference's.

    Attributes:
        output: Output name.
        sample: The sample's name.
        reference / candidate: The two shapes.
    """

    output: str
    sample: str
    reference: tuple[int, ...]
    candidate: tuple[int, ...]

    def to_dict(self) -> dict:
        return {"output": self.output, "sample": self.sample,
                "reference": list(self.reference), "candidate": list(self.candidate)}

    @classmethod
    def from_dict(cls, d: Mapping) -> ShapeChange:
        return cls(d["output"], str(d["sample"]), tuple(d["reference"]), tuple(d["candidate"]))


@dataclass(frozen=True)
class DecisionChange:
    """How one integer decision site fared over all samples.

    Attributes:
        node / op / tensor / source / rounding / sets_shape: The site
            (``diagnosis.lengths.sites.DecisionSite``).
        samples: Samples compared.
        samples_changed: Samples whose decision tensor differs (in shape or in a value).
        positions: Decisions compared elementwise (samples whose tensor kept its shape).
        changed: Of those, the decisions that differ.
        up / down: Changed decisions that went up / down.
        max_step: Largest |candidate - reference| of a changed decision (integer units).
        total_ratio: Sum of the candidate's values over the reference's, all samples (for
            durations: how much longer the whole output is); None when not meaningful.
        boundary_ulps: Largest distance of a changed decision's FP32 source value from its
            rounding boundary, in units in the last place (ULP) of the target format there;
            None without a scalar boundary.
        typical_ulps: RMS error of the candidate's source value on the compared positions,
            in the same ULPs; None without a scalar boundary.
        nonfinite: NaN/Inf values in the candidate's source.
        reading: ``near-tie``, ``damage`` or ``destroyed`` (``measure`` module docstring).
        detail: One sentence for reports.
    """

    node: str
    op: str
    tensor: str
    source: str
    rounding: str
    sets_shape: bool
    samples: int
    samples_changed: int
    positions: int
    changed: int
    up: int
    down: int
    max_step: float | None
    total_ratio: float | None
    boundary_ulps: float | None
    typical_ulps: float | None
    nonfinite: int
    reading: str
    detail: str

    def to_dict(self) -> dict:
        return {k: json_float(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: Mapping) -> DecisionChange:
        return cls(**{f.name: _value(d.get(f.name)) for f in fields(cls)})


@dataclass(frozen=True)
class LengthReport:
    """Outputs of another shape, the integer decisions that changed, and the measured cure.

    Attributes:
        changes: Every (output, sample) whose shape changed.
        decisions: The decision sites whose integers changed, graph order.
        roots: Nodes of the first changed decisions: those whose input cone holds no other
            changed decision.
        reading: ``near-tie``, ``damage`` or ``destroyed`` (the worst root's), or
            ``unknown`` when no changed decision was found.
        summary: One or two sentences with the numbers, read first.
        cure_nodes: The roots' input cones: the nodes kept in FP32 by the measured cure.
        cure_rel_l2: Worst output rel L2 with ``cure_nodes`` in FP32 (inf: shapes still
            differ, or NaN/Inf from causes after the decisions); None when not measured (a
            real engine as the candidate).
        spectral: Output -> log-spectral distance in dB after DTW alignment
            (``compare.tasks.audio``) over its changed samples, for signal-like outputs.
        seconds: Wall time of the analysis.
        cure_restores: Whether the roots' integers are the reference's on every sample with
            ``cure_nodes`` in FP32; None when not measured.
    """

    changes: tuple[ShapeChange, ...]
    decisions: tuple[DecisionChange, ...]
    roots: tuple[str, ...]
    reading: str
    summary: str
    cure_nodes: tuple[str, ...] = ()
    cure_rel_l2: float | None = None
    spectral: Mapping[str, float] | None = None
    seconds: float = 0.0
    cure_restores: bool | None = None

    @property
    def cured(self) -> bool:
        """Whether the measured cure gives the reference's decisions (so lengths) back."""
        if self.cure_restores is not None:
            return self.cure_restores
        return self.cure_rel_l2 is not None and self.cure_rel_l2 != float("inf")

    def to_dict(self) -> dict:
        return {"changes": [c.to_dict() for c in self.changes],
                "decisions": [d.to_dict() for d in self.decisions],
                "roots": list(self.roots), "reading": self.reading, "summary": self.summary,
                "cure_nodes": list(self.cure_nodes), "cure_rel_l2": json_float(self.cure_rel_l2),
                "spectral": ({k: json_float(v) for k, v in self.spectral.items()}
                             if self.spectral is not None else None),
                "seconds": self.seconds, "cure_restores": self.cure_restores}

    @classmethod
    def from_dict(cls, d: Mapping) -> LengthReport:
        spectral = d.get("spectral")
        return cls(tuple(ShapeChange.from_dict(c) for c in d.get("changes", ())),
                   tuple(DecisionChange.from_dict(x) for x in d.get("decisions", ())),
                   tuple(d.get("roots", ())), d.get("reading", "unknown"), d.get("summary", ""),
                   tuple(d.get("cure_nodes", ())), _value(d.get("cure_rel_l2")),
                   {k: from_json_float(v) for k, v in spectral.items()}
                   if spectral is not None else None, float(d.get("seconds", 0.0)),
                   d.get("cure_restores"))


def _value(v: Any) -> Any:
    """A JSON number field back (``"inf"``/``"-inf"``/``"nan"`` -> float; others unchanged)."""
    return from_json_float(v) if v in ("inf", "-inf", "nan") else v


__all__ = ["DecisionChange", "LengthReport", "READINGS", "ShapeChange"]
