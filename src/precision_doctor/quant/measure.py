"""Per-layer measurements of a quantized model against its FP32 reference, in one pass over the
samples: the FP32 model and the quantized emulation run side by side with every unit's output
(and, in the reference, every quantized activation) marked.

Per unit:

* **input SQNR**: signal-to-quantization-noise ratio of its activations alone, the FP32 value
  against its own Q/DQ under the scale in use (local: no upstream error);
* **weight SQNR**: the same for its weights, per output channel;
* **output SQNR**: its output in the quantized emulation against FP32 (accumulated: everything
  upstream included); **arriving SQNR** the same for its inputs before its own Q/DQ;
* **clipped share**: activation values beyond the amax (saturated by Q);
* **zeroed share**: non-zero activation values that quantize to zero (below half a step for
  INT8; below FP8's smallest subnormal over two);
* **channel spread**: largest channel amax over the median (``Calibration.channel_spread``).

SQNR = 10 log10(sum x^2 / sum (x - x_q)^2), in dB (``quant.qformats.sqnr_db``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.formats import Precision
from precision_doctor.graph.constants import constant_values
from precision_doctor.graph.outputs import mark_outputs
from precision_doctor.jsonable import json_float
from precision_doctor.quant.collect import Calibration
from precision_doctor.quant.emulation import EMULATION_OPTIMIZATION, Between, quantized_model
from precision_doctor.quant.placement import WEIGHT, QuantUnit
from precision_doctor.quant.qdq import QuantConfig, smooth_weight, weight_channel_amax
from precision_doctor.quant.qformats import fake_quant
from precision_doctor.runners.ort import OrtRunner

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class LayerMeasure:
    """What quantization does at one unit (module docstring for each quantity).

    ``error_share`` and ``cure`` are filled by ``quant.causes`` for the units it tried:
    the output error power this unit's quantization causes alone, as a share of the error
    power with every unit quantized; and the share of that error removed by leaving only this
    unit unquantized.
    """

    unit: str
    op_type: str
    quantized: bool
    input_sqnr_db: float
    weight_sqnr_db: float | None
    output_sqnr_db: float
    clipped_share: float
    zeroed_share: float
    channel_spread: float
    amax: float
    calibrator: str
    depthwise: bool
    after: str
    arriving_sqnr_db: float = math.inf
    error_share: float | None = None
    cure: float | None = None

    def to_dict(self) -> dict:
        """JSON form (non-finite floats as strings)."""
        return {k: json_float(v) for k, v in asdict(self).items()}

    @property
    def added_noise(self) -> float:
        """Relative noise power the unit adds to what reaches it: its output's minus its
        inputs' (as they arrive, before its own Q/DQ), from the output and arriving SQNR; the
        search's ranking key (a layerwise gain, measured once)."""
        return max(0.0, _power(self.output_sqnr_db) - _power(self.arriving_sqnr_db))

    @property
    def injected_noise(self) -> float:
        """Relative noise power this unit's quantization injects locally (inputs + weights):
        10^(-SQNR/10) summed; the sensitivity ranking's first key."""
        return sum(_power(db) for db in (self.input_sqnr_db, self.weight_sqnr_db)
                   if db is not None and not math.isnan(db))


def _power(db: float) -> float:
    """Relative noise power of an SQNR in dB (inf dB: 0; -inf or NaN: 1, all noise)."""
    if math.isnan(db) or db == -math.inf:
        return 1.0
    return 0.0 if db == math.inf else 10 ** (-db / 10)


class _Sum:
    """Running signal and noise power of one tensor."""

    def __init__(self) -> None:
        self.signal = self.noise = 0.0
        self.count = self.clipped = self.zeroed = self.nonzero = 0
        self.bad = False

    def add(self, ref: np.ndarray, cand: np.ndarray) -> None:
        r = ref.astype(np.float64).ravel()
        c = cand.astype(np.float64).ravel()
        if not np.isfinite(c).all():
            self.bad = True
        d = np.where(np.isfinite(c), r - c, 0.0)
        self.signal += float(r @ r)
        self.noise += float(d @ d)
        self.count += r.size

    def sqnr(self) -> float:
        if self.bad:
            return -math.inf
        if self.noise == 0:
            return math.inf
        if self.signal == 0:
            return -math.inf
        return 10 * math.log10(self.signal / self.noise)


def weight_sqnr(model: onnx.ModelProto, unit: QuantUnit, config: QuantConfig,
                weights: Mapping[str, np.ndarray] | None = None) -> float | None:
    """SQNR (dB) of ``unit``'s weights under per-channel quantization (None: no weights).
    ``weights``: ``graph.constants.constant_values(model)`` when the caller has it."""
    values = constant_values(model) if weights is None else weights
    acc = _Sum()
    for site in unit.weight_sites:
        if site.tensor not in values or site.axis is None:
            continue
        w = np.asarray(values[site.tensor], np.float32)
        if unit.name in config.smooth:
            w = smooth_weight(w, unit, site, config.smooth[unit.name])
        scale = config.fmt.scale_for(weight_channel_amax(w, site.axis))
        acc.add(w, fake_quant(w, np.asarray(scale, np.float32), config.fmt, axis=site.axis))
    return acc.sqnr() if acc.count else None


def measure_layers(model: onnx.ModelProto, units: Sequence[QuantUnit], config: QuantConfig,
                   calibration: Calibration, samples: Sequence,
                   between: Between = Precision.FP16, progress: Progress | None = None
                   ) -> tuple[list[LayerMeasure], dict[str, list[np.ndarray]]]:
    """Measure every unit of ``config``'s quantized model on ``samples``.

    Args:
        model: The FP32 model (at the Q/DQ opset).
        units: Its units; those not in ``config.quantized`` are measured too (their output
            SQNR shows what reaches them), with ``quantized=False``.
        config: Scales in use.
        calibration: The calibration (calibrator per tensor, channel spread).
        samples: Samples (``.feeds``).
        between: The float precision between the Q/DQ pairs.
        progress: ``progress("measure", done, total)``.

    Returns:
        ``(per-unit measures in graph order, the quantized model's outputs per sample)``.

    Raises:
        BackendError: ONNX Runtime fails.
    """
    fmt = config.fmt
    outputs = [o.name for o in model.graph.output]
    first_output = {n.name: n.output[0] for n in model.graph.node}
    unit_out = {u.name: first_output[u.name] for u in units}
    acts = {s.tensor: s for u in units for s in u.sites if s.kind != WEIGHT}
    inputs = {i.name for i in model.graph.input}
    ref_marks = [m for m in dict.fromkeys(list(acts) + list(unit_out.values()))
                 if m not in inputs]
    reference = mark_outputs(model, [m for m in ref_marks if m not in outputs])
    tracked = list(dict.fromkeys([*unit_out.values(), *(t for t in acts if t not in inputs)]))
    candidate = quantized_model(model, units, config, between, tracked)
    local = {t: _Sum() for t in acts}
    accumulated = {t: _Sum() for t in tracked}  # unit outputs and arriving activations
    cand_out: dict[str, list[np.ndarray]] = {o: [] for o in outputs}
    with OrtRunner(reference, name="ort-cpu-layers") as ref_run, \
            OrtRunner(candidate, name="quant-emulate-layers",
                      graph_optimization=EMULATION_OPTIMIZATION) as cand_run:
        for k, sample in enumerate(samples):
            r = {**sample.feeds,
                 **ref_run.run(sample.feeds, list(dict.fromkeys(outputs + ref_marks)))}
            c = cand_run.run(sample.feeds, list(dict.fromkeys(outputs + list(accumulated))))
            for o in outputs:
                cand_out[o].append(c[o].astype(np.float32) if c[o].dtype.kind == "f" else c[o])
            for t, acc in accumulated.items():
                acc.add(r[t], c[t])
            for t, acc in local.items():
                x = np.asarray(r[t], np.float32)
                amax = calibration.amax.get(t, 0.0)
                scale = np.float32(fmt.scale_for(amax))
                q = fake_quant(x, scale, fmt)
                acc.add(x, q)
                ax = np.abs(x)
                # beyond FP32 run-to-run noise (the calibration run had other outputs marked)
                acc.clipped += int(np.count_nonzero(ax > amax * (1 + 1e-6)))
                nz = ax > 0
                acc.nonzero += int(np.count_nonzero(nz))
                acc.zeroed += int(np.count_nonzero(nz & (q == 0)))
            if progress:
                progress("measure", k + 1, len(samples))
    measures = []
    weights = constant_values(model)
    for u in units:
        sites = [s for s in u.sites if s.kind != WEIGHT]
        ins = [local[s.tensor] for s in sites]
        arriving = [accumulated[s.tensor].sqnr() for s in sites if s.tensor in accumulated]
        worst = min(sites, key=lambda s: local[s.tensor].sqnr()) if sites else None
        measures.append(LayerMeasure(
            u.name, u.op_type, u.name in config.quantized,
            min((a.sqnr() for a in ins), default=math.inf),
            weight_sqnr(model, u, config, weights), accumulated[unit_out[u.name]].sqnr(),
            max((a.clipped / max(a.count, 1) for a in ins), default=0.0),
            max((a.zeroed / max(a.nonzero, 1) for a in ins), default=0.0),
            max((calibration.channel_spread(s.tensor) for s in sites), default=1.0),
            calibration.amax.get(worst.tensor, 0.0) if worst else 0.0,
            calibration.choice.get(worst.tensor, "") if worst else "",
            u.depthwise, u.after, min(arriving, default=math.inf)))
    return measures, cand_out
