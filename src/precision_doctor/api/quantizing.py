"""``diagnose``/``fix`` with ``target="int8"`` or ``"fp8"``: quantization (``quant/``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import onnx

from precision_doctor.api.options import (
    DataLike,
    ModuleLike,
    Progress,
    ToleranceLike,
    as_model,
    as_samples,
    progress_reporter,
)
from precision_doctor.api.pytorch import module_input
from precision_doctor.errors import InputError
from precision_doctor.formats import Precision
from precision_doctor.graph.upcast import upcast
from precision_doctor.inputs import (
    SPLIT_SEED,
    PreprocessSpec,
    Sample,
    open_samples,
    pick,
    split_indices,
)
from precision_doctor.jsonable import dumps
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.quant.collect import CalibrationSet
from precision_doctor.quant.diagnose import QuantDiagnosis, default_objective
from precision_doctor.quant.diagnose import diagnose_quantized as run_diagnosis
from precision_doctor.quant.fix import QuantFix
from precision_doctor.quant.fix import fix_quantized as run_fix
from precision_doctor.quant.qformats import QuantFormat, parse_quant_target
from precision_doctor.repair.holdout import check_quantized, split_holdout
from precision_doctor.search.objective import Objective, Score


@dataclass(frozen=True)
class QuantizedDiagnosis:
    """What ``diagnose(target="int8"|"fp8")`` found (``quant.diagnose.QuantDiagnosis``).

    Attributes:
        result: Per-layer SQNR, clipped/zeroed shares, channel spread, causes with cures.
        model: ``{"input": path}`` of the diagnosed model.
    """

    result: QuantDiagnosis
    model: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.result.passed

    @property
    def target(self) -> str:
        return self.result.target

    @property
    def verdict(self) -> str:
        return "pass" if self.passed else "fail"

    def to_dict(self) -> dict:
        """The JSON report."""
        return {**self.result.to_dict(), "model": self.model}

    def to_json(self, path: str | os.PathLike, force: bool = False) -> Path:
        """Write the JSON report atomically (``force`` to overwrite)."""
        from precision_doctor.report.files import write_json

        return write_json(path, self.to_dict(), force)


@dataclass(frozen=True)
class QuantizedFix:
    """What ``fix(target="int8"|"fp8")`` produced; nothing is on disk until :meth:`save`.

    Attributes:
        model: The Q/DQ model (FP16 between the pairs, FP32 inputs and outputs).
        result: Scores, unquantized layers, calibrator, SmoothQuant, recipes.
        report: The JSON report.
    """

    model: onnx.ModelProto = field(repr=False)
    result: QuantFix
    report: dict

    @property
    def passed(self) -> bool:
        """The written model meets the target, on the held-out samples too
        (``report["verdict"]``)."""
        return self.report.get("verdict", "pass" if self.result.passed else "fail") == "pass"

    def save(self, path: str | os.PathLike, force: bool = False) -> list[Path]:
        """Write the model, ``<stem>.report.json`` and ``<stem>.recipes.md`` atomically.

        Raises:
            OutputPathError: A file exists (without ``force``) or cannot be written.
        """
        from precision_doctor.report.files import check_writable, write_model, write_text_atomic

        stem = Path(path).with_suffix("")
        report, recipes = Path(f"{stem}.report.json"), Path(f"{stem}.recipes.md")
        check_writable([path, report, recipes], force)
        write_model(path, self.model, force)
        write_text_atomic(report, dumps(self.report), force)
        lines = [f"# Engine recipes for {Path(path).name} ({self.result.target.upper()} Q/DQ, "
                 f"{self.result.between.upper()} between)", "",
                 "Untested here: TensorRT cannot run on the machine that wrote this model.", ""]
        lines += [f"    {r}" for r in self.result.recipes]
        write_text_atomic(recipes, "\n".join(lines) + "\n", force)
        return [Path(path), report, recipes]


def _float_fix(model: onnx.ModelProto, samples: Sequence, objective: Objective
               ) -> PrecisionPlan:
    """The FP16 plan (FP32 nodes kept) ``fix --target fp16`` finds for the prepared model:
    what the float part between the Q/DQ pairs needs when FP16 alone fails the target."""
    from precision_doctor.repair.pipeline import fix as fix_float

    return fix_float(model, samples, Precision.FP16, objective, rewrites=[]).plan


def _inputs(model: ModuleLike, data: DataLike, target: str,
            preprocess: PreprocessSpec | str | None, max_samples: int | None,
            tolerance: ToleranceLike, metric: str | None, threshold: float | None,
            calibration: DataLike | None = None, split_seed: int = SPLIT_SEED
            ) -> tuple[QuantFormat, onnx.ModelProto, str | None, list, Objective, CalibrationSet]:
    """The format, model, evaluation samples, objective and calibration set of a quantized
    diagnosis or fix.

    Raises:
        InputError: ``target`` is not a quantized format, or bad data/tolerance/metric.
    """
    from precision_doctor.api.options import build_objective

    fmt = parse_quant_target(target)
    if fmt is None:
        raise InputError(f"{target!r} is not a quantized format: use int8, fp8 or fp8e5m2")

    model, data, _exported = module_input(model, data, max_samples)  # a torch.nn.Module too
    proto, path = as_model(model)
    proto, _shipped = upcast(proto)
    if calibration is None:
        samples, calib = split_data(data, proto, preprocess, max_samples, split_seed)
    else:
        samples = as_samples(data, proto, preprocess, max_samples)
        calib = calibration_set(calibration, proto, preprocess, data)
    objective = (build_objective(tolerance, metric, threshold, Precision.FP16)
                 if tolerance or metric or threshold is not None else default_objective())
    return fmt, proto, path, samples, objective, calib


def _stream(data: DataLike, proto: onnx.ModelProto, preprocess: PreprocessSpec | str | None,
            max_samples: int | None = None) -> Sequence[Sample]:
    """Samples of ``data``: a path source through ``inputs.open_samples`` (an image folder
    streamed), in-memory data validated as ``as_samples`` does."""
    if isinstance(data, (str, os.PathLike)):
        from precision_doctor.graph.load import input_metadata

        return open_samples(data, input_metadata(proto), preprocess, max_samples)
    return as_samples(data, proto, preprocess, max_samples)


def split_data(data: DataLike, proto: onnx.ModelProto, preprocess: PreprocessSpec | str | None,
               max_samples: int | None, seed: int = SPLIT_SEED
               ) -> tuple[list[Sample], CalibrationSet]:
    """One sample set split into evaluation samples (in memory) and a calibration set
    (streamed), by ``inputs.split_indices``: disjoint halves, seeded; a single sample
    calibrates and evaluates (``disjoint`` False, said in ``source``).

    Raises:
        InputError, DataFormatError, InputNameError, InputShapeError: As ``as_samples``.
    """
    every = _stream(data, proto, preprocess, max_samples)
    if not len(every):
        raise InputError("data holds no samples: give at least one")
    split = split_indices(len(every), seed)
    evaluation = list(pick(every, split.evaluation))
    source = (f"split of --data, seed {seed}" if split.disjoint else
              "--data (1 sample: nothing to split, it calibrates and evaluates)")
    return evaluation, CalibrationSet(pick(every, split.calibration), source, split.disjoint)


def calibration_set(calibration: DataLike, proto: onnx.ModelProto,
                    preprocess: PreprocessSpec | str | None, data: DataLike | None = None
                    ) -> CalibrationSet:
    """``calibration`` as a streamed calibration set: a path source (as ``--data``, with the
    same ``preprocess``; an image folder decoded one image at a time), samples in memory, or
    an iterator of feed dicts/arrays, each validated when it is read. ``disjoint`` is False
    when it names the same path as ``data``.

    Raises:
        InputError, DataFormatError, InputNameError, InputShapeError: As ``as_samples``.
    """
    if isinstance(calibration, (str, os.PathLike)):
        same = isinstance(data, (str, os.PathLike)) and \
            os.path.realpath(calibration) == os.path.realpath(data)
        return CalibrationSet(_stream(calibration, proto, preprocess), os.fspath(calibration),
                              not same)
    if isinstance(calibration, Iterator):
        items = calibration
        return CalibrationSet((as_samples([x], proto)[0] for x in items), "iterator in memory")
    return CalibrationSet(as_samples(calibration, proto), "samples in memory",
                          calibration is not data)


def diagnose_quantized(model: ModuleLike, data: DataLike, *, target: str = "int8",
                             preprocess: PreprocessSpec | str | None = None,
                             tolerance: ToleranceLike = None, metric: str | None = None,
                             threshold: float | None = None, calibrator: str = "max",
                             max_samples: int | None = None, progress: Progress | None = None,
                             quiet: bool = False, calibration: DataLike | None = None,
                             split_seed: int = SPLIT_SEED) -> QuantizedDiagnosis:
    """Diagnose ``model`` quantized to INT8 or FP8 (E4M3) on ``data``.

    Q/DQ placement follows TensorRT's explicit-quantization rules (``quant.placement``),
    weights per output channel, activations per tensor calibrated on ``calibration`` (apart
    from the evaluation samples ``data``; without it, a seeded half of ``data``:
    :func:`split_data`); everything between runs in FP16; ONNX Runtime CPU runs the exact
    emulation. ``report["calibration"]`` states the calibration samples, their source and
    whether they are disjoint from the ``report["evaluation"]["samples"]`` evaluated.

    Args:
        model: The FP32 model (path, proto or ``onnx_ir.Model``).
        data: Evaluation samples, as for :func:`precision_doctor.diagnose`.
        target: ``int8`` or ``fp8`` (``fp8e5m2`` for E5M2).
        preprocess: Image preprocessing, as for :func:`precision_doctor.diagnose`.
        tolerance: Output tolerance; default relative L2 <= 0.1
            (``quant.diagnose.DEFAULT_TOLERANCE``).
        metric: Task metric instead (as for :func:`precision_doctor.fix`).
        threshold: Pass mark of ``metric``.
        calibrator: ``max``, ``percentile`` (99.99), ``entropy`` (TensorRT's KL) or ``mse``.
        max_samples: Use the first N samples of ``data`` (before the split).
        progress: ``progress(stage, done, total)`` callback.
        quiet: No progress output.
        calibration: Calibration samples, in the forms of ``data`` (with the same
            ``preprocess``), or an iterator of feed dicts/arrays; streamed one sample at a
            time (an image folder is decoded image by image), every one used.
        split_seed: Seed of the split of ``data`` when ``calibration`` is None.

    Returns:
        :class:`QuantizedDiagnosis`.

    Raises:
        InputError: Unknown target or calibrator, bad data.
        ModelLoadError, UnsupportedModelError, BackendError: As for ``diagnose``.
    """
    fmt, proto, path, samples, objective, calib = _inputs(
        model, data, target, preprocess, max_samples, tolerance, metric, threshold,
        calibration, split_seed)
    with progress_reporter(progress, quiet) as callback:
        result = run_diagnosis(proto, samples, fmt, objective, calibrator, calibration=calib,
                               progress=callback)
    return QuantizedDiagnosis(result, {"input": path})


def fix_quantized(model: ModuleLike, data: DataLike, *, target: str = "int8",
                        preprocess: PreprocessSpec | str | None = None,
                        tolerance: ToleranceLike = None, metric: str | None = None,
                        threshold: float | None = None, calibrator: str = "max",
                        rewrites: bool = True, max_samples: int | None = None,
                        max_evals: int = 60, progress: Progress | None = None,
                        quiet: bool = False, holdout: int | None = None,
                        calibration: DataLike | None = None,
                        split_seed: int = SPLIT_SEED) -> QuantizedFix:
    """Write the INT8/FP8 Q/DQ model with the fewest layers left in FP16 that meets the
    target: calibrators compared, SmoothQuant (alpha searched), then the accuracy search;
    the written model verified by its exact emulation on ONNX Runtime CPU. When the model
    fails the target in FP16 alone (no layer quantized), the FP16 search of
    :func:`precision_doctor.fix` first finds the nodes it needs in FP32, and they stay FP32
    between the Q/DQ pairs (``report["float_fp32"]``). Calibration and evaluation samples are
    apart, as in :func:`diagnose_quantized`; ``report["quantized_share"]`` gives the share of
    MACs and parameters in INT8/FP8 (``search.cost.quantized_share``).

    Args:
        model: The FP32 model (path, proto or ``onnx_ir.Model``).
        data: Evaluation samples (the search scores them), as for :func:`precision_doctor.fix`.
        target: ``int8`` or ``fp8`` (``fp8e5m2`` for E5M2).
        preprocess: Image preprocessing.
        tolerance: Output tolerance; default relative L2 <= 0.1.
        metric: Task metric instead (``top1``, ``ctc-string``, ``box-map`` ...).
        threshold: Pass mark of ``metric``.
        calibrator: The starting calibrator.
        rewrites: Try the other calibrators and SmoothQuant before the search.
        max_samples: Use the first N samples of ``data`` (before the split).
        max_evals: Search budget in evaluations.
        progress: ``progress(stage, done, total)`` callback.
        quiet: No progress output.
        holdout: Keep this many samples out of calibration and search, and score the written
            model on them (``report["holdout"]``; ``report["verdict"]`` is ``overfits`` when
            they fail and the others pass). None: one in 10 from 8 samples up
            (``repair.holdout.default_holdout``); 0: no check.
        calibration: Calibration samples, as for :func:`diagnose_quantized`.
        split_seed: Seed of the split of ``data`` when ``calibration`` is None.

    Returns:
        :class:`QuantizedFix` (``.save(path)`` writes the model, report and recipes).

    Raises:
        TargetNotMetError: Not even every layer in FP16 meets the target.
        InputError, ModelLoadError, UnsupportedModelError, BackendError: As above.
    """
    fmt, proto, path, samples, objective, calib = _inputs(
        model, data, target, preprocess, max_samples, tolerance, metric, threshold,
        calibration, split_seed)
    split = split_holdout(samples, holdout)  # held out of calibration and search alike
    samples = list(split.search)
    with progress_reporter(progress, quiet) as callback:
        result = run_fix(proto, samples, fmt, objective, calibrator,
                         max_evals=max_evals, rewrites=rewrites, calibration=calib,
                         progress=callback, float_fix=_float_fix)
    check = check_quantized(proto, result.model, split, objective,
                            Score(result.passed, result.score_after, {}))
    report: dict[str, Any] = {**result.to_dict(), "model": {"input": path},
                              "holdout": check.to_dict(), "verdict": "overfits"
                              if check.overfits else "pass" if result.passed else "fail"}
    return QuantizedFix(result.model, result, report)
