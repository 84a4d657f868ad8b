"""``diagnose --target int8|fp8``: does the model survive quantization, which layers break it,
and why (each cause by a measured cure).

    prepare (opset) -> place (units) -> collect (FP32 reference, calibration)
      -> measure (per-layer SQNR, clipped and zeroed shares, channel spread; the quantized
         model's outputs) -> score (tolerance or task metric) -> causes (measured cures)
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import onnx

from precision_doctor.compare.metrics import compute_metrics
from precision_doctor.compare.tolerance import Tolerance
from precision_doctor.errors import UnsupportedModelError
from precision_doctor.formats import Precision
from precision_doctor.jsonable import json_float
from precision_doctor.quant.causes import QuantCause, error_power, find_causes, removed_share
from precision_doctor.quant.collect import Calibration, CalibrationSet, collect
from precision_doctor.quant.emulation import Between, as_plan, describe_between, run_config
from precision_doctor.quant.measure import LayerMeasure, measure_layers
from precision_doctor.quant.placement import QuantUnit, place
from precision_doctor.quant.qdq import QuantConfig, prepare
from precision_doctor.quant.qformats import QuantFormat
from precision_doctor.search.objective import Objective, Outputs

Progress = Callable[[str, int, int], None]
# Relative L2 on every output when no tolerance or metric is given: INT8/FP8 layers reach
# 30-45 dB SQNR each (0.6-3% relative noise), accumulated over tens of layers; a task metric
# (--metric) is the better judge for a quantized model.
DEFAULT_TOLERANCE = 1e-1


def default_objective() -> Objective:
    """Relative L2 <= ``DEFAULT_TOLERANCE`` on every output."""
    return Objective(tolerances={"*": Tolerance(DEFAULT_TOLERANCE)})


@dataclass(frozen=True)
class QuantSetup:
    """The prepared model, its units and the calibration: what diagnose and fix share.

    Attributes:
        model: The FP32 model at the Q/DQ opset (``quant.qdq.prepare``).
        units: Its units (``quant.placement.place``).
        calibration: Activation ranges of the calibration samples.
        reference: FP32 outputs on the evaluation samples.
        config: Every unit quantized with ``calibration``'s amax.
        seconds: Wall time of preparing and calibrating.
    """

    model: onnx.ModelProto
    units: tuple[QuantUnit, ...]
    calibration: Calibration
    reference: Outputs
    config: QuantConfig
    seconds: float


def setup(model: onnx.ModelProto, samples: Sequence, fmt: QuantFormat, calibrator: str,
          calibration: CalibrationSet | None = None, progress: Progress | None = None
          ) -> QuantSetup:
    """Prepare, place and calibrate.

    Args:
        model: FP32 model (nodes named).
        samples: Evaluation samples (``.feeds``).
        fmt: INT8 or FP8.
        calibrator: ``max``, ``percentile``, ``entropy`` or ``mse``.
        calibration: Samples to calibrate on, streamed (default: ``samples``, which then
            calibrate and evaluate: the report says not disjoint).
        progress: ``progress(stage, done, total)``.

    Raises:
        UnsupportedModelError: No quantizable layer, or the opset cannot be raised.
        InputError: Unknown calibrator, or an empty calibration set.
        BackendError: ONNX Runtime fails.
    """
    t0 = time.perf_counter()
    prepared = prepare(model, fmt)
    units = tuple(place(prepared))
    if not units:
        raise UnsupportedModelError("the model has no Conv, ConvTranspose, MatMul, Gemm or "
                                    "pooling layer with float inputs: nothing to quantize")
    if calibration is None:
        calib, ref = collect(prepared, units, samples, fmt, calibrator, progress=progress)
    else:
        from precision_doctor.quant.emulation import run_outputs

        calib, _ = collect(prepared, units, calibration.samples, fmt, calibrator,
                           progress=progress, reference=False, source=calibration.source,
                           disjoint=calibration.disjoint)
        ref = run_outputs(prepared, samples, [o.name for o in prepared.graph.output])
    config = QuantConfig(fmt, calib.amax, frozenset(u.name for u in units),
                         channel_amax=calib.channel_amax)
    return QuantSetup(prepared, units, calib, ref, config, time.perf_counter() - t0)


FLOAT_BETWEEN = "float-between"


def float_between_cause(s: QuantSetup, samples: Sequence, objective: Objective,
                        between: Between, candidate: Outputs) -> QuantCause | None:
    """The float part alone (no layer quantized) scored on every sample; a ``float-between``
    cause when it fails the objective by itself, its cure measured with FP32 between."""
    plan = as_plan(between)
    if plan.default is Precision.FP32 and not plan.overrides:
        return None
    none = s.config.with_quantized(frozenset())
    alone = objective.score(s.reference, run_config(s.model, s.units, none, samples, between))
    if alone.passed:
        return None
    wide = run_config(s.model, s.units, s.config, samples, Precision.FP32)
    fp32 = objective.score(s.reference, wide)
    label = objective.score_label()
    before, after = error_power(s.reference, candidate), error_power(s.reference, wide)
    removed = removed_share(before, after)
    return QuantCause(
        FLOAT_BETWEEN, (), "fp32-between", removed, math.sqrt(before), math.sqrt(after),
        f"with no layer quantized, {describe_between(between).upper()} alone scores "
        f"{alone.value:.4g} ({label}) and fails; every layer quantized with FP32 between "
        f"scores {fp32.value:.4g} ({'passes' if fp32.passed else 'fails'})",
        "fix --target int8/fp8 first finds the nodes FP16 needs in FP32 (as fix --target fp16 "
        "does) and keeps them there; diagnose --target fp16 explains them")


@dataclass(frozen=True)
class QuantDiagnosis:
    """The answer of ``diagnose --target int8|fp8``.

    Attributes:
        target: ``int8`` or ``fp8``.
        between: Float precision between the Q/DQ pairs (``fp16``).
        objective: The objective, in words.
        passed: The quantized model meets it on every sample.
        score: The objective's value (relative L2 / tolerance ratio, or the task metric).
        metrics: Per output: ``compute_metrics`` of the quantized emulation against FP32.
        layers: Per unit measures, graph order.
        causes: Causes with their measured cures, largest first.
        explained_share: Share of the error power the causes' cures remove together.
        calibration: ``Calibration.to_dict()``: method, samples, source, disjoint, tensors.
        blocks: Runs of consecutive layers with the error each causes quantized alone
            (``quant.causes.Block.to_dict``), when the diagnosis failed.
        seconds: Wall time per stage.
    """

    target: str
    between: str
    objective: str
    passed: bool
    score: float
    metrics: dict
    layers: tuple[LayerMeasure, ...]
    causes: tuple[QuantCause, ...]
    explained_share: float
    calibration: dict = field(repr=False)
    blocks: tuple[dict, ...] = ()
    seconds: dict = field(default_factory=dict)
    evaluation_samples: int = 0

    @property
    def verdict(self) -> str:
        """One sentence: survives, or what breaks it."""
        fmt = self.target.upper()
        if self.passed:
            return f"survives {fmt} ({self.objective}, score {self.score:.3g})"
        if not self.causes:
            return f"does not survive {fmt} ({self.objective}, score {self.score:.3g})"
        kinds = sorted({c.kind for c in self.causes})
        return (f"does not survive {fmt}: {len(self.causes)} cause(s) ({', '.join(kinds)}) "
                f"explain {self.explained_share:.0%} of the error")

    def to_dict(self) -> dict:
        """JSON form (stable keys; timings under ``seconds``)."""
        return {"kind": "quantized-diagnosis", "target": self.target, "between": self.between,
                "objective": self.objective, "passed": self.passed,
                "score": json_float(self.score), "verdict": self.verdict,
                "metrics": self.metrics, "layers": [m.to_dict() for m in self.layers],
                "causes": [c.to_dict() for c in self.causes],
                "explained_share": json_float(self.explained_share),
                "blocks": list(self.blocks),
                "calibration": self.calibration,
                "evaluation": {"samples": self.evaluation_samples}, "seconds": self.seconds}


def diagnose_quantized(model: onnx.ModelProto, samples: Sequence, fmt: QuantFormat,
                       objective: Objective | None = None, calibrator: str = "max",
                       between: Between = Precision.FP16,
                       calibration: CalibrationSet | None = None,
                       progress: Progress | None = None) -> QuantDiagnosis:
    """Diagnose ``model`` quantized to ``fmt`` (module docstring).

    Args:
        model: FP32 model (nodes named).
        samples: Evaluation samples (``.feeds``).
        fmt: INT8 or FP8 (``quant.qformats.QUANT_FORMATS``).
        objective: Tolerance or task metric (default ``default_objective``).
        calibrator: Activation calibrator.
        between: Float precision of everything between the Q/DQ pairs (a format, or a plan
            naming FP32 nodes). When the quantized model fails, the float part alone (no layer
            quantized) is scored too: if it fails by itself, the first cause is
            ``float-between``, cured by FP32 between.
        calibration: Calibrate on these, apart from ``samples`` (default: ``samples``).
        progress: ``progress(stage, done, total)``.

    Returns:
        ``QuantDiagnosis``.

    Raises:
        UnsupportedModelError, InputError, BackendError: As ``setup``.
    """
    objective = objective or default_objective()
    s = setup(model, samples, fmt, calibrator, calibration, progress)
    t0 = time.perf_counter()
    measures, cand = measure_layers(s.model, s.units, s.config, s.calibration, samples,
                                    between, progress)
    t1 = time.perf_counter()
    score = objective.score(s.reference, cand)
    causes: list[QuantCause] = []
    explained, blocks = 0.0, []
    if not score.passed:
        found = find_causes(s.model, s.units, s.config, s.calibration, measures, samples,
                            s.reference, cand, between, progress=progress)
        causes, measures, explained = found.causes, found.measures, found.explained
        blocks = [b.to_dict() for b in found.blocks]
        floating = float_between_cause(s, samples, objective, between, cand)
        if floating is not None:  # the float part explains what the layers' cures do not
            causes = [floating] + [c for c in causes if c.kind != "unexplained"]
            explained = max(explained, floating.removed)
    causes.sort(key=lambda c: (c.kind != FLOAT_BETWEEN, -c.removed, c.units))
    metrics = {k: compute_metrics(s.reference[k], cand[k]).to_dict() for k in s.reference
               if s.reference[k] and s.reference[k][0].dtype.kind == "f"}
    value = float(score.value) if score.value is not None else math.nan
    return QuantDiagnosis(fmt.name, describe_between(between), objective.describe(),
                          bool(score.passed),
                          value, metrics, tuple(measures), tuple(causes), explained,
                          s.calibration.to_dict(), tuple(blocks),
                          {"calibrate": round(s.seconds, 3), "measure": round(t1 - t0, 3),
                           "causes": round(time.perf_counter() - t1, 3)}, len(samples))
