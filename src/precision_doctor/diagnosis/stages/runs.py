"""The plain runs: the FP32 reference and the candidate on every sample."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from precision_doctor.diagnosis.stages.request import DiagnoseRequest
from precision_doctor.layerwise.candidates import (
    check_finite_reference,
    reference_factory,
    run_samples,
)
from precision_doctor.layerwise.recording import check_recorded_outputs

Outputs = Mapping[str, list[np.ndarray]]


@dataclass(frozen=True)
class Reference:
    """The FP32 reference's outputs.

    Attributes:
        outputs: Output name -> one array per sample.
        seconds: Wall time of this stage.
    """

    outputs: Outputs
    seconds: float


@dataclass(frozen=True)
class CandidateRun:
    """The candidate's outputs (output name -> one array per sample) and its wall time."""

    outputs: Outputs
    seconds: float


def run_reference(request: DiagnoseRequest) -> Reference:
    """Run the FP32 reference on every sample.

    Raises:
        ReferenceError_: The reference produces NaN/Inf (it names the output and sample).
        BackendError: The runner fails.
    """
    t0 = time.perf_counter()
    ref = run_samples(reference_factory(request.model), request.samples, request.output_names,
                      "reference", request.progress)
    check_finite_reference(ref, request.sample_names)
    return Reference(ref, time.perf_counter() - t0)


def run_candidate(request: DiagnoseRequest, reference: Reference) -> CandidateRun:
    """Run the candidate on every sample (a recorded candidate is checked against the
    reference's output names and shapes).

    Raises:
        BackendError: The runner fails.
        InputError: Recorded outputs do not match the reference.
    """
    t0 = time.perf_counter()
    candidate = request.candidate
    cand = run_samples(candidate.factory(request.model), request.samples, request.output_names,
                       "candidate", request.progress)
    seconds = time.perf_counter() - t0
    if candidate.recorded is not None:
        check_recorded_outputs(reference.outputs, cand, request.sample_names,
                               candidate.recorded.recording.source)
    return CandidateRun(cand, seconds)


__all__ = ["CandidateRun", "Outputs", "Reference", "run_candidate", "run_reference"]
