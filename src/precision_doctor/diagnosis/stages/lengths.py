"""Lengths: when an output came out in another shape than the reference's, the integer
decisions that changed it and their measured cure (``diagnosis.lengths``)."""

from __future__ import annotations

from precision_doctor.diagnosis.causes.trials import ImpactTrials
from precision_doctor.diagnosis.lengths.measure import analyse_lengths, shape_changes
from precision_doctor.diagnosis.lengths.records import LengthReport
from precision_doctor.diagnosis.stages.request import DiagnoseRequest
from precision_doctor.diagnosis.stages.runs import CandidateRun, Reference


def read_lengths(request: DiagnoseRequest, reference: Reference, candidate: CandidateRun
                 ) -> LengthReport | None:
    """The length report, or None when every output has the reference's shape on every
    sample. Costs one more reference run and one more candidate run with the decision sites
    marked, and on an emulated candidate one evaluation of the cure.

    Raises:
        BackendError: A run fails.
    """
    changes = shape_changes(reference.outputs, candidate.outputs, request.sample_names)
    if not changes:
        return None
    cand = request.candidate
    if cand.recorded is not None:  # recorded outputs: no run with more outputs
        from precision_doctor.diagnosis.lengths.measure import length_summary

        return LengthReport(tuple(changes), (), (), "unknown",
                            length_summary(changes, [], [], len(request.samples), [], None,
                                           decisions_run=False))
    trials = (ImpactTrials(request.model, cand.plan, cand.conv_bias, request.samples,
                           reference.outputs, request.output_names)
              if cand.plan is not None and request.measure_impact else None)
    try:
        return analyse_lengths(request.model, request.samples, request.target, cand, changes,
                               trials, (reference.outputs, candidate.outputs))
    finally:
        if trials is not None:
            trials.close()


__all__ = ["read_lengths"]
