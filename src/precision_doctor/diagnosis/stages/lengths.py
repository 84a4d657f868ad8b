"""Lengths: when an output came out in another shape than the reference's, the integer
decisions that changed it and their measured cure (``diagnosis.lengths``); when they are
destroyed, the diagnosis up to them."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Mapping

from precision_doctor.diagnosis.causes.trials import ImpactTrials
from precision_doctor.diagnosis.lengths.assess import with_lengths
from precision_doctor.diagnosis.lengths.cone import cone_model, cone_samples
from precision_doctor.diagnosis.lengths.measure import analyse_lengths, shape_changes
from precision_doctor.diagnosis.lengths.records import LengthReport
from precision_doctor.diagnosis.report import DiagnosisReport
from precision_doctor.diagnosis.stages.comparing import Compared, Read
from precision_doctor.diagnosis.stages.reporting import model_info, named_sources, sample_info
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
        from precision_doctor.diagnosis.lengths.summary import length_summary

        return LengthReport(tuple(changes), (), (), "unknown",
                            length_summary(changes, [], [], len(request.samples), [], None,
                                           None, decisions_run=False))
    trials = (ImpactTrials(request.model, cand.plan, cand.conv_bias, request.samples,
                           reference.outputs, request.output_names)
              if cand.plan is not None and request.measure_impact else None)
    try:
        return analyse_lengths(request.model, request.samples, request.target, cand, changes,
                               trials, (reference.outputs, candidate.outputs))
    finally:
        if trials is not None:
            trials.close()




def diagnose_decisions(request: DiagnoseRequest, compared: Compared, read: Read,
                       lengths: LengthReport, run: Callable[..., DiagnosisReport],
                       seconds: Mapping[str, float]) -> DiagnosisReport:
    """The diagnosis of a destroyed length decision, made up to the decisions.

    The layerwise comparison, the findings and their measured cures run on the sub-model that
    computes the first changed decisions' float inputs (``diagnosis.lengths.cone``), where
    both runs have the same shapes; the report keeps the whole model's outputs, verdict,
    noise floor and decisions, and says the causes were measured there.

    Args:
        request: The whole model's request.
        compared / read: Its compared outputs and decisions.
        lengths: Its length report, read ``destroyed``, with roots.
        run: ``diagnosis.diagnose.diagnose`` (passed in: it chains this module's stages).
        seconds: The whole model's stage times so far (reference, candidate, noise floor,
            lengths), kept first in ``timings_s``.

    Returns:
        The ``DiagnosisReport``.

    Raises:
        BackendError: A run fails.
    """
    sources = [d.source for d in lengths.decisions if d.node in lengths.roots]
    sub = cone_model(request.model, sources)
    inner = run(sub, cone_samples(sub, request.samples), request.target, request.candidate,
                layerwise=request.layerwise, noise=False,
                measure_impact=request.measure_impact, budget_bytes=request.budget_bytes,
                progress=request.progress, rewritten=False, decisions=False)
    where = (f"Measured up to the decisions ({len(sub.graph.node)} of "
             f"{len(request.model.graph.node)} nodes: the sub-model whose outputs are "
             f"{', '.join(sources)}):")
    assessment = inner.assessment
    if assessment is not None:
        assessment = replace(assessment, summary=f"{where} {assessment.summary}")
        assessment = with_lengths(assessment, lengths)
    return replace(
        inner, verdict=compared.verdict, model=model_info(request.model, request.model_path),
        samples=sample_info(request.samples),
        outputs=read.outputs, noise=compared.floor, decision_flips=read.flips,
        decisions=read.summaries, lengths=lengths, assessment=assessment,
        sources={**inner.sources, **named_sources(request.model, None, None, lengths)},
        timings_s={**{k: round(v, 3) for k, v in seconds.items()},
                   **{f"decisions.{k}": v for k, v in inner.timings_s.items()}},
        warnings=(*inner.warnings, "the layerwise comparison and the causes ran up to the "
                  "length decisions: after them the candidate's shapes are not the "
                  "reference's"))


__all__ = ["diagnose_decisions", "read_lengths"]
