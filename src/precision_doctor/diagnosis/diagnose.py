"""``diagnose``: run a model on the reference and a candidate, compare, localize, explain.

Stages: reference run -> candidate run -> output metrics and verdict -> FP32 noise floor ->
decisions (flips of argmax / CTC / thresholded maps) -> layerwise comparison and the largest
error jump -> static hazards -> findings ranked by measured impact, grouped, and their joint
impact (``explained_share``) -> the emulation of the model after the engine's safe rewrites ->
the assessment (``diagnosis.assessment``).
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence

import numpy as np
import onnx

from precision_doctor.compare.metrics import compute_metrics
from precision_doctor.compare.tolerance import (
    Tolerance,
    check,
    default_tolerance,
    elementwise_pass_share,
)
from precision_doctor.diagnosis.assess import assess
from precision_doctor.diagnosis.assessment import (
    AssessmentInputs,
    rounding_depth,
)
from precision_doctor.diagnosis.causes.cures import layerwise_regions
from precision_doctor.diagnosis.causes.explain import explain
from precision_doctor.diagnosis.causes.hazards import scan_hazards
from precision_doctor.diagnosis.decisions.reading import read_decisions
from precision_doctor.diagnosis.detections import read_detections
from precision_doctor.diagnosis.noise import measure_noise_floor
from precision_doctor.diagnosis.report import DiagnosisReport, OutputResult
from precision_doctor.errors import PrecisionDoctorError, ReferenceError_
from precision_doctor.formats import FORMATS, Precision
from precision_doctor.graph.load import opset_of
from precision_doctor.graph.outputs import producer_inputs
from precision_doctor.inputs.recording import Recording
from precision_doctor.inputs.synthetic import is_random_sample
from precision_doctor.layerwise.candidates import (
    Candidate,
    emulated_fused,
    reference_factory,
    reference_name,
    run_samples,
)
from precision_doctor.layerwise.compare import LAYERWISE_BUDGET, compare_layerwise
from precision_doctor.layerwise.gain import largest_jump
from precision_doctor.layerwise.recording import (
    check_recorded_outputs,
    recorded_candidate,
    recorded_layerwise,
    recording_section,
)
from precision_doctor.runners.sessions import switched
from precision_doctor.search.invariant import DEFAULT_BOUND, check_all_fp32

Progress = Callable[[str, int, int], None]
NOISE_MULTIPLE_OK = 2.0  # an error within 2x the FP32 noise floor is not a precision finding
ATTRIBUTION_BUDGET = 4.0  # attribution wall time: 4x the plain runs and the layerwise pass


class SampleLike(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def feeds(self) -> Mapping[str, np.ndarray]: ...


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
             runs: dict[str, dict[str, list[np.ndarray]]] | None = None) -> DiagnosisReport:
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
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    out_names = [o.name for o in model.graph.output]
    ref = run_samples(reference_factory(model), samples, out_names, "reference", progress)
    for name, arrays in ref.items():
        for s, a in zip(samples, arrays):
            if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
                raise ReferenceError_(
                    f"the FP32 reference ({reference_name()}) produces NaN/Inf in output {name!r} "
                    f"for sample {s.name!r}: nothing can be compared against it. Check the "
                    "input preprocessing (scale, mean/std) and the model.", output=name,
                    sample=s.name)
    timings["reference"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    cand = run_samples(candidate.factory(model), samples, out_names, "candidate", progress)
    timings["candidate"] = time.perf_counter() - t0
    if candidate.recorded is not None:
        check_recorded_outputs(ref, cand, [s.name for s in samples],
                               candidate.recorded.recording.source)
    if runs is not None:
        runs.update(reference=ref, candidate=cand)

    t0 = time.perf_counter()
    probe_outputs: dict[str, dict[str, list[np.ndarray]]] = {}
    floor = (measure_noise_floor(model, [s.feeds for s in samples], ref, probe_outputs)
             if noise else None)
    timings["noise_floor"] = time.perf_counter() - t0

    outputs = _judge(out_names, ref, cand, tolerances, target, floor)
    verdict = "pass" if all(o.passed for o in outputs) else "fail"
    depth = rounding_depth(model)
    u = FORMATS[target].unit_roundoff
    expected = math.sqrt(max(depth, 1)) * u
    # a detection head is read as boxes (diagnosis.detections), never as argmax decisions
    summaries, flips, boxes = (read_detections(model, ref, cand, [s.name for s in samples],
                                               math.sqrt(u)) if decisions else ([], [], set()))
    more, more_flips = (read_decisions(model, ref, cand, [s.name for s in samples],
                                       probe_outputs, model_path, resolution=math.sqrt(u),
                                       skip=boxes) if decisions else ([], []))
    summaries, flips = summaries + more, flips + more_flips

    read = {d.output for d in more}  # argmax agreement means something there only
    outputs = [o if o.name in read or o.metrics.argmax_agreement is None else
               replace(o, metrics=replace(o.metrics, argmax_agreement=None)) for o in outputs]
    default_tol = _tolerance_for(out_names[0], tolerances, target)
    lw, jump = None, None
    inputs_of = producer_inputs(model)
    recording = None
    if candidate.recorded is not None:
        t0 = time.perf_counter()
        rl = recorded_layerwise(
            model, [s.feeds for s in samples], candidate, target,
            _layer_threshold(default_tol, target), budget_bytes, layerwise,
            progress=(lambda d, t: progress("layerwise", d, t)) if progress else None)
        lw = rl.recorded if layerwise else None
        recording = recording_section(candidate, rl, {o.name: o.metrics.rel_l2 for o in outputs})
        timings["layerwise"] = time.perf_counter() - t0
    elif layerwise:
        t0 = time.perf_counter()
        lw = compare_layerwise(
            model, [dict(s.feeds) for s in samples], reference_factory, candidate.factory,
            target, _layer_threshold(default_tol, target), budget_bytes,
            progress=(lambda d, t: progress("layerwise", d, t)) if progress else None,
            segments=candidate.segments, candidate_graph=candidate.graph)
        timings["layerwise"] = time.perf_counter() - t0

    if candidate.plan is not None and measure_impact and verdict == "fail" \
            and candidate.recorded is None:  # before attribution: search.invariant
        floor_max = max(floor.per_output.values(), default=0.0) if floor else 0.0
        with switched.one_plan():  # the first sample is enough
            check_all_fp32(model, candidate.plan, samples[0].feeds,
                           {n: ref[n][0] for n in out_names}, candidate.conv_bias,
                           max(DEFAULT_BOUND, 2.0 * floor_max))
    hazards = scan_hazards(model, target)
    regions = layerwise_regions(model, lw) if lw is not None else {}
    t0 = time.perf_counter()
    transformer = _transformer_section(model, samples, target, stress)
    timings["transformer"] = time.perf_counter() - t0
    explanation = explain(model, samples, target, candidate, lw, hazards,
                          {o.name: (o.metrics.rel_l2, o.passed) for o in outputs}, ref, cand,
                          summaries, inputs_of, regions, expected, progress,
                          ATTRIBUTION_BUDGET * sum(timings.get(k, 0.0) for k in (
                              "reference", "candidate", "layerwise")), measure_impact)
    findings, explained = list(explanation.findings), explanation.explained
    timings.update(explanation.seconds)
    if lw is not None:  # an Inf birth measured harmless (minor) is not the jump
        harmless = {n for f in findings if f.group == "minor" and f.impact is not None
                    for n in f.nodes}
        jump = largest_jump(lw.records, inputs_of, FORMATS[target].unit_roundoff, lw.threshold,
                            harmless)

    t0 = time.perf_counter()
    warnings: list[str] = []
    if any(f.output not in boxes for f in flips) and not probe_outputs:  # boxes: no noise
        warnings.append("decision flips have fp32_noise null: no FP32 noise probe ran ("
                        + ("the noise floor was not measured" if floor is None else
                           "; ".join(f"{k}: {v}" for k, v in floor.skipped.items())) + ")")
    rw = (_rewritten_run(model, samples, out_names, ref, candidate, tolerances, target, floor,
                         warnings) if rewritten else None)
    timings["rewritten"] = time.perf_counter() - t0
    gain = (jump.record.node, jump.gain) if jump is not None else None
    attribution = explanation.attribution.to_dict() if explanation.attribution else None
    assessment = assess(AssessmentInputs(
        verdict == "pass",
        tuple((o.name, o.metrics.rel_l2, o.tolerance.rel_l2, o.passed,
               o.metrics.nan + o.metrics.inf) for o in outputs),
        target, depth, tuple(findings), tuple(summaries), tuple(flips),
        explained, explanation.defect_share, explanation.measured,
        gain, rw, any(is_random_sample(s.name) for s in samples), attribution))
    return DiagnosisReport(
        verdict=verdict, model=_model_info(model, model_path), target=target.value,
        reference=reference_name(), candidate=candidate.name,
        samples=tuple({"name": s.name, "shapes": {k: list(v.shape) for k, v in s.feeds.items()}}
                      for s in samples),
        outputs=tuple(outputs), findings=tuple(findings), hazards=tuple(hazards), layerwise=lw,
        noise=floor, emulation=_emulation_info(candidate, model),
        timings_s={k: round(v, 3) for k, v in timings.items()}, warnings=tuple(warnings),
        assessment=assessment, explained_share=explained, decision_flips=tuple(flips),
        decisions=tuple(summaries), rewritten=rw,
        largest_jump=jump.record.tensor if jump is not None else None, recording=recording,
        transformer=transformer, attribution=attribution,
        joint_cause=explanation.joint.to_dict() if explanation.joint else None,
        finding_groups=explanation.groups)


def _judge(out_names: Sequence[str], ref, cand, tolerances, target: Precision, floor
           ) -> list[OutputResult]:
    """Metrics and verdict of every floating output (noise-floor rule: ``NOISE_MULTIPLE_OK``)."""
    outputs = []
    for name in out_names:
        if not np.issubdtype(ref[name][0].dtype, np.floating):
            continue
        tol = _tolerance_for(name, tolerances, target)
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


ENGINE_REWRITES = ("fold-bias-add", "fold-batchnorm", "fuse-layernorm")


def _rewritten_run(model, samples, out_names, ref, candidate: Candidate, tolerances,
                   target: Precision, floor, warnings: list[str]) -> dict | None:
    """The plain emulator's plan on the model after the safe rewrites (``emulate-fused``), when
    an engine rewrite (``ENGINE_REWRITES``) changes the model; None otherwise."""
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
            outs = run_samples(fused.factory(model), samples, out_names)
    except PrecisionDoctorError as exc:
        warnings.append(f"the rewritten model's emulation did not run: "
                        f"{str(exc).splitlines()[0]}")
        return None
    counts: dict[str, int] = {}
    for r in applied:
        counts[r.rule] = counts.get(r.rule, 0) + 1
    results = _judge(out_names, ref, outs, tolerances, target, floor)
    return {"rewrites": [f"{rule} ({n})" for rule, n in counts.items()],
            "candidate": fused.name, "outputs": [o.to_dict() for o in results],
            "verdict": "pass" if all(o.passed for o in results) else "fail"}


def _layer_threshold(tol: Tolerance, target: Precision) -> float:
    """rel L2 above which a tensor counts as diverged: the output tolerance, or the default."""
    return float(tol.rel_l2 or default_tolerance(target).rel_l2 or 1e-2)


def _transformer_section(model: onnx.ModelProto, samples: Sequence[SampleLike],
                         target: Precision, stress: bool) -> dict | None:
    """Per-block FP16 headroom (``diagnosis.headroom.probe``) plus the stress probe, as a dict."""
    from precision_doctor.diagnosis.headroom.probe import analyze_transformer
    from precision_doctor.diagnosis.headroom.stress import stress_probe

    feeds = [s.feeds for s in samples]
    report = analyze_transformer(model, feeds)
    if report is None:
        return None
    if stress and target is Precision.FP16:
        report = report.with_stress(stress_probe(model, feeds, report).to_dict())
    return report.to_dict()


def _tolerance_for(name: str, tolerances, target: Precision) -> Tolerance:
    if tolerances is None:
        return default_tolerance(target)
    if isinstance(tolerances, Tolerance):
        return tolerances
    return tolerances.get(name) or tolerances.get("*") or default_tolerance(target)


def _model_info(model: onnx.ModelProto, path: str | None) -> dict:
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16] if path and Path(
        path).is_file() else None
    return {"path": path, "opset": opset_of(model), "nodes": len(model.graph.node),
            "sha256": digest, "producer": model.producer_name or None}


def _emulation_info(candidate: Candidate, model: onnx.ModelProto) -> dict | None:
    if candidate.plan is None:
        return None
    from precision_doctor.precision.conv_bias import SEPARATE
    from precision_doctor.precision.emulate import describe_method

    plan = candidate.plan
    bias = ("added after the convolution's output is rounded, then rounded again (ONNX Runtime "
            "CUDA, --engine ort-cuda)" if candidate.conv_bias == SEPARATE else
            "added before the convolution's one rounding (TensorRT's fused bias; for ONNX "
            "Runtime CUDA use --engine ort-cuda)")
    return {"default": plan.default.value, "fp32_nodes": plan.fp32_nodes(),
            "rounding": describe_method(model, plan.default), "conv_bias": bias}


__all__ = ["diagnose"]
