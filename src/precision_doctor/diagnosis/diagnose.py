"""``diagnose``: run a model on the reference and a candidate, compare, localize, explain.

A thin chain of the named stages of ``diagnosis.stages`` (each a function from frozen
dataclasses to a frozen dataclass): reference run -> candidate run -> FP32 noise floor, output
metrics and verdict -> decisions (flips of argmax / CTC / thresholded maps, detection boxes) ->
layerwise comparison (and, when an output changed shape, the integer decisions that changed
it: ``diagnosis.lengths``) -> causes (the all-FP32 invariant, static hazards, findings ranked by
measured cure, attribution, joint causes, the largest error jump) -> the emulation of the model
after the engine's safe rewrites and the assessment (``diagnosis.assessment``) -> the report
-> what each engine makes of an out-of-range constant.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.compare.tolerance import Tolerance
from precision_doctor.diagnosis.report import DiagnosisReport
from precision_doctor.diagnosis.stages import (
    DiagnoseRequest,
    Progress,
    SampleLike,
    assess_stage,
    build_report,
    compare,
    engine_stage,
    find_causes,
    localize,
    read_decisions,
    run_candidate,
    run_reference,
)
from precision_doctor.diagnosis.stages.lengths import diagnose_decisions, read_lengths
from precision_doctor.formats import Precision
from precision_doctor.graph.random_ops import seed_random_ops, seeded_note
from precision_doctor.inputs.recording import Recording
from precision_doctor.layerwise.candidates import Candidate
from precision_doctor.layerwise.compare import LAYERWISE_BUDGET, preload_statistics
from precision_doctor.layerwise.recording import recorded_candidate
from precision_doctor.precision.plan import PrecisionPlan


def diagnose(model: onnx.ModelProto, samples: Sequence[SampleLike], target: Precision,
             candidate: Candidate | None,
             tolerances: Tolerance | Mapping[str, Tolerance] | None = None,
             layerwise: bool = True, noise: bool = True, measure_impact: bool = True,
             budget_bytes: int = LAYERWISE_BUDGET, model_path: str | None = None,
             progress: Progress | None = None, rewritten: bool = True,
             decisions: bool = True,
             candidate_results: str | Path | Recording | None = None,
             candidate_log: str | Path | None = None,
             stress: bool = False,
             runs: dict[str, dict[str, list[np.ndarray]]] | None = None,
             engine: str | None = None, constants_plan: PrecisionPlan | None = None
             ) -> DiagnosisReport:
    """Diagnose ``model`` in ``target`` precision on ``samples``.

    Args:
        model: FP32 model (nodes named, e.g. by ``load_model``).
        samples: Inputs (``.name``, ``.feeds``); every evaluation uses all of them.
        target: Precision whose range/rounding is checked (FP16 max 65504 etc.).
        candidate: The runner under test (``emulated(plan)`` or ``onnxruntime(...)``); may be
            None when ``candidate_results`` is given.
        tolerances: One tolerance, or per output name; default ``default_tolerance(target)``.
        layerwise: Compare every intermediate tensor.
        noise: Measure the FP32 noise floor.
        measure_impact: For emulated candidates, measure each finding's impact (one extra
            evaluation per finding, at most 12).
        budget_bytes: Memory budget of one layerwise segment (outputs and weights, both
            runners, one sample).
        model_path: Recorded in the report.
        progress: ``progress(stage, done, total)``.
        candidate_results: Outputs recorded elsewhere (``inputs.recording``: Polygraphy
            ``--save-outputs`` JSON ``[:RUNNER]``, trtexec ``--exportOutput`` JSON, ``.npz``), or
            a ``Recording``: they replace ``candidate``, matched to ``samples`` in order (the
            emulator of ``candidate.plan``, else of ``target``, is the cross-check).
        candidate_log: The recorded engine's trtexec/Polygraphy ``--verbose`` build log:
            TensorRT version, GPU, FP16/TF32/strongly typed settings for the report.
        rewritten: For the plain emulator, also emulate the model after the numerically safe
            rewrites an engine applies anyway (BatchNorm folding, LayerNorm fusion), when they
            change the model (one extra evaluation); reported as ``rewritten``.
        decisions: Detect decision outputs and report their flips.
        stress: For transformers and an FP16 target, also run the stress probe
            (``diagnosis.headroom.stress``: up to ~26 extra FP32 runs of the first sample).
        runs: A dict that receives the plain runs' outputs, ``"reference"`` and
            ``"candidate"`` (output name -> one float32 array per sample), for a caller that
            scores them further (the API's task metric) without running them again.
        engine: The deployment engine (``--engine``): its own verdict on an out-of-range
            constant is stated (``diagnosis.causes.engine_constants``).
        constants_plan: The emulated plan (its default is the target) under which each
            engine's conversion of an out-of-range constant is judged and, when the diagnosis
            fails, measured once; None: no per-engine verdicts.

    Returns:
        ``DiagnosisReport``.

    Raises:
        ReferenceError_: The FP32 reference produces NaN/Inf.
        BackendError: A runner fails.
        InputError: Feeds do not match the model.
    """
    if not samples:
        raise ValueError("diagnose needs at least one sample")
    if candidate_results is not None:
        candidate = recorded_candidate(candidate_results, model, [s.name for s in samples],
                                       target, candidate.plan if candidate else None,
                                       candidate_log)
    if candidate is None:
        raise ValueError("diagnose needs a candidate or candidate_results")
    model, seeded = seed_random_ops(model)  # the same draws in the reference and candidate
    request = DiagnoseRequest(model, samples, target, candidate, tolerances, layerwise, noise,
                              measure_impact, budget_bytes, model_path, progress, rewritten,
                              decisions, stress)
    if layerwise:  # the statistics kernel, if the comparison will use it, loads meanwhile
        preload_statistics(model, [s.feeds for s in samples])
    reference = run_reference(request)
    cand = run_candidate(request, reference)
    if runs is not None:
        runs.update(reference=dict(reference.outputs), candidate=dict(cand.outputs))
    compared = compare(request, reference, cand)
    read = read_decisions(request, reference, cand, compared)
    lengths = read_lengths(request, reference, cand)
    if lengths is not None and lengths.reading == "destroyed" and lengths.roots:
        # what follows the decisions is not comparable: causes are measured up to them
        report = diagnose_decisions(request, compared, read, lengths, diagnose, {
            "reference": reference.seconds, "candidate": cand.seconds,
            "noise_floor": compared.seconds, "lengths": lengths.seconds})
        return _notes(report, seeded)
    localized = localize(request, read)
    causes = find_causes(request, reference, cand, compared, read, localized, lengths)
    assessed = assess_stage(request, reference, compared, read, causes, lengths)
    report = build_report(request, reference, cand, compared, read, localized, causes,
                          assessed, lengths)
    return engine_stage(request, reference, _notes(report, seeded), constants_plan, engine)


def _notes(report: DiagnosisReport, seeded: tuple[str, ...]) -> DiagnosisReport:
    """The report with the seeded random operators and any nondeterminism said."""
    if seeded:
        report = replace(report, warnings=(*report.warnings, seeded_note(seeded)))
    if report.noise is not None and report.noise.nondeterministic:
        repeat = report.noise.probes["repeat"]
        report = replace(report, warnings=(*report.warnings, (
            "two FP32 runs of the same model on the same samples differ (rel L2 "
            + ", ".join(f"{k} {v:.3g}" for k, v in repeat.items()) + "): the model is not "
            "deterministic, so part of any error is not precision")))
    return report


__all__ = ["diagnose"]
