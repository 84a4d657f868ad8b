"""The proof that a rewrite which is not exact in FP32 is harmless, before ``fix`` searches,
and the calibration maxima a rewrite needs.

Most rewrites are exact up to float32 rounding by construction (a folded BatchNorm, a fused
LayerNorm). ``saturate-constants`` is not: it clamps a -FLT_MAX mask to -65504;
``reduce-periodic-argument`` is exact only up to |x| = 4.1e5. They are kept only when the
rewritten model, run in FP32 on every calibration sample, gives the FP32 reference's outputs
within ``FP32_REWRITE_RTOL``, with NaN/Inf exactly where the reference has them; else the
rewrites are run again without them and their records say why they were undone.

``prescale-normalized-residual`` chooses its power of two from the largest |x| of each residual
stream's tensors, and ``reduce-periodic-argument`` leaves an argument alone that the
calibration data keeps below its phase limit: the tensors they name are measured here in FP32
on the calibration samples (``calibrate_rewrites``) and the rewrites run again with them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import onnx

from precision_doctor.formats import Precision
from precision_doctor.graph.outputs import chunk_sites, float_activations, mark_outputs
from precision_doctor.layerwise.candidates import reference_factory, run_samples
from precision_doctor.precision.rewrites import (
    REWRITES,
    PrescaleNormalizedResidual,
    ReducePeriodicArgument,
    RewriteRecord,
    RewriteReport,
    apply_rewrites,
)
from precision_doctor.precision.rewrites.ranges.residual import stream_tensor_names

Outputs = Mapping[str, Sequence[np.ndarray]]
# Rewrites that are not exact in FP32: measured here before they are used.
MEASURED_REWRITES = ("saturate-constants", "reduce-periodic-argument")
# rel L2 an FP32 output may move by a measured rewrite: 2**-16 = 256 FP32 unit roundoffs
# (2**-24), 32x below the FP16 unit roundoff (2**-11), so it costs an FP16/BF16 tolerance
# nothing. The attention of tests/mask_models.py moves 1.8e-7 with every rewrite applied
# (prescale-attention's reordering; the clamp itself moves it by 0).
FP32_REWRITE_RTOL = 2.0 ** -16
# Bytes of stream tensors marked as outputs at once while measuring their maxima.
MAXIMA_BUDGET = 1 << 30


def tensor_maxima(model: onnx.ModelProto, names: Sequence[str], samples: Sequence,
                  budget_bytes: int = MAXIMA_BUDGET) -> dict[str, float]:
    """Largest finite |x| of the tensors ``names`` over the samples, in FP32.

    Args:
        model: The FP32 model.
        names: Tensor names (node outputs and graph inputs; others are left out).
        samples: Calibration samples (``.feeds``).
        budget_bytes: Estimated bytes of tensors marked as outputs per run (chunks of tensors
            run one after another, each on every sample).

    Returns:
        Tensor name -> largest finite |x| over the samples (0 when none is finite).

    Raises:
        BackendError: ONNX Runtime fails on the model.
    """
    wanted_names = set(names)
    if not wanted_names or not samples:
        return {}
    shapes = {k: np.asarray(v).shape for k, v in samples[0].feeds.items()}
    sites = [s for s in float_activations(model, shapes) if s.name in wanted_names]
    maxima: dict[str, float] = {}
    for sample in samples:  # graph inputs: the feeds themselves
        for name in wanted_names & set(sample.feeds):
            a = np.abs(np.asarray(sample.feeds[name], np.float64))
            finite = a[np.isfinite(a)]
            maxima[name] = max(maxima.get(name, 0.0), float(finite.max()) if finite.size else 0.0)
    for chunk in chunk_sites(sites, budget_bytes):
        wanted = [s.name for s in chunk]
        with reference_factory(mark_outputs(model, wanted)) as runner:
            for sample in samples:
                for name, array in runner.run(sample.feeds, wanted).items():
                    a = np.abs(np.asarray(array, np.float64))
                    finite = a[np.isfinite(a)]
                    peak = float(finite.max()) if finite.size else 0.0
                    maxima[name] = max(maxima.get(name, 0.0), peak)
    return maxima


def stream_maxima(model: onnx.ModelProto, samples: Sequence) -> dict[str, float]:
    """``tensor_maxima`` of every tensor of the model's scalable residual streams
    (``prescale-normalized-residual``'s candidates); empty when there is none."""
    return tensor_maxima(model, stream_tensor_names(model), samples)


def calibrate_rewrites(original: onnx.ModelProto, rewritten: onnx.ModelProto,
                       report: RewriteReport, samples: Sequence, target: Precision,
                       rules: Sequence[str] | None
                       ) -> tuple[onnx.ModelProto, RewriteReport, dict[str, float] | None]:
    """Rewrite again with measured maxima when a rewrite's decision depends on them: the
    candidate streams of ``prescale-normalized-residual`` and the arguments that
    ``reduce-periodic-argument`` reduced from the graph's bound alone.

    Args:
        original: The model before the rewrites.
        rewritten: ``apply_rewrites(original, rules, target=target)``'s model.
        report: Its report.
        samples: Calibration samples (``.feeds``).
        target: The reduced format.
        rules: The rules requested (None = all).

    Returns:
        ``(model, report, maxima)``: unchanged with None when nothing depends on data; else
        the model rewritten with ``max_abs`` = the maxima measured on ``rewritten`` (whose
        tensor names the second run reproduces: the rewrites are deterministic).

    Raises:
        BackendError: ONNX Runtime fails on the model.
    """
    streams = any(r.details.get("candidate")
                  for r in report.skipped(PrescaleNormalizedResidual.rule))
    arguments = [str(r.details["argument"]) for r in report.applied(ReducePeriodicArgument.rule)
                 if "argument" in r.details and "measured_max_abs" not in r.details]
    if not streams and not arguments:
        return rewritten, report, None
    names = (stream_tensor_names(rewritten) if streams else []) + arguments
    maxima = tensor_maxima(rewritten, names, samples)
    model, again = apply_rewrites(original, rules, target=target, max_abs=maxima)
    return model, again, maxima


def fp32_drift(reference: Outputs, outputs: Outputs, rtol: float = FP32_REWRITE_RTOL
               ) -> str | None:
    """Why ``outputs`` (FP32) are not ``reference`` up to FP32 rounding; None when they are.

    Args:
        reference: Output name -> one array per sample (the FP32 reference).
        outputs: The same names and samples, from the rewritten model in FP32.
        rtol: Largest rel L2 (over all samples of an output) that is not a move.

    Returns:
        None, or the first output that moved (rel L2 above ``rtol``, or NaN/Inf where the
        reference is finite), in words.
    """
    for name, refs in reference.items():
        if not refs or np.asarray(refs[0]).dtype.kind != "f":
            continue
        ref = np.concatenate([np.asarray(a, np.float64).ravel() for a in refs])
        out = np.concatenate([np.asarray(a, np.float64).ravel() for a in outputs[name]])
        if not np.array_equal(np.isfinite(ref), np.isfinite(out)):
            return f"output '{name}' has NaN/Inf where the FP32 reference is finite"
        finite = np.isfinite(ref)
        scale = float(np.linalg.norm(ref[finite])) or 1.0
        rel = float(np.linalg.norm(out[finite] - ref[finite])) / scale
        if rel > rtol:
            return f"output '{name}' moved by rel L2 {rel:.3g} > {rtol:g}"
    return None


def prove_rewrites(original: onnx.ModelProto, rewritten: onnx.ModelProto,
                   report: RewriteReport, samples: Sequence, names: Sequence[str],
                   target: Precision, rules: Sequence[str] | None,
                   reference: Outputs | None = None
                   ) -> tuple[onnx.ModelProto, RewriteReport]:
    """Keep the measured rewrites that ``report`` applied only when harmless in FP32.

    Args:
        original: The model before the rewrites.
        rewritten: ``apply_rewrites(original, rules, target=target)``'s model.
        report: Its report.
        samples: Calibration samples (``.feeds``).
        names: Output names.
        target: The reduced format the rewrites were run for.
        rules: The rules requested (None = all).
        reference: The FP32 reference outputs of ``original``; run here when None.

    Returns:
        ``(rewritten, report)`` unchanged when nothing measured applied or it is harmless; else
        the model rewritten without ``MEASURED_REWRITES`` and a report whose records of them say
        ``undone: <why>``. Candidate residual streams are first measured and rewritten
        (``calibrate_rewrites``).

    Raises:
        BackendError: ONNX Runtime fails on either model.
    """
    rewritten, report, maxima = calibrate_rewrites(original, rewritten, report, samples,
                                                   target, rules)
    measured = [r for r in report.applied() if r.rule in MEASURED_REWRITES]
    if not measured:
        return rewritten, report
    if reference is None:
        reference = run_samples(reference_factory(original), samples, names)
    moved = fp32_drift(reference, run_samples(reference_factory(rewritten), samples, names))
    if moved is None:
        return rewritten, report
    kept = [r for r in (rules if rules is not None else REWRITES) if r not in MEASURED_REWRITES]
    model, again = apply_rewrites(original, kept, target=target, max_abs=maxima)
    undone = tuple(RewriteRecord(r.rule, False, r.nodes, (),
                                 f"undone: {moved} in FP32; it was: {r.reason}", r.details)
                   for r in measured)
    return model, replace(again, rules=report.rules, records=again.records + undone)
