"""Why quantization breaks a model: each cause established by a measured cure.

First the quantized layers, in up to ``BLOCKS`` runs of consecutive layers, are each quantized
alone: where the error builds up. Then, from the blocks with the largest shares, the layers
adding the most noise (``LayerMeasure.added_noise``) are tried one by one: left unquantized
(FP16; the *cure*) and quantized alone (the *share*). A unit
whose cure removes at least ``CAUSE_MIN`` of the output error power is a cause; its mechanism is
named by a second, narrower cure that removes at least half of what the FP16 cure removes:

* ``outlier-channels``: per-channel activation scales cure it (a few channels much wider than
  the rest, per-tensor scaling crushes the others; Xiao et al. 2023, "SmoothQuant", sec. 3);
* ``clipped-tail``: recalibrating its activations by ``max`` cures it (the calibrator clipped a
  tail that matters);
* ``depthwise-weights``: float weights cure it (a depthwise filter's few taps per channel
  leave per-channel scaling little to average; Krishnamoorthi 2018, sec. 3.1);
* ``wide-distribution``: it reads a post-Softmax/GELU tensor of which quantization zeroes at
  least ``ZEROED_MIN`` of the non-zero values (tested first: per-channel scales over a
  probability's keys would cure it too, but no engine quantizes attention that way), or any
  input zeroed that much that no narrower cure fixes; FP16 cures it;
* ``layer-noise``: only FP16 cures it, no narrower mechanism found.

When no single unit's cure reaches ``CAUSE_MIN`` but the error fails the target, the blocks
carrying half the error, left unquantized together, are the joint cure:
``accumulated-requantization`` when that removes at least ``CAUSE_MIN`` of the error (as a
single layer's cure must), ``unexplained`` otherwise.

Error power = sum over float outputs and samples of |ref - cand|^2 over sum |ref|^2 (relative
L2 squared); a non-finite candidate counts as infinite error.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Callable, Sequence

import numpy as np
import onnx

from precision_doctor.formats import Precision
from precision_doctor.jsonable import json_float
from precision_doctor.quant.collect import Calibration
from precision_doctor.quant.emulation import Between, run_config
from precision_doctor.quant.measure import LayerMeasure
from precision_doctor.quant.placement import WEIGHT, QuantUnit
from precision_doctor.quant.qdq import QuantConfig
from precision_doctor.search.objective import Outputs

CAUSE_MIN = 0.2      # share of the error power a unit's cure must remove to be a cause
MECHANISM_MIN = 0.5  # share of the FP16 cure a narrower cure must reach to name the mechanism
SPREAD_MIN = 8.0     # channel spread (max / median channel amax) worth a per-channel trial
ZEROED_MIN = 0.3     # share of non-zero inputs quantized to zero that names a wide distribution
BLOCKS = 8           # runs of consecutive layers measured alone to locate the error
TOP_UNITS = 6        # units tried one by one
TRIAL_SAMPLES = 4    # samples each trial runs (the ones with the largest error)
WIDE_AFTER = frozenset({"Softmax", "Gelu", "FastGelu", "BiasGelu", "Erf", "Sigmoid",
                        "HardSigmoid", "Tanh"})

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class QuantCause:
    """One cause with its measured cure.

    Attributes:
        kind: The mechanism (module docstring).
        units: The units involved.
        cure: What was changed in the trial: ``fp16``, ``per-channel``, ``max-calibration``,
            ``float-weights`` or ``joint-fp16``.
        removed: Share of the output error power the cure removed (0-1).
        error_before / error_after: Relative L2 of the outputs before / with the cure.
        evidence: One sentence with the measured numbers.
        remedy: What to do.
    """

    kind: str
    units: tuple[str, ...]
    cure: str
    removed: float
    error_before: float
    error_after: float
    evidence: str
    remedy: str

    def to_dict(self) -> dict:
        d = asdict(self)
        d["units"] = list(self.units)
        return {k: json_float(v) for k, v in d.items()}


def error_power(reference: Outputs, candidate: Outputs) -> float:
    """Relative L2 squared over every float output and sample (module docstring)."""
    num = den = 0.0
    for name, refs in reference.items():
        for r, c in zip(refs, candidate.get(name, [])):
            if np.asarray(r).dtype.kind != "f":
                continue
            r64, c64 = np.asarray(r, np.float64), np.asarray(c, np.float64)
            if not np.isfinite(c64).all():
                return math.inf
            den += float(np.sum(r64 * r64))
            num += float(np.sum((r64 - c64) ** 2))
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


class Trials:
    """Runs configurations on the trial samples and scores them by error power."""

    def __init__(self, model: onnx.ModelProto, units: Sequence[QuantUnit], samples: Sequence,
                 reference: Outputs, between: Between, progress: Progress | None) -> None:
        self.model, self.units, self.between, self.progress = model, units, between, progress
        self.samples, self.reference = list(samples), reference
        self.runs = 0

    def error(self, config: QuantConfig) -> float:
        out = run_config(self.model, self.units, config, self.samples, self.between)
        self.runs += 1
        if self.progress:
            self.progress("causes", self.runs, 0)
        return error_power(self.reference, out)


def worst_samples(reference: Outputs, candidate: Outputs, count: int) -> list[int]:
    """Indices of the ``count`` samples with the largest error power, ascending index order."""
    n = len(next(iter(reference.values()), []))
    errs = [error_power({k: [v[i]] for k, v in reference.items()},
                        {k: [v[i]] for k, v in candidate.items()}) for i in range(n)]
    order = sorted(range(n), key=lambda i: (-errs[i] if not math.isnan(errs[i]) else 0, i))
    return sorted(order[:count])


def find_causes(model: onnx.ModelProto, units: Sequence[QuantUnit], config: QuantConfig,
                calibration: Calibration, measures: Sequence[LayerMeasure], samples: Sequence,
                reference: Outputs, candidate: Outputs, between: Between = Precision.FP16,
                top: int = TOP_UNITS, progress: Progress | None = None
                ) -> CauseSearch:
    """Try the noisiest units' cures and name the causes (module docstring).

    Args:
        model, units, config, calibration: The quantized model's pieces.
        measures: ``quant.measure.measure_layers`` of ``config``.
        samples, reference, candidate: Samples, FP32 outputs and ``config``'s outputs on them.
        between: Float precision between the Q/DQ pairs.
        top: Units tried one by one.
        progress: ``progress("causes", trials done, 0)``.

    Returns:
        ``CauseSearch``: causes; measures with error_share/cure filled for the tried units;
        the explained share, the share of the error power that leaving every cause's units
        unquantized together removes (0 when there is no cause); the blocks' shares.
    """
    pick = worst_samples(reference, candidate, TRIAL_SAMPLES)
    ref = {k: [v[i] for i in pick] for k, v in reference.items()}
    trials = Trials(model, units, [samples[i] for i in pick], ref, between, progress)
    e_all = error_power(ref, {k: [v[i] for i in pick] for k, v in candidate.items()})
    if e_all == 0:
        return CauseSearch([], list(measures), 0.0, [])
    by_name = {m.unit: m for m in measures}
    unit_of = {u.name: u for u in units}
    blocks = block_shares(trials, config, measures, e_all)
    ranked = candidates(measures, blocks, top)
    causes: list[QuantCause] = []
    for m in ranked:
        e_cure = trials.error(config.with_quantized(config.quantized - {m.unit}))
        e_alone = trials.error(config.with_quantized(frozenset({m.unit})))
        cure = removed_share(e_all, e_cure)
        by_name[m.unit] = replace(m, cure=cure, error_share=_share(e_alone, e_all))
        if cure >= CAUSE_MIN:
            causes.append(_mechanism(unit_of[m.unit], by_name[m.unit], config, calibration,
                                     trials, e_all, e_cure))
    if not causes and ranked:
        causes.append(_accumulated(trials, config, measures, blocks, ranked, e_all))
    explained = 0.0
    if causes:
        cured = frozenset(u for c in causes for u in c.units)
        e_cured = trials.error(config.with_quantized(config.quantized - cured))
        explained = removed_share(e_all, e_cured)
    return CauseSearch(causes, [by_name[m.unit] for m in measures], explained, blocks)


@dataclass(frozen=True)
class Block:
    """A run of consecutive quantized layers and the error it causes quantized alone.

    Attributes:
        units: Its layers, graph order.
        share: Output error power with only these layers quantized, over the error with every
            layer quantized (measured; shares of independent blocks add up to about 1).
    """

    units: tuple[str, ...]
    share: float

    def to_dict(self) -> dict:
        return {"first": self.units[0], "last": self.units[-1], "layers": len(self.units),
                "share": json_float(self.share)}


@dataclass(frozen=True)
class CauseSearch:
    """What ``find_causes`` found: causes, the measures with the tried layers' shares and
    cures, the explained share, and the blocks' shares (where the error builds up)."""

    causes: list[QuantCause]
    measures: list[LayerMeasure]
    explained: float
    blocks: list[Block]


def block_shares(trials: Trials, config: QuantConfig, measures: Sequence[LayerMeasure],
                 e_all: float) -> list[Block]:
    """Split the quantized layers (graph order) into at most ``BLOCKS`` runs and measure each
    quantized alone (group testing: ``BLOCKS`` trials locate where the error builds up, which
    a layer's local noise alone does not tell: a layer near the output weighs more)."""
    q = [m.unit for m in measures if m.quantized]
    if len(q) <= TOP_UNITS:
        return []
    size = math.ceil(len(q) / BLOCKS)
    out = []
    for i in range(0, len(q), size):
        units = tuple(q[i:i + size])
        out.append(Block(units, _share(trials.error(config.with_quantized(frozenset(units))),
                                       e_all)))
    return out


def candidates(measures: Sequence[LayerMeasure], blocks: Sequence[Block], top: int
               ) -> list[LayerMeasure]:
    """The layers to try one by one: from the blocks with the largest shares, a number in
    proportion to the share, the noisiest (added noise) first; all layers of a small model."""
    quantized = [m for m in measures if m.quantized]
    noisy = sorted(quantized, key=lambda m: (-m.added_noise, -m.injected_noise, m.unit))
    if not blocks:
        return noisy[:top]
    total = sum(b.share for b in blocks) or 1.0
    picked: list[LayerMeasure] = []
    for b in sorted(blocks, key=lambda b: (-b.share, b.units)):
        members = set(b.units)
        take = max(1, round(top * b.share / total))
        picked += [m for m in noisy if m.unit in members][:take]
        if len(picked) >= top:
            break
    return picked[:top]


def _accumulated(trials: Trials, config: QuantConfig, measures: Sequence[LayerMeasure],
                 blocks: Sequence[Block], tried: Sequence[LayerMeasure], e_all: float
                 ) -> QuantCause:
    """No single layer is a cause: the joint FP16 cure of the blocks carrying half the error
    (of the tried layers when the model has no blocks)."""
    joint: set[str] = set()
    covered = 0.0
    total = sum(b.share for b in blocks)
    for b in sorted(blocks, key=lambda b: (-b.share, b.units)):
        if covered >= total / 2:
            break
        joint.update(b.units)
        covered += b.share
    if not joint:
        joint = {m.unit for m in tried}
    e_joint = trials.error(config.with_quantized(config.quantized - joint))
    removed = removed_share(e_all, e_joint)
    first, last = _depth_sqnr(measures)
    kind = "accumulated-requantization" if removed >= CAUSE_MIN else "unexplained"
    where = (f"the {len(joint)} layers of the blocks carrying {covered / (total or 1):.0%} of "
             "the error" if blocks else f"the {len(joint)} noisiest layers")
    return QuantCause(
        kind, tuple(sorted(joint)), "joint-fp16", removed, math.sqrt(e_all), math.sqrt(e_joint),
        f"no single layer's FP16 cure removes {CAUSE_MIN:.0%} of the error; {where} together "
        f"remove {removed:.0%}; output SQNR falls from {first:.1f} dB at the first quantized "
        f"layer to {last:.1f} dB at the last",
        "keep layers in FP16 (fix finds the fewest), or calibrate on more representative "
        "samples")


def _mechanism(unit: QuantUnit, m: LayerMeasure, config: QuantConfig, calibration: Calibration,
               trials: Trials, e_all: float, e_cure: float) -> QuantCause:
    cure = removed_share(e_all, e_cure)
    before, fp16_after = math.sqrt(e_all), math.sqrt(e_cure)
    acts = [s.tensor for s in unit.sites if s.kind != WEIGHT]
    name = unit.name
    if unit.depthwise and m.weight_sqnr_db is not None and m.weight_sqnr_db < m.input_sqnr_db:
        e = trials.error(replace(config, weights_float=config.weights_float | {name}))
        if removed_share(e_all, e) >= MECHANISM_MIN * cure:
            return QuantCause("depthwise-weights", (name,), "float-weights",
                              removed_share(e_all, e), before, math.sqrt(e),
                              f"depthwise Conv weights at {m.weight_sqnr_db:.1f} dB SQNR; "
                              f"float weights remove {removed_share(e_all, e):.0%} of the error",
                              "keep this depthwise Conv in FP16, or quantize its weights with "
                              "finer (per-channel) scales after weight equalization")
    wide = m.after in WIDE_AFTER and m.zeroed_share >= ZEROED_MIN
    if wide:  # a post-Softmax/GELU distribution: its "outlier channels" are its peaks
        return _wide(m, cure, before, fp16_after)
    if m.channel_spread >= SPREAD_MIN and any(calibration.channel_amax.get(t) is not None
                                               for t in acts):
        e = trials.error(replace(config, per_channel=config.per_channel | {name}))
        if removed_share(e_all, e) >= MECHANISM_MIN * cure:
            gemm = unit.op_type in ("MatMul", "Gemm") and bool(unit.weight_sites)
            return QuantCause(
                "outlier-channels", (name,), "per-channel", removed_share(e_all, e), before,
                math.sqrt(e),
                f"its widest input channel is {m.channel_spread:.0f}x the median under one "
                f"per-tensor scale; per-channel scales remove {removed_share(e_all, e):.0%} of the "
                f"error (FP16: {cure:.0%})",
                "apply SmoothQuant scale migration (fix searches alpha)" if gemm else
                "keep this layer in FP16, or equalize its input channels (cross-layer "
                "equalization)")
    if m.clipped_share > 0 and any(calibration.choice.get(t, "max") != "max" for t in acts):
        recal = calibration
        for t in acts:
            recal = recal.with_choice(t, "max")
        e = trials.error(replace(config, amax={**config.amax,
                                               **{t: recal.amax[t] for t in acts}}))
        if removed_share(e_all, e) >= MECHANISM_MIN * cure:
            return QuantCause("clipped-tail", (name,), "max-calibration", removed_share(e_all, e),
                              before, math.sqrt(e),
                              f"the {m.calibrator} calibration clips {m.clipped_share:.2%} of "
                              f"its inputs; max calibration removes {removed_share(e_all, e):.0%} "
                              "of the error",
                              "calibrate this tensor by max (fix chooses per tensor)")
    if m.after in WIDE_AFTER or m.zeroed_share >= ZEROED_MIN:
        return _wide(m, cure, before, fp16_after)
    return QuantCause("layer-noise", (name,), "fp16", cure, before, fp16_after,
                      f"input {m.input_sqnr_db:.1f} dB, weights "
                      f"{_db(m.weight_sqnr_db)} SQNR; FP16 removes {cure:.0%} of the error",
                      "keep this layer in FP16")


def _wide(m: LayerMeasure, cure: float, before: float, after: float) -> QuantCause:
    src = f"reads a {m.after} output" if m.after in WIDE_AFTER else "its input"
    return QuantCause("wide-distribution", (m.unit,), "fp16", cure, before, after,
                      f"{src}: {m.zeroed_share:.0%} of its non-zero inputs quantize to zero; "
                      f"FP16 removes {cure:.0%} of the error", "keep this layer in FP16")


def _db(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f} dB"


def removed_share(before: float, after: float) -> float:
    """Share of the error power ``before`` that a cure leaves at ``after`` removed, in [0, 1]
    (an infinite error cured to a finite one: 1)."""
    if not math.isfinite(before):
        return 1.0 if math.isfinite(after) else 0.0
    if before <= 0:
        return 0.0
    return max(0.0, min(1.0, 1.0 - after / before))


def _share(alone: float, total: float) -> float:
    if not math.isfinite(total) or total <= 0:
        return 1.0 if not math.isfinite(alone) else 0.0
    return min(1.0, alone / total)


def _depth_sqnr(measures: Sequence[LayerMeasure]) -> tuple[float, float]:
    q = [m for m in measures if m.quantized]
    return (q[0].output_sqnr_db, q[-1].output_sqnr_db) if q else (math.nan, math.nan)
