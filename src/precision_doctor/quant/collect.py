"""Calibration statistics: the FP32 model run on the calibration samples with every quantized
activation marked as an output, each folded into a streaming histogram of |x| and a per-channel
amax; then every calibrator's amax per tensor (``quant.calibrate``).

The samples stream: they are read once, one at a time (an image set as ``inputs.LazySamples``
decodes each image when it is read), and nothing of a sample is kept past its turn but the
histograms (2048 bins per tensor) and per-channel maxima: memory stays flat in the number of
calibration samples (``benchmarks/calibration_memory.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence, Sized

import numpy as np
import onnx

from precision_doctor.errors import InputError
from precision_doctor.graph.outputs import mark_outputs
from precision_doctor.jsonable import json_float
from precision_doctor.quant.calibrate import CALIBRATORS, AbsHistogram, calibrate_all
from precision_doctor.quant.placement import WEIGHT, QuantUnit
from precision_doctor.quant.qformats import QuantFormat
from precision_doctor.runners.ort import OrtRunner

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class Calibration:
    """Per-tensor activation ranges of the calibration samples.

    Attributes:
        method: The calibrator asked for (``max``, ``percentile``, ``entropy``, ``mse``).
        amax: Tensor -> the amax in use (float32 units of the tensor).
        choice: Tensor -> the calibrator that gave ``amax`` (``method`` unless a cure or
            ``fix`` chose another for that tensor).
        by_method: Calibrator -> tensor -> amax, every calibrator computed (one histogram).
        channel_amax: Tensor -> max |x| per channel along its site's channel axis.
        samples: Calibration samples seen.
        source: Where they come from (``CalibrationSet.source``).
        disjoint: No calibration sample is also evaluated.
    """

    method: str
    amax: dict[str, float]
    choice: dict[str, str]
    by_method: dict[str, dict[str, float]]
    channel_amax: dict[str, np.ndarray] = field(repr=False)
    samples: int = 0
    source: str = ""
    disjoint: bool = False

    def with_choice(self, tensor: str, method: str) -> Calibration:
        """The same calibration with ``tensor`` calibrated by ``method``."""
        from dataclasses import replace

        return replace(self, amax={**self.amax, tensor: self.by_method[method][tensor]},
                       choice={**self.choice, tensor: method})

    def with_method(self, method: str) -> Calibration:
        """Every tensor calibrated by ``method``."""
        return Calibration(method, dict(self.by_method[method]),
                           {t: method for t in self.amax}, self.by_method, self.channel_amax,
                           self.samples, self.source, self.disjoint)

    def channel_spread(self, tensor: str) -> float:
        """Largest channel amax over the median channel amax (1 = even; an outlier channel
        80x wider than the rest gives about 80). 1.0 without channel statistics."""
        ch = self.channel_amax.get(tensor)
        if ch is None or ch.size < 2:
            return 1.0
        med = float(np.median(ch))
        return float(ch.max() / med) if med > 0 else float("inf") if ch.max() > 0 else 1.0

    def summary(self) -> dict:
        """``{"method", "samples", "source", "disjoint"}``: the report's calibration object
        without the per-tensor ranges."""
        return {"method": self.method, "samples": self.samples, "source": self.source,
                "disjoint": self.disjoint}

    def to_dict(self) -> dict:
        """JSON form (per-channel arrays summarised by their spread)."""
        return {**self.summary(),
                "tensors": {t: {"amax": json_float(a), "calibrator": self.choice[t],
                                "by_calibrator": {m: json_float(self.by_method[m][t])
                                                  for m in self.by_method},
                                "channel_spread": json_float(self.channel_spread(t))}
                            for t, a in sorted(self.amax.items())}}


@dataclass(frozen=True)
class CalibrationSet:
    """Calibration samples apart from the evaluation samples, and where they come from.

    Attributes:
        samples: Samples (``.feeds``), read once, one at a time: any iterable (a
            ``inputs.LazySamples`` streams an image folder).
        source: Where they come from, for the report (a path, ``split of --data, seed 0``).
        disjoint: No calibration sample is also an evaluation sample.
    """

    samples: Iterable = field(repr=False)
    source: str = "calibration samples"
    disjoint: bool = True


def activation_axes(units: Sequence[QuantUnit]) -> dict[str, int | None]:
    """Every quantized activation tensor -> its channel axis (first site's), graph order."""
    out: dict[str, int | None] = {}
    for u in units:
        for s in u.sites:
            if s.kind != WEIGHT:
                out.setdefault(s.tensor, s.axis)
    return out


def collect(model: onnx.ModelProto, units: Sequence[QuantUnit], samples: Iterable,
            fmt: QuantFormat, method: str, percentile: float = 99.99,
            progress: Progress | None = None, *, reference: bool = True,
            source: str = "the evaluation samples", disjoint: bool = False
            ) -> tuple[Calibration, dict[str, list[np.ndarray]]]:
    """Run the FP32 model on ``samples`` and calibrate every quantized activation.

    Args:
        model: The FP32 model (at the Q/DQ opset).
        units: Its units (``quant.placement.place``).
        samples: Calibration samples (``.feeds``), read once in order; any iterable
            (``progress`` gets a total of 0 when it has no length).
        fmt: INT8 or FP8 (the calibrators that depend on the format's levels).
        method: The calibrator used for ``amax`` (``quant.calibrate.CALIBRATORS``).
        percentile: For the ``percentile`` calibrator, in percent (TensorRT's and ModelOpt's
            usual 99.99).
        progress: ``progress("calibrate", done, total)``.
        reference: Keep the model outputs of every sample (False for a calibration set
            apart from the evaluation samples: nothing per sample is kept then).
        source: ``Calibration.source``.
        disjoint: ``Calibration.disjoint``.

    Returns:
        The calibration, and the model outputs per sample (the FP32 reference of the same run;
        empty lists without ``reference``).

    Raises:
        InputError: ``method`` is not a calibrator.
        BackendError: ONNX Runtime fails.
    """
    if method not in CALIBRATORS:
        raise InputError(f"unknown calibrator {method!r}: use one of {', '.join(CALIBRATORS)}")
    axes = activation_axes(units)
    outputs = [o.name for o in model.graph.output]
    inputs = {i.name for i in model.graph.input}
    fetched = [t for t in axes if t not in outputs and t not in inputs]
    marked = mark_outputs(model, fetched)
    hists = {t: AbsHistogram() for t in axes}
    channels: dict[str, np.ndarray] = {}
    kept: dict[str, list[np.ndarray]] = {o: [] for o in outputs}
    total = len(samples) if isinstance(samples, Sized) else 0
    wanted = (outputs if reference else [o for o in outputs if o in axes]) + fetched
    seen = 0
    with OrtRunner(marked, name="ort-cpu-calibrate") as runner:
        for sample in samples:
            got = {**sample.feeds, **runner.run(sample.feeds, wanted)}
            for o in outputs if reference else ():
                kept[o].append(got[o])
            for t, axis in axes.items():
                x = np.asarray(got[t], np.float32)
                hists[t].add(x)
                if axis is not None and x.ndim >= 2:
                    ch = _channel_amax(x, axis)
                    channels[t] = ch if t not in channels or channels[t].shape != ch.shape \
                        else np.maximum(channels[t], ch)
            seen += 1
            del got, sample
            if progress:
                progress("calibrate", seen, total)
    if not seen:
        raise InputError("the calibration set holds no samples")
    by_method: dict[str, dict[str, float]] = {m: {} for m in CALIBRATORS}
    for t, h in hists.items():
        for m, a in calibrate_all(h, fmt, percentile).items():
            by_method[m][t] = float(a)
    amax = dict(by_method[method])
    return Calibration(method, amax, {t: method for t in amax}, by_method, channels, seen,
                       source, disjoint), kept


def _channel_amax(x: np.ndarray, axis: int) -> np.ndarray:
    axis = axis % x.ndim
    finite = np.where(np.isfinite(x), np.abs(x), 0.0)
    return np.max(finite, axis=tuple(i for i in range(x.ndim) if i != axis)).astype(np.float32)
