"""Which engines an out-of-range constant breaks: the verdict per engine, measured.

A ``parameter-out-of-range`` finding assumes a strongly typed conversion (the constant becomes
inf: ONNX Cast, ``precision.constants``). TensorRT's weakly typed build clamps it to +-65504
instead, after folding BatchNorm into its convolution and fusing LayerNorm in FP32 (so a
BatchNorm variance is folded away, never clamped). ``engine_verdicts`` emulates the model once
more as that build converts it (``as_tensorrt_builds``; one emulated evaluation of the same
plan) and adds to each such finding whether the output error goes away there:

    evidence["clamped_error"]   worst output rel L2 with the constants clamped
    evidence["clamped_passes"]  whether every output then meets its rel L2 tolerance
    evidence["verdicts"]        engine -> "fail" | "pass" | "not measured", in words
    evidence["engine_verdict"]  the ``engine``'s own verdict, when one is given

onnxconverter-common clamps to 1e4, also finite: its verdict is not measured separately (the
same mechanism, a finite fill instead of inf); ONNX Runtime CUDA runs the model as written,
so its verdict is the strongly typed one for a model converted by a strongly typed writer.

Called by ``api.diagnosing.diagnose`` after ``diagnosis.diagnose``, with the emulated plan, the
reference outputs and the outputs' rel L2 tolerances (the assessment itself is not changed:
it describes the strongly typed conversion).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import onnx

from precision_doctor.compare.metrics import compute_metrics
from precision_doctor.diagnosis.causes.findings import Finding
from precision_doctor.formats import Precision
from precision_doctor.layerwise.candidates import run_samples
from precision_doctor.precision.constants import (
    ASSUMED,
    CONVERSIONS,
    clamp_constants,
    clamping_engines,
    conversion_of,
)
from precision_doctor.precision.conv_bias import FUSED
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.precision.rewrites import apply_rewrites
from precision_doctor.runners.emulator import EmulatorRunner

KIND = "parameter-out-of-range"
MEASURED_ENGINE = "tensorrt"  # clamps to the format max: the bound saturate-constants uses
# What TensorRT's builder fuses before it converts weights (the engine rewrites diagnose's
# ``rewritten`` emulation applies): a BatchNorm variance is folded away in FP32, never clamped.
TENSORRT_REWRITES = ("fold-bias-add", "fold-batchnorm", "fuse-layernorm")


def engine_verdicts(model: onnx.ModelProto, samples: Sequence, plan: PrecisionPlan,
                    reference: Mapping[str, Sequence[np.ndarray]],
                    tolerances: Mapping[str, float], findings: Sequence[Finding],
                    engine: str | None = None, conv_bias: str = FUSED,
                    failing: bool = True) -> list[Finding]:
    """``findings`` with the per-engine verdict added to each out-of-range parameter finding.

    Args:
        model: The diagnosed FP32 model.
        samples: The diagnosis samples (``.feeds``).
        plan: The emulated candidate's plan (its ``default`` is the target format).
        reference: FP32 reference outputs (output name -> one float32 array per sample).
        tolerances: Output name -> rel L2 limit (outputs without one are not judged).
        findings: The ranked findings.
        engine: The ``--engine`` (``tensorrt``, ``onnxconverter-common``, ``ort-cuda``,
            ``strongly-typed``), whose own verdict is stated; None: the assumed one.
        conv_bias: The emulator's convolution bias model (``precision.conv_bias``).
        failing: Whether the diagnosis (the assumed, strongly typed conversion) fails; when it
            passes nothing is measured: the clamping engines are ``not measured``.

    Returns:
        The findings in the same order; unchanged when none is an out-of-range parameter or
        no engine clamps in the target format.

    Raises:
        KeyError: ``engine`` has no row in ``precision.constants.CONVERSIONS``.
        BackendError: The emulation fails.
    """
    target = plan.default
    row = conversion_of(engine)
    if not any(f.kind == KIND for f in findings) or target not in (Precision.FP16,
                                                                    Precision.BF16):
        return list(findings)
    clampers = clamping_engines(target)
    measured = None
    if failing and MEASURED_ENGINE in clampers:
        built, plan_there = as_tensorrt_builds(model, plan)
        if built is not None:
            measured = _measure(built, samples, plan_there, reference, tolerances, conv_bias)
    assumed = "fail" if failing else "pass"
    verdicts = {}
    for key, conv in CONVERSIONS.items():
        if key == MEASURED_ENGINE and key in clampers:
            verdicts[key] = ("pass" if measured[1] else "fail") if measured is not None else \
                "not measured" + ("" if failing else " (the assumed conversion passes)")
        elif key in clampers:
            verdicts[key] = (f"clamps to a finite {conv.bound(target):g} like TensorRT "
                             "(not measured separately)")
        elif target not in conv.formats:
            verdicts[key] = f"no {target.value.upper()} conversion known"
        else:
            verdicts[key] = (f"{assumed} (as assumed)" if key == ASSUMED else
                             f"as written: {assumed} when its model was converted by a "
                             "strongly typed writer")
    out = []
    for f in findings:
        if f.kind != KIND:
            out.append(f)
            continue
        evidence = {**f.evidence, "verdicts": "; ".join(f"{CONVERSIONS[k].title}: {v}"
                                                        for k, v in verdicts.items())}
        summary = f.summary
        if measured is not None:
            error, passes = measured
            evidence.update(clamped_error=error, clamped_passes=passes)
            summary += (f". Measured as a weakly typed TensorRT build converts the model "
                        "(BatchNorm folded, LayerNorm fused, out-of-range constants clamped; "
                        f"one emulated evaluation): worst output rel L2 {error:.3g}, "
                        + ("within tolerance: TensorRT's users see no failure; it is the "
                           "strongly typed Cast's" if passes else
                           "still out of tolerance: it fails under TensorRT too"))
        if engine is not None:
            evidence["engine_verdict"] = verdicts[row.engine]
            summary += f". Under --engine {row.engine}: {verdicts[row.engine]}"
        out.append(replace(f, summary=summary, evidence=evidence))
    return out


def as_tensorrt_builds(model: onnx.ModelProto, plan: PrecisionPlan
                       ) -> tuple[onnx.ModelProto | None, PrecisionPlan]:
    """The model as a weakly typed TensorRT build converts it: BatchNorm folded into its
    convolution and decomposed LayerNorm fused first (``TENSORRT_REWRITES``, in FP32, as its
    builder fuses them), then every out-of-range constant clamped (``clamp_constants``); and
    ``plan`` on the nodes that model still has.

    Returns:
        ``(model, plan)``; the model is None when neither step changes anything.
    """
    rewritten, report = apply_rewrites(model, TENSORRT_REWRITES)
    clamped, names = clamp_constants(rewritten, plan.default, MEASURED_ENGINE)
    if not names and not report.changed:
        return None, plan
    kept = {n.name for n in clamped.graph.node}
    return clamped, PrecisionPlan(plan.default, {k: v for k, v in plan.overrides.items()
                                                 if k in kept})


def _measure(model: onnx.ModelProto, samples: Sequence, plan: PrecisionPlan,
             reference: Mapping[str, Sequence[np.ndarray]], tolerances: Mapping[str, float],
             conv_bias: str) -> tuple[float, bool]:
    """(worst output rel L2, every judged output within its tolerance) of ``plan`` emulated on
    ``model``."""
    names = list(reference)
    outputs = run_samples(EmulatorRunner(model, plan, name="emulate-clamped",
                                         conv_bias=conv_bias), samples, names)
    worst, passes = 0.0, True
    for name in names:
        if np.asarray(reference[name][0]).dtype.kind != "f":
            continue
        rel = compute_metrics(reference[name], outputs[name]).rel_l2
        rel = float(rel) if np.isfinite(rel) else float("inf")
        worst = max(worst, rel)
        limit = tolerances.get(name)
        if limit is not None and not rel <= limit:
            passes = False
    return worst, passes
