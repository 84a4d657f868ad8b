"""``diagnose``: run a model on the reference and a candidate, compare, localize, explain.

Stages: reference run -> candidate run -> output metrics and verdict -> FP32 noise floor ->
layerwise comparison -> static hazards -> findings ranked by measured impact.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence

import numpy as np
import onnx

from precision_doctor.analysis.candidates import (
    Candidate,
    emulated,
    reference_factory,
    run_samples,
)
from precision_doctor.analysis.diagnosis import DiagnosisReport, OutputResult
from precision_doctor.analysis.hazards import scan_hazards
from precision_doctor.analysis.layerwise import LAYERWISE_BUDGET, compare_layerwise
from precision_doctor.analysis.noise import measure_noise_floor
from precision_doctor.analysis.rootcause import build_findings, rank_findings
from precision_doctor.compare.metrics import compute_metrics, relative_l2
from precision_doctor.compare.tolerance import (
    Tolerance,
    check,
    default_tolerance,
    elementwise_pass_share,
)
from precision_doctor.errors import ReferenceError_
from precision_doctor.formats import Precision
from precision_doctor.graph.load import opset_of
from precision_doctor.graph.outputs import producer_inputs

Progress = Callable[[str, int, int], None]
NOISE_MULTIPLE_OK = 2.0  # an error within 2x the FP32 noise floor is not a precision finding


class SampleLike(Protocol):
    name: str
    feeds: Mapping[str, np.ndarray]


def diagnose(model: onnx.ModelProto, samples: Sequence[SampleLike], target: Precision,
             candidate: Candidate, tolerances: Tolerance | Mapping[str, Tolerance] | None = None,
             layerwise: bool = True, noise: bool = True, measure_impact: bool = True,
             budget_bytes: int = LAYERWISE_BUDGET, model_path: str | None = None,
             progress: Progress | None = None) -> DiagnosisReport:
    """Diagnose ``model`` in ``target`` precision on ``samples``.

    Args:
        model: FP32 model (nodes named, e.g. by ``load_model``).
        samples: Inputs (``.name``, ``.feeds``); every evaluation uses all of them.
        target: Precision whose range/rounding is checked (FP16 max 65504 etc.).
        candidate: The runner under test (``emulated(plan)`` or ``onnxruntime(...)``).
        tolerances: One tolerance, or per output name; default ``default_tolerance(target)``.
        layerwise: Compare every intermediate tensor.
        noise: Measure the FP32 noise floor.
        measure_impact: For emulated candidates, measure each finding's impact (one extra
            evaluation per finding, at most 12).
        budget_bytes: Memory budget of one layerwise segment (outputs and weights, both
            runners, one sample).
        model_path: Recorded in the report.
        progress: ``progress(stage, done, total)``.

    Returns:
        ``DiagnosisReport``.

    Raises:
        ReferenceError_: The FP32 reference produces NaN/Inf.
        BackendError: A runner fails.
        InputError: Feeds do not match the model.
    """
    if not samples:
        raise ValueError("diagnose needs at least one sample")
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    out_names = [o.name for o in model.graph.output]
    ref = run_samples(reference_factory(model), samples, out_names, "reference", progress)
    for name, arrays in ref.items():
        for s, a in zip(samples, arrays):
            if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
                raise ReferenceError_(
                    f"the FP32 reference (ONNX Runtime CPU) produces NaN/Inf in output {name!r} "
                    f"for sample {s.name!r}: nothing can be compared against it. Check the "
                    "input preprocessing (scale, mean/std) and the model.", output=name,
                    sample=s.name)
    timings["reference"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    cand = run_samples(candidate.factory(model), samples, out_names, "candidate", progress)
    timings["candidate"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    floor = measure_noise_floor(model, [s.feeds for s in samples], ref) if noise else None
    timings["noise_floor"] = time.perf_counter() - t0

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
    verdict = "pass" if all(o.passed for o in outputs) else "fail"

    default_tol = _tolerance_for(out_names[0], tolerances, target)
    lw = None
    if layerwise:
        t0 = time.perf_counter()
        lw = compare_layerwise(
            model, [s.feeds for s in samples], reference_factory, candidate.factory, target,
            default_tol.rel_l2 or default_tolerance(target).rel_l2, budget_bytes,
            progress=(lambda d, t: progress("layerwise", d, t)) if progress else None,
            segments=candidate.segments)
        timings["layerwise"] = time.perf_counter() - t0

    hazards = scan_hazards(model, target)
    findings = build_findings(hazards, lw, target, verdict == "fail", producer_inputs(model),
                              candidate.tf32)
    t0 = time.perf_counter()
    measure = None
    if measure_impact and candidate.plan is not None and verdict == "fail":
        plan = candidate.plan

        def measure(nodes: Sequence[str]) -> float:
            trial = emulated(plan.keep_fp32(nodes, "diagnose"))
            outs = run_samples(trial.factory(model), samples, out_names)
            return max(relative_l2(ref[n], outs[n]) for n in (o.name for o in outputs))

    baseline = max((o.metrics.rel_l2 for o in outputs), default=0.0)
    findings = rank_findings(findings, measure, baseline)
    timings["findings"] = time.perf_counter() - t0
    return DiagnosisReport(
        verdict=verdict, model=_model_info(model, model_path), target=target.value,
        reference="ort-cpu", candidate=candidate.name,
        samples=tuple({"name": s.name, "shapes": {k: list(v.shape) for k, v in s.feeds.items()}}
                      for s in samples),
        outputs=tuple(outputs), findings=tuple(findings), hazards=tuple(hazards), layerwise=lw,
        noise=floor, emulation=_emulation_info(candidate, model),
        timings_s={k: round(v, 3) for k, v in timings.items()})


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
    from precision_doctor.precision.emulate import describe_method

    plan = candidate.plan
    return {"default": plan.default.value, "fp32_nodes": plan.fp32_nodes(),
            "rounding": describe_method(model, plan.default)}


__all__ = ["diagnose"]
