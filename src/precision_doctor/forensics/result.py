"""Results of preprocessing forensics: frozen dataclasses that round-trip through JSON.

A ``ForensicsResult`` lists ``InputFinding`` objects, most important first (``KIND_ORDER``:
structural differences before value differences before resampling details), the transform that
maps tensor A onto tensor B as far as it was explained, and the residual that is left, so the
reader knows whether the explanation is complete.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from precision_doctor.errors import DataFormatError

# Finding kinds, in report order: a layout difference must be undone before values can be
# compared; value maps (channel order, scale, normalization) before spatial resampling details.
KIND_ORDER = ("layout", "channel-order", "scale", "normalization", "resize", "padding",
              "crop-offset", "interpolation", "dtype", "unexplained")
RESULT_SCHEMA_VERSION = 1


def _json_value(value: Any) -> Any:
    """Non-finite floats as strings (``"inf"``, ``"nan"``), containers recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return value


def _float(value: Any) -> float:
    return float(value) if not isinstance(value, str) else float(value.strip())


@dataclass(frozen=True)
class InputFinding:
    """One named difference between the two inputs.

    Attributes:
        kind: One of ``KIND_ORDER``.
        summary: One human-readable sentence naming the mismatch (e.g. "channel order is
            reversed (RGB vs BGR)").
        evidence: The numbers behind it (JSON-ready; floats, ints, strings, lists).
        confidence: In [0, 1]: how strongly the evidence supports the finding (1 = read off
            the shapes/dtypes; lower for statistical tests).
    """

    kind: str
    summary: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    confidence: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in KIND_ORDER:
            raise ValueError(f"unknown finding kind {self.kind!r}; known: {KIND_ORDER}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; ``from_dict`` reads it back."""
        return {"kind": self.kind, "summary": self.summary,
                "evidence": _json_value(dict(self.evidence)),
                "confidence": round(float(self.confidence), 4)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InputFinding:
        """Inverse of ``to_dict``.

        Raises:
            DataFormatError: Missing keys or an unknown kind.
        """
        try:
            return cls(str(data["kind"]), str(data["summary"]), dict(data.get("evidence", {})),
                       _float(data.get("confidence", 1.0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise DataFormatError(f"malformed input finding {dict(data)!r}: {exc}") from exc


def sort_findings(findings: Sequence[InputFinding]) -> tuple[InputFinding, ...]:
    """Confident findings (>= 0.5) first, each group in ``KIND_ORDER``; stable otherwise."""
    return tuple(sorted(findings, key=lambda f: (f.confidence < 0.5, KIND_ORDER.index(f.kind))))


@dataclass(frozen=True)
class ForensicsResult:
    """What differs between two input tensors meant to be the same sample.

    Attributes:
        a_desc: Where tensor A came from, with its shape and dtype (e.g. ``"crop.png with
            ppocr-rec -> float32 [1, 3, 48, 320]"``).
        b_desc: Same for tensor B.
        findings: Named differences, most important first (``sort_findings``).
        transform: The estimated map from A to B: ``layout`` (axes permutation applied to A),
            ``channel_permutation`` (B channel c = A channel p[c]), ``scale`` / ``offset``
            (per B channel: B = A * scale + offset), ``shift_px`` ((dy, dx): B[y, x] =
            A[y + dy, x + dx]), ``resampled`` (how sizes were matched), ``difference_rel_l2``
            (before any explanation, when shapes allow) and ``residual_rel_std`` (residual
            relative to B's standard deviation).
        residual_rel_l2: ||T(A) - B|| / ||B|| over the compared region after the estimated
            transform T; near 0 means the findings explain the whole difference.
        output_effect: With a model: how far B moves the outputs compared with the precision
            target's effect (see ``precision_doctor.forensics.effect``); None without a model.
    """

    a_desc: str
    b_desc: str
    findings: tuple[InputFinding, ...] = ()
    transform: Mapping[str, Any] = field(default_factory=dict)
    residual_rel_l2: float = 0.0
    output_effect: Mapping[str, Any] | None = None

    @property
    def top(self) -> InputFinding | None:
        """The most important finding, or None when the inputs match."""
        return self.findings[0] if self.findings else None

    def kinds(self) -> list[str]:
        """Finding kinds in report order."""
        return [f.kind for f in self.findings]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (stable key order); ``from_dict`` reads it back."""
        return {
            "schema_version": RESULT_SCHEMA_VERSION,
            "a": self.a_desc,
            "b": self.b_desc,
            "findings": [f.to_dict() for f in self.findings],
            "transform": _json_value(dict(self.transform)),
            "residual_rel_l2": _json_value(float(self.residual_rel_l2)),
            "output_effect": None if self.output_effect is None
            else _json_value(dict(self.output_effect)),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ForensicsResult:
        """Inverse of ``to_dict``.

        Raises:
            DataFormatError: Missing keys or malformed findings.
        """
        try:
            effect = data.get("output_effect")
            return cls(
                a_desc=str(data["a"]), b_desc=str(data["b"]),
                findings=tuple(InputFinding.from_dict(f) for f in data.get("findings", [])),
                transform=dict(data.get("transform", {})),
                residual_rel_l2=_float(data.get("residual_rel_l2", 0.0)),
                output_effect=None if effect is None else dict(effect))
        except (KeyError, TypeError, ValueError) as exc:
            raise DataFormatError(f"malformed forensics result: {exc}") from exc
