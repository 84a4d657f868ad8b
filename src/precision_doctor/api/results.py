"""The public result types: the library's frozen records with JSON, HTML and notebook views.

``Diagnosis``, ``Audit`` and ``InputComparison`` are the frozen dataclasses the analysis returns
(``DiagnosisReport``, ``AuditReport``, ``ForensicsResult``) with the same fields and JSON, plus
``to_json``, ``to_html`` and ``_repr_html_`` (Jupyter shows the report inline). They live here,
above the report layer, because their HTML comes from it. ``Fix`` is in ``api.fixing``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, Mapping, TypeVar

from precision_doctor.audit.records import AuditReport
from precision_doctor.diagnosis.report import DiagnosisReport
from precision_doctor.forensics.result import ForensicsResult
from precision_doctor.jsonable import dumps
from precision_doctor.report.files import write_text_atomic
from precision_doctor.report.notebook import console_page, iframe

PathLike = str | os.PathLike
T = TypeVar("T")


def convert(cls: type[T], record: Any, **extra: Any) -> T:
    """``record`` (a dataclass instance) as ``cls``, a subclass with the same fields + ``extra``."""
    return cls(**{f.name: getattr(record, f.name) for f in fields(record)}, **extra)


def json_text(data: Mapping[str, Any], path: PathLike | None, force: bool) -> str:
    """The stable JSON text of ``data``, also written atomically to ``path`` when given.

    Raises:
        OutputPathError: The folder of ``path`` is missing or not writable, or it is a
            folder.
        OutputExistsError: ``path`` exists and ``force`` is False.
    """
    text = dumps(data)
    if path is not None:
        write_text_atomic(path, text, force)
    return text


class _Views:
    """JSON text, HTML page and notebook view of a result that has ``to_dict``."""

    def to_dict(self) -> dict:  # pragma: no cover - the record class comes first in the MRO
        raise NotImplementedError

    def _page(self) -> str:  # pragma: no cover - provided by each result
        raise NotImplementedError

    def to_json(self, path: PathLike | None = None, *, force: bool = False) -> str:
        """The stable JSON text of ``to_dict()`` (sorted keys; inf/nan as strings).

        Args:
            path: Also write it there (atomically).
            force: Overwrite an existing ``path``.

        Raises:
            OutputPathError: The folder of ``path`` is missing or not writable, or it is a
                folder.
            OutputExistsError: ``path`` exists and ``force`` is False.
        """
        return json_text(self.to_dict(), path, force)

    def to_html(self, path: PathLike | None = None, *, force: bool = False) -> str:
        """A self-contained HTML page (no external resources; model names escaped).

        Args:
            path: Also write it there (atomically).
            force: Overwrite an existing ``path``.

        Raises:
            OutputPathError: The folder of ``path`` is missing or not writable, or it is a
                folder.
            OutputExistsError: ``path`` exists and ``force`` is False.
        """
        page = self._page()
        if path is not None:
            write_text_atomic(path, page, force)
        return page

    def _repr_html_(self) -> str:
        return iframe(self._page())


@dataclass(frozen=True)
class Diagnosis(DiagnosisReport, _Views):
    """What ``diagnose`` found: ``DiagnosisReport`` (verdict, outputs, findings, hazards,
    layerwise, noise floor) with JSON/HTML views, and the task metric when one was asked for.

    Attributes:
        task: With ``diagnose(metric=...)``: ``{"metric", "passed", "value", "per_sample"}``,
            the task metric of the candidate's outputs against the FP32 reference's (``value``
            is the worst sample's); None otherwise. ``verdict`` stays the tensor verdict.
        accuracy: With ``diagnose(labels=...)``: the task accuracy against the labels of the
            FP32 reference and of the candidate (``compare.tasks.accuracy.task_accuracy``:
            ``{"labels", "kind", "metric", "samples", "runs": {"fp32": {...}, "fp16": ...}}``).
    """

    task: Mapping[str, Any] | None = None
    accuracy: Mapping[str, Any] | None = None

    def to_dict(self) -> dict:
        """The JSON report (``DiagnosisReport.to_dict``, with ``task`` when measured)."""
        data = DiagnosisReport.to_dict(self)
        if self.task is not None:
            data["task"] = dict(self.task)
        if self.accuracy is not None:
            data["accuracy"] = dict(self.accuracy)
        return data

    @classmethod
    def from_dict(cls, d: Mapping) -> Diagnosis:
        """Inverse of ``to_dict``.

        Raises:
            ValueError: Not a precision-doctor diagnosis, or a newer schema version.
        """
        return convert(cls, DiagnosisReport.from_dict(d), task=d.get("task"),
                       accuracy=d.get("accuracy"))

    def _page(self) -> str:
        from precision_doctor.report.html import render_html

        return render_html(self)


@dataclass(frozen=True)
class Audit(AuditReport, _Views):
    """What ``audit`` found in a TensorRT engine's layer information: ``AuditReport`` (the
    precision every layer ran in, fused regions, findings such as ``fp32-not-honored``) with
    JSON/HTML views.

    Attributes:
        build_log: With ``audit(log=...)``: the build log's precision-relevant facts
            (``audit.buildlog.BuildLog.to_dict``: TensorRT version, GPU, FP16/TF32/strongly
            typed settings, LayerNorm FP16 warnings, per-layer precisions) and ``links``: each
            warned ONNX node with the engine layer that ran it and its precision.
    """

    build_log: Mapping[str, Any] | None = None

    @property
    def passed(self) -> bool:
        """False when an FP32 request was not honored by the engine."""
        return not any(f.kind == "fp32-not-honored" for f in self.findings)

    def to_dict(self) -> dict:
        """The JSON report (``AuditReport.to_dict``, with ``build_log`` when read)."""
        data = AuditReport.to_dict(self)
        if self.build_log is not None:
            data["build_log"] = dict(self.build_log)
        return data

    @classmethod
    def from_dict(cls, data: Mapping) -> Audit:
        """Inverse of ``to_dict``."""
        return convert(cls, AuditReport.from_dict(data), build_log=data.get("build_log"))

    def _page(self) -> str:
        from precision_doctor.report.terminal.audit import render_audit

        return console_page(lambda c: render_audit(self, c), f"Engine audit: {self.source}")


@dataclass(frozen=True)
class InputComparison(ForensicsResult, _Views):
    """What differs between two inputs meant to be the same sample: ``ForensicsResult``
    (findings such as channel order or scale, the estimated transform, its residual, and the
    effect on a model's outputs) with JSON/HTML views."""

    @property
    def passed(self) -> bool:
        """True when no difference was found."""
        return not self.findings

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InputComparison:
        """Inverse of ``to_dict``.

        Raises:
            DataFormatError: Missing keys or malformed findings.
        """
        return convert(cls, ForensicsResult.from_dict(data))

    def _page(self) -> str:
        from precision_doctor.report.terminal.forensics import render_forensics

        return console_page(lambda c: render_forensics(self, c), "Preprocessing forensics")
