"""Assess: the model after the engine's safe rewrites, emulated once, and the assessment
(``diagnosis.assess``: within tolerance, defect, decision flips, rounding or unexplained)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from precision_doctor.diagnosis.assess import assess
from precision_doctor.diagnosis.assessment import Assessment, AssessmentInputs
from precision_doctor.diagnosis.lengths.records import LengthReport
from precision_doctor.diagnosis.stages.causes import Causes
from precision_doctor.diagnosis.stages.comparing import Compared, Read, judge
from precision_doctor.diagnosis.stages.request import DiagnoseRequest
from precision_doctor.diagnosis.stages.runs import Reference
from precision_doctor.errors import PrecisionDoctorError
from precision_doctor.inputs.synthetic import is_random_sample
from precision_doctor.layerwise.candidates import emulated_fused, run_samples
from precision_doctor.runners.sessions import switched

ENGINE_REWRITES = ("fold-bias-add", "fold-batchnorm", "fuse-layernorm")


@dataclass(frozen=True)
class Assessed:
    """The assessment and what it read last.

    Attributes:
        assessment: The kind of result, its numbers and remedy.
        rewritten: The rewritten model's run (``DiagnosisReport.rewritten``), or None.
        warnings: Notes for the report (a decision flip without a noise probe, a rewritten
            emulation that did not run).
        seconds: Wall time of the rewritten run.
    """

    assessment: Assessment
    rewritten: dict | None
    warnings: tuple[str, ...]
    seconds: float


def assess_stage(request: DiagnoseRequest, reference: Reference, compared: Compared,
                 read: Read, causes: Causes, lengths: LengthReport | None = None) -> Assessed:
    """The rewritten model's emulation (when an engine rewrite changes the model), then the
    assessment of everything measured.

    Raises:
        BackendError: The rewritten emulation fails in a way that is not a model error.
    """
    t0 = time.perf_counter()
    warnings: list[str] = []
    floor = compared.floor
    if any(f.output not in read.boxes for f in read.flips) and not compared.probe_outputs:
        # boxes need no noise probe
        warnings.append("decision flips have fp32_noise null: no FP32 noise probe ran ("
                        + ("the noise floor was not measured" if floor is None else
                           "; ".join(f"{k}: {v}" for k, v in floor.skipped.items())) + ")")
    rw = rewritten_run(request, reference.outputs, compared, warnings) \
        if request.rewritten else None
    seconds = time.perf_counter() - t0
    explanation, jump = causes.explanation, causes.jump
    gain = (jump.record.node, jump.gain) if jump is not None else None
    attribution = explanation.attribution.to_dict() if explanation.attribution else None
    assessment = assess(AssessmentInputs(
        compared.verdict == "pass",
        tuple((o.name, o.metrics.rel_l2, o.tolerance.rel_l2, o.passed,
               o.metrics.nan + o.metrics.inf) for o in read.outputs),
        request.target, compared.depth, tuple(explanation.findings), read.summaries,
        read.flips, explanation.explained, explanation.defect_share, explanation.measured,
        gain, rw, any(is_random_sample(s.name) for s in request.samples), attribution,
        lengths))
    return Assessed(assessment, rw, tuple(warnings), seconds)


def rewritten_run(request: DiagnoseRequest, ref: Mapping[str, Sequence[np.ndarray]],
                  compared: Compared, warnings: list[str]) -> dict | None:
    """The plain emulator's plan on the model after the safe rewrites (``emulate-fused``), when
    an engine rewrite (``ENGINE_REWRITES``) changes the model; None otherwise (a failure to
    run it is a warning)."""
    candidate, model = request.candidate, request.model
    if candidate.plan is None or candidate.name.startswith("emulate-fused"):
        return None
    from precision_doctor.precision.rewrites import apply_rewrites

    try:
        rewritten_model, report = apply_rewrites(model)
        applied = [r for r in report.applied() if r.rule in ENGINE_REWRITES]
        if not applied:
            return None
        fused = emulated_fused(model, candidate.plan, rewritten_model)
        with switched.one_plan():  # one plan of another model: not worth a switched session
            outs = run_samples(fused.factory(model), request.samples, request.output_names)
    except PrecisionDoctorError as exc:
        warnings.append(f"the rewritten model's emulation did not run: "
                        f"{str(exc).splitlines()[0]}")
        return None
    counts: dict[str, int] = {}
    for r in applied:
        counts[r.rule] = counts.get(r.rule, 0) + 1
    results = judge(request, ref, outs, compared.floor)
    return {"rewrites": [f"{rule} ({n})" for rule, n in counts.items()],
            "candidate": fused.name, "outputs": [o.to_dict() for o in results],
            "verdict": "pass" if all(o.passed for o in results) else "fail"}


__all__ = ["Assessed", "ENGINE_REWRITES", "assess_stage", "rewritten_run"]
