"""Localize: every intermediate tensor compared (``layerwise``), live or against the tensors
an engine recorded."""

from __future__ import annotations

import time
from dataclasses import dataclass

from precision_doctor.compare.tolerance import Tolerance, default_tolerance
from precision_doctor.diagnosis.stages.comparing import Read
from precision_doctor.diagnosis.stages.request import DiagnoseRequest
from precision_doctor.formats import Precision
from precision_doctor.layerwise.candidates import reference_factory
from precision_doctor.layerwise.compare import LayerwiseResult, compare_layerwise
from precision_doctor.layerwise.recording import recorded_layerwise, recording_section


@dataclass(frozen=True)
class Localized:
    """The layerwise comparison.

    Attributes:
        layerwise: Every intermediate floating tensor compared (None: not run).
        recording: The report's ``recording`` section for a recorded candidate, else None.
        seconds: Wall time of this stage (None: it did not run).
    """

    layerwise: LayerwiseResult | None
    recording: dict | None
    seconds: float | None


def layer_threshold(tol: Tolerance, target: Precision) -> float:
    """rel L2 above which a tensor counts as diverged: the output tolerance, or the default."""
    return float(tol.rel_l2 or default_tolerance(target).rel_l2 or 1e-2)


def localize(request: DiagnoseRequest, read: Read) -> Localized:
    """Compare every intermediate tensor in bounded segments (``layerwise.compare``), or, for
    a recorded candidate, the tensors it recorded (``layerwise.recording``).

    Raises:
        BackendError: A segment fails to run.
    """
    candidate, progress = request.candidate, request.progress
    threshold = layer_threshold(request.tolerance_for(request.output_names[0]), request.target)
    report = (lambda d, t: progress("layerwise", d, t)) if progress else None
    t0 = time.perf_counter()
    if candidate.recorded is not None:
        rl = recorded_layerwise(request.model, [s.feeds for s in request.samples], candidate,
                                request.target, threshold, request.budget_bytes,
                                request.layerwise, progress=report)
        recording = recording_section(candidate, rl,
                                      {o.name: o.metrics.rel_l2 for o in read.outputs})
        return Localized(rl.recorded if request.layerwise else None, recording,
                         time.perf_counter() - t0)
    if not request.layerwise:
        return Localized(None, None, None)
    lw = compare_layerwise(
        request.model, [dict(s.feeds) for s in request.samples], reference_factory,
        candidate.factory, request.target, threshold, request.budget_bytes, progress=report,
        segments=candidate.segments, candidate_graph=candidate.graph)
    return Localized(lw, None, time.perf_counter() - t0)


__all__ = ["Localized", "layer_threshold", "localize"]
