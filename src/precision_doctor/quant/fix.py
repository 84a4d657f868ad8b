"""``fix --target int8|fp8``: the fewest layers left unquantized (FP16) that meet the target,
after the rewrites that remove the need for some of them; a Q/DQ model written and verified.

    setup (opset, units, calibration; the FP32 nodes FP16 needs, when it fails alone)
      -> calibrator choice (each calibrator for every tensor) -> SmoothQuant (alpha searched)
      -> per-tensor calibrators (the noisiest layers' inputs, measured)
      -> search (``search.bisection``: ranking, bisection, ddmin over units)
      -> write (Q/DQ + strongly typed FP16) -> verify (exact emulation of the written model)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np
import onnx

from precision_doctor.errors import TargetNotMetError
from precision_doctor.formats import Precision
from precision_doctor.jsonable import json_float
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.quant.calibrate import CALIBRATORS
from precision_doctor.quant.collect import CalibrationSet
from precision_doctor.quant.diagnose import QuantSetup, default_objective, setup
from precision_doctor.quant.emulation import (
    EMULATION_OPTIMIZATION,
    Between,
    as_plan,
    describe_between,
    quantized_model,
    run_config,
)
from precision_doctor.quant.measure import measure_layers
from precision_doctor.quant.qdq import QuantConfig, insert_qdq
from precision_doctor.quant.qformats import QuantFormat
from precision_doctor.quant.smooth import smoothquant
from precision_doctor.runners.ort import OrtRunner
from precision_doctor.search.bisection import search_fp32_set
from precision_doctor.search.cost import quantized_share
from precision_doctor.search.objective import Objective, Score

Progress = Callable[[str, int, int], None]
FloatFix = Callable[[onnx.ModelProto, Sequence, Objective], PrecisionPlan]
SMOOTH_ALPHAS = (0.5, 0.75, 0.25)  # SmoothQuant's default first (Xiao et al. 2023, sec. 4)
PER_TENSOR_LAYERS = 4  # layers whose inputs try every calibrator (3 evaluations per input)


@dataclass(frozen=True)
class QuantFix:
    """What ``fix --target int8|fp8`` found and wrote.

    Attributes:
        model: The written Q/DQ model (FP16 between the pairs, FP32 inputs/outputs).
        target / between / objective: As in ``QuantDiagnosis``.
        passed: The written model meets the objective in its exact emulation.
        score_before: The objective on every layer quantized with the requested calibrator.
        score_after: The objective on the written model (verified).
        units: Quantizable units.
        unquantized: Units the search left in FP16, ranked.
        calibrator: The calibrator chosen for every tensor.
        per_tensor: Tensor -> another calibrator, where trying it on the noisiest layers'
            inputs scored better (``_per_tensor``).
        calibrators: Calibrator -> score with every unit quantized.
        smoothquant: ``{"alpha", "units", "score"}`` when applied, else None.
        evaluations: Search evaluations.
        verified_by: The runner that verified the written model.
        recipes: Engine commands for the written model.
        float_fp32: Nodes kept in FP32 between the pairs (the float part alone failed the
            objective in FP16; ``float_fix`` found them), sorted.
        seconds: Wall time per stage.
        calibration: ``Calibration.summary()``: method asked for, samples, source, disjoint.
        evaluation_samples: Samples every evaluation (search, verification) scores.
        quantized_share: ``search.cost.quantized_share`` of the written model: the share of
            MACs and of parameters that run in INT8/FP8, next to the layer counts.
    """

    model: onnx.ModelProto = field(repr=False)
    target: str
    between: str
    objective: str
    passed: bool
    score_before: float
    score_after: float
    units: int
    unquantized: tuple[str, ...]
    calibrator: str
    per_tensor: dict
    calibrators: dict
    smoothquant: dict | None
    evaluations: int
    verified_by: str
    recipes: tuple[str, ...]
    float_fp32: tuple[str, ...]
    seconds: dict
    calibration: dict = field(default_factory=dict)
    evaluation_samples: int = 0
    quantized_share: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON form (the model itself is saved apart)."""
        return {"kind": "quantized-fix", "target": self.target, "between": self.between,
                "objective": self.objective, "passed": self.passed,
                "score_before": json_float(self.score_before),
                "score_after": json_float(self.score_after), "units": self.units,
                "unquantized": list(self.unquantized), "calibrator": self.calibrator,
                "per_tensor": dict(sorted(self.per_tensor.items())),
                "calibrators": {k: json_float(v) for k, v in self.calibrators.items()},
                "smoothquant": self.smoothquant, "evaluations": self.evaluations,
                "verified_by": self.verified_by, "recipes": list(self.recipes),
                "float_fp32": list(self.float_fp32),
                "calibration": self.calibration,
                "evaluation": {"samples": self.evaluation_samples},
                "quantized_share": {k: json_float(v) if isinstance(v, float) else v
                                    for k, v in self.quantized_share.items()},
                "seconds": self.seconds}


class _Scorer:
    def __init__(self, s: QuantSetup, samples: Sequence, objective: Objective,
                 between: Between) -> None:
        self.s, self.samples, self.objective, self.between = s, samples, objective, between

    def __call__(self, config: QuantConfig) -> Score:
        out = run_config(self.s.model, self.s.units, config, self.samples, self.between)
        return self.objective.score(self.s.reference, out)


def fix_quantized(model: onnx.ModelProto, samples: Sequence, fmt: QuantFormat,
                  objective: Objective | None = None, calibrator: str = "max",
                  between: Between = Precision.FP16, max_evals: int = 60,
                  rewrites: bool = True, calibration: CalibrationSet | None = None,
                  progress: Progress | None = None,
                  float_fix: FloatFix | None = None) -> QuantFix:
    """Find and write the Q/DQ model with the fewest unquantized layers (module docstring).

    Args:
        model: FP32 model (nodes named).
        samples: Evaluation samples (``.feeds``); every evaluation uses all of them.
        fmt: INT8 or FP8.
        objective: Tolerance or task metric (default ``quant.diagnose.default_objective``).
        calibrator: The starting calibrator (the others are tried when it fails).
        between: Float precision between the Q/DQ pairs (a format, or a plan with FP32
            nodes).
        max_evals: Search budget in evaluations.
        rewrites: Try other calibrators and SmoothQuant before the search.
        calibration: Calibrate on these, apart from ``samples`` (default: ``samples``).
        progress: ``progress(stage, done, total)``.
        float_fix: ``(prepared model, samples, objective) -> plan``: called when the float
            part alone (no layer quantized) fails the objective, to find the nodes it needs in
            FP32 (the API passes ``fix --target fp16``'s search, ``repair.pipeline.fix``);
            the quantized search then runs with that plan between.

    Returns:
        ``QuantFix``.

    Raises:
        TargetNotMetError: Not even every unit in FP16 meets the target.
        UnsupportedModelError, InputError, BackendError: As ``quant.diagnose.setup``.
    """
    objective = objective or default_objective()
    t0 = time.perf_counter()
    s = setup(model, samples, fmt, calibrator, calibration, progress)
    config = s.config
    if float_fix is not None and not _Scorer(s, samples, objective, between)(
            config.with_quantized(frozenset())).passed:
        between = float_fix(s.model, samples, objective)
    score = _Scorer(s, samples, objective, between)
    before = score(config)
    best, tried, chosen, smooth = before, {calibrator: before.value}, calibrator, None
    per_tensor: dict[str, str] = {}
    t1 = time.perf_counter()
    if rewrites and not best.passed:
        for method in CALIBRATORS:
            if method == calibrator:
                continue
            trial = score(replace(config, amax=s.calibration.with_method(method).amax))
            tried[method] = trial.value
            if objective.better(trial, best):
                best, chosen = trial, method
        config = replace(config, amax=s.calibration.with_method(chosen).amax)
        if not best.passed:
            for alpha in SMOOTH_ALPHAS:
                smoothed = smoothquant(s.model, s.units, config, s.calibration, alpha)
                if smoothed is None:
                    break
                trial = score(smoothed)
                if objective.better(trial, best):
                    best, config = trial, smoothed
                    smooth = {"alpha": alpha, "units": sorted(smoothed.smooth),
                              "score": json_float(trial.value)}
                if best.passed:
                    break
        if not best.passed:
            best, config, per_tensor = _per_tensor(s, config, samples, between, score, best,
                                                   chosen)
    t2 = time.perf_counter()
    unquantized: tuple[str, ...] = ()
    evaluations = 0
    if not best.passed:
        unquantized, evaluations = _search(s, config, samples, objective, between, max_evals,
                                           progress)
    final = config.with_quantized(config.quantized - set(unquantized))
    t3 = time.perf_counter()
    written, verified, by = write_and_verify(s, final, samples, objective, between)
    share = quantized_share(written, {k: v.shape for k, v in samples[0].feeds.items()})
    return QuantFix(written, fmt.name, describe_between(between), objective.describe(),
                    bool(verified.passed), float(before.value), float(verified.value),
                    len(s.units), unquantized, chosen, per_tensor, tried, smooth, evaluations,
                    by,
                    recipes(), tuple(as_plan(between).fp32_nodes()),
                    {"calibrate": round(s.seconds, 3),
                                   "rewrites": round(t2 - t1, 3), "search": round(t3 - t2, 3),
                                   "write_verify": round(time.perf_counter() - t3, 3),
                                   "total": round(time.perf_counter() - t0, 3)},
                    s.calibration.summary(), len(samples), share)


def _per_tensor(s: QuantSetup, config: QuantConfig, samples: Sequence, between: Between,
                score: _Scorer, best: Score, chosen: str
                ) -> tuple[Score, QuantConfig, dict[str, str]]:
    """Per-tensor calibrator choice, measured: the inputs of the ``PER_TENSOR_LAYERS`` layers
    adding the most noise (one measuring pass) each try the calibrators whose amax differs by
    more than 5% from the one in use; a choice is kept when the whole model scores better."""
    measures, _out = measure_layers(s.model, s.units, config, s.calibration, samples, between)
    noisy = sorted((m for m in measures if m.quantized),
                   key=lambda m: (-m.added_noise, -m.injected_noise, m.unit))
    unit_of = {u.name: u for u in s.units}
    choice: dict[str, str] = {}
    for m in noisy[:PER_TENSOR_LAYERS]:
        for site in unit_of[m.unit].activation_sites:
            t = site.tensor
            if t in choice or t not in config.amax:
                continue
            for method in CALIBRATORS:
                amax = s.calibration.by_method[method].get(t)
                current = config.amax[t]
                if method == chosen or amax is None or abs(amax - current) <= 0.05 * current:
                    continue
                trial = score(replace(config, amax={**config.amax, t: amax}))
                if score.objective.better(trial, best):
                    best, config, choice[t] = trial, replace(config, amax={**config.amax,
                                                                           t: amax}), method
            if best.passed:
                return best, config, choice
    return best, config, choice


def _search(s: QuantSetup, config: QuantConfig, samples: Sequence, objective: Objective,
            between: Between, max_evals: int, progress: Progress | None
            ) -> tuple[tuple[str, ...], int]:
    """The fewest units to leave in FP16: ``search.bisection`` over units, where a plan's
    FP32 overrides name the units left unquantized."""
    def open_plan(plan: PrecisionPlan, threads: int = 0) -> OrtRunner:
        left = frozenset(plan.overrides)
        emulated = quantized_model(s.model, s.units, config.with_quantized(
            config.quantized - left), between)
        return OrtRunner(emulated, name="quant-emulate", intra_op_threads=threads,
                         graph_optimization=EMULATION_OPTIMIZATION)

    def ranking(_: Score) -> list[str]:
        measures, _out = measure_layers(s.model, s.units, config, s.calibration, samples,
                                        between)
        ranked = sorted((m for m in measures if m.quantized),
                        key=lambda m: (-m.added_noise, -m.injected_noise, m.unit))
        return [m.unit for m in ranked]

    try:
        result = search_fp32_set(open_plan, samples, s.reference, objective,
                                 PrecisionPlan(Precision.FP16), ranking, max_evals, progress)
    except TargetNotMetError as exc:
        raise TargetNotMetError(f"{exc} (INT8/FP8: every layer was left in "
                                f"{describe_between(between).upper()}; the float precision "
                                "between the Q/DQ pairs fails the target by itself: "
                                "diagnose it with --target fp16)", **exc.context) from exc
    return result.kept, result.evaluations


def write_and_verify(s: QuantSetup, config: QuantConfig, samples: Sequence,
                     objective: Objective, between: Between
                     ) -> tuple[onnx.ModelProto, Score, str]:
    """Write ``config`` as a Q/DQ model (strongly typed ``between`` elsewhere) and score its
    exact emulation (``runners.emulator.WrittenEmulatorRunner``) against the reference."""
    from precision_doctor.precision.writer import write_mixed_precision
    from precision_doctor.runners.emulator import WrittenEmulatorRunner

    qdq = insert_qdq(s.model, s.units, config)
    plan = as_plan(between)
    if plan.default is Precision.FP32 and not plan.overrides:
        written = qdq
    else:
        written, _report = write_mixed_precision(qdq, plan)
    names = [o.name for o in s.model.graph.output]
    out: dict[str, list[np.ndarray]] = {n: [] for n in names}
    with WrittenEmulatorRunner(written, graph_optimization=EMULATION_OPTIMIZATION) as runner:
        for sample in samples:
            got = runner.run(sample.feeds)
            for n in names:
                out[n].append(np.asarray(got[n], np.float32) if got[n].dtype.kind == "f"
                              else got[n])
        by = runner.name
    return written, objective.score(s.reference, out), by


def recipes() -> tuple[str, ...]:
    """Engine commands for the written Q/DQ model (TensorRT's explicit quantization with
    strong typing; ONNX Runtime's QDQ path). Untested here: TensorRT cannot run on this
    machine."""
    return ("trtexec --onnx=model.onnx --stronglyTyped --saveEngine=model.engine",
            "python -c \"import onnxruntime as ort; ort.InferenceSession('model.onnx', "
            "providers=['TensorrtExecutionProvider', 'CUDAExecutionProvider'])\"")
