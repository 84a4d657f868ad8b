"""Compare the plain runs: the FP32 noise floor, metrics and verdict per output, and the
decisions read from the outputs (argmax, CTC strings, thresholded maps, detection boxes)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np

from precision_doctor.compare.metrics import compute_metrics
from precision_doctor.compare.tolerance import check, elementwise_pass_share
from precision_doctor.diagnosis.assessment import rounding_depth
from precision_doctor.diagnosis.decisions.reading import read_decisions as read_outputs
from precision_doctor.diagnosis.decisions.records import DecisionFlip, DecisionSummary
from precision_doctor.diagnosis.detections import read_detections
from precision_doctor.diagnosis.noise import NoiseFloor, measure_noise_floor
from precision_doctor.diagnosis.report import OutputResult
from precision_doctor.diagnosis.stages.request import DiagnoseRequest
from precision_doctor.diagnosis.stages.runs import CandidateRun, Reference
from precision_doctor.formats import FORMATS

NOISE_MULTIPLE_OK = 2.0  # an error within 2x the FP32 noise floor is not a precision finding


@dataclass(frozen=True)
class Compared:
    """Metrics and verdict per floating output.

    Attributes:
        outputs: One ``OutputResult`` per floating output, graph order.
        verdict: ``pass`` when every output passes, else ``fail``.
        floor: The FP32 noise floor (None: not measured).
        probe_outputs: The noise probes' outputs (probe -> output -> per sample), which the
            decision reading uses to measure each flip's FP32 noise.
        depth: Rounded layers on the longest path (``diagnosis.assessment.rounding_depth``).
        expected: The rounding expectation ``sqrt(depth) * u``.
        seconds: Wall time of the noise floor.
    """

    outputs: tuple[OutputResult, ...]
    verdict: str
    floor: NoiseFloor | None
    probe_outputs: Mapping[str, Mapping[str, list[np.ndarray]]] = field(repr=False)
    depth: int
    expected: float
    seconds: float


@dataclass(frozen=True)
class Read:
    """The decisions read from the outputs.

    Attributes:
        summaries: One summary per decision output (detection heads first).
        flips: Every flipped decision.
        boxes: Outputs read as detection boxes (no argmax reading, no noise needed).
        outputs: ``Compared.outputs`` with argmax agreement kept only where a decision
            output was read.
    """

    summaries: tuple[DecisionSummary, ...]
    flips: tuple[DecisionFlip, ...]
    boxes: frozenset[str]
    outputs: tuple[OutputResult, ...]


def compare(request: DiagnoseRequest, reference: Reference, candidate: CandidateRun
            ) -> Compared:
    """The FP32 noise floor, then metrics and verdict of every floating output (an output
    within ``NOISE_MULTIPLE_OK`` x its noise floor passes: the model's conditioning, not
    precision).

    Raises:
        BackendError: A noise probe fails to run.
    """
    t0 = time.perf_counter()
    probe_outputs: dict[str, dict[str, list[np.ndarray]]] = {}
    floor = (measure_noise_floor(request.model, [s.feeds for s in request.samples],
                                 reference.outputs, probe_outputs) if request.noise else None)
    seconds = time.perf_counter() - t0
    outputs = judge(request, reference.outputs, candidate.outputs, floor)
    verdict = "pass" if all(o.passed for o in outputs) else "fail"
    depth = rounding_depth(request.model)
    expected = math.sqrt(max(depth, 1)) * FORMATS[request.target].unit_roundoff
    return Compared(tuple(outputs), verdict, floor, probe_outputs, depth, expected, seconds)


def judge(request: DiagnoseRequest, ref: Mapping[str, Sequence[np.ndarray]],
          cand: Mapping[str, Sequence[np.ndarray]], floor: NoiseFloor | None
          ) -> list[OutputResult]:
    """Metrics and verdict of every floating output (noise-floor rule: ``NOISE_MULTIPLE_OK``)."""
    outputs = []
    for name in request.output_names:
        if not np.issubdtype(ref[name][0].dtype, np.floating):
            continue
        tol = request.tolerance_for(name)
        metrics = compute_metrics(ref[name], cand[name])
        share = (elementwise_pass_share(ref[name], cand[name], tol)
                 if tol.atol is not None or tol.rtol is not None else None)
        passed, reason = check(metrics, tol, share)
        nf = floor.per_output.get(name) if floor else None
        multiple = metrics.rel_l2 / nf if nf else None
        if not passed and multiple is not None and multiple <= NOISE_MULTIPLE_OK \
                and not (metrics.nan or metrics.inf):
            passed, reason = True, (f"{reason}, but within {NOISE_MULTIPLE_OK:g}x the FP32 noise "
                                    f"floor ({nf:.3g}): the model's conditioning, not precision")
        outputs.append(OutputResult(name, passed, reason, tol, metrics, nf, multiple))
    return outputs


def read_decisions(request: DiagnoseRequest, reference: Reference, candidate: CandidateRun,
                   compared: Compared) -> Read:
    """Detection heads read as boxes (``diagnosis.detections``), the other decision outputs
    as argmax / CTC / thresholded maps (``diagnosis.decisions.reading``), at the resolution
    ``sqrt(u)``."""
    ref, cand = reference.outputs, candidate.outputs
    names = request.sample_names
    resolution = math.sqrt(FORMATS[request.target].unit_roundoff)
    summaries, flips, boxes = (read_detections(request.model, ref, cand, names, resolution)
                               if request.decisions else ([], [], set()))
    more, more_flips = (read_outputs(request.model, ref, cand, names, compared.probe_outputs,
                                     request.model_path, resolution=resolution, skip=boxes)
                        if request.decisions else ([], []))
    read = {d.output for d in more}  # argmax agreement means something there only
    outputs = tuple(o if o.name in read or o.metrics.argmax_agreement is None else
                    replace(o, metrics=replace(o.metrics, argmax_agreement=None))
                    for o in compared.outputs)
    return Read(tuple(summaries + more), tuple(flips + more_flips), frozenset(boxes), outputs)


__all__ = ["Compared", "NOISE_MULTIPLE_OK", "Read", "compare", "judge", "read_decisions"]
