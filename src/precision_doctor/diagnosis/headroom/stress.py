"""Stress probe: how far can real inputs grow before a transformer leaves FP16's range?

A model whose LayerNorm square peaks at 75% of 65504 passes on today's inputs and fails on a
slightly louder one. The probe multiplies the real input by a factor s and finds the smallest s
at which a transformer site overflows in FP16, under the statistics the diagnosis assumed
(``diagnosis.headroom.probe``): a LayerNorm input (residual stream) max|x| > 65520, a decomposed
LayerNorm square (x - mean)^2 > 65520, or an attention QK^T max|s| > 65520. 65520 is where FP16
round-to-nearest-even starts returning inf (values in (65504, 65520) round down to 65504).

What is scaled: the floating graph inputs (image pixels, audio features). A model with only
integer inputs (token ids) cannot be scaled at its inputs (and its embedding LayerNorm would
undo a scaled embedding anyway); there the residual stream entering the LayerNorm with the least
headroom (largest (x - mean)^2 under FP16 statistics, largest |x| under FP32 statistics, from the
unscaled analysis) is scaled, by a ``Mul`` inserted in a copy of the graph: "this LayerNorm is a
factor f from overflowing". Without an analysis, the first LayerNorm's input is scaled.

Search: factors 2^(k/2), k = 0..20 (1 to 1024) until one overflows, then 5 bisection steps in
log space between the last safe factor and it (factor known to within 2^(1/64), ~1%). Each step
is one FP32 ONNX Runtime run of the first sample with only the site tensors fetched. The result
is then *checked*: the CPU emulator (all FP16) is run at the reported factor and must produce
inf/NaN in the named tensor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import onnx
from onnx import helper

from precision_doctor.diagnosis.headroom.probe import HeadroomProbe
from precision_doctor.diagnosis.headroom.records import TransformerReport
from precision_doctor.diagnosis.headroom.sites import centered, find_layernorms
from precision_doctor.formats import Precision
from precision_doctor.graph.outputs import mark_outputs
from precision_doctor.jsonable import from_json_float, json_float
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners.emulator import EmulatorRunner

FP16_OVERFLOW = 65520.0  # smallest magnitude that FP16 RNE rounds to inf
SCALE_INPUT = "precision_doctor_stress_scale"
GRID = tuple(2.0 ** (k / 2) for k in range(21))
BISECT_STEPS = 5


@dataclass(frozen=True)
class StressResult:
    """Smallest input scale factor at which a transformer site overflows in FP16.

    Attributes:
        scaled: What was multiplied (``inputs: a, b`` or ``tensor: name``).
        factor: The smallest overflowing factor found (upper end of the bracket); None when
            none up to ``max_factor`` overflows. 1.0 means the real inputs already overflow.
        safe_factor: The largest factor checked without overflow (0 when 1.0 overflows).
        kind: ``residual``, ``variance`` or ``scores`` (see ``diagnosis.headroom.probe``).
        node: The site's node (LayerNorm first node or QK^T MatMul); tensor: the overflowing
            tensor (for a fused LayerNorm's variance: its input).
        peak: The overflowing quantity at ``factor``.
        evaluations: FP32 runs used.
        verified: The FP16 emulator at ``factor`` gives inf/NaN in ``tensor`` (None: not checked,
            e.g. a fused LayerNorm's internal square, which no tensor exposes).
        max_factor: The largest factor tried.
    """

    scaled: str
    factor: float | None
    safe_factor: float
    kind: str | None
    node: str | None
    tensor: str | None
    peak: float | None
    evaluations: int
    verified: bool | None
    max_factor: float = GRID[-1]

    def to_dict(self) -> dict:
        return {k: json_float(v) if isinstance(v, float) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: Mapping) -> StressResult:
        return cls(**{k: from_json_float(v) if isinstance(v, (str, float)) and k in (
            "factor", "safe_factor", "peak", "max_factor") else v for k, v in d.items()})


def scaled_model(model: onnx.ModelProto, report: TransformerReport | None = None
                 ) -> tuple[onnx.ModelProto, str | None]:
    """A copy that multiplies one LayerNorm input by a new scalar graph input.

    Args:
        model: The model.
        report: Its unscaled analysis; picks the LayerNorm with the least headroom (else the
            first LayerNorm).

    Returns:
        ``(model, tensor)``; ``(model, None)`` unchanged when the model has floating inputs
        (those are scaled in the feeds) or no LayerNorm.
    """
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16}
    if any(i.type.tensor_type.elem_type in floats for i in model.graph.input):
        return model, None
    lns = find_layernorms(model)
    if not lns:
        return model, None
    x = lns[0].input
    if report is not None and report.layernorms:
        tight = min(report.layernorms, key=lambda st: st.variance_headroom
                    if st.statistics == "fp16" else st.input_headroom)
        x = tight.input
    out = onnx.ModelProto()
    out.CopyFrom(model)
    scaled = f"{x}_stress_scaled"
    for n in out.graph.node:
        for i, v in enumerate(n.input):
            if v == x:
                n.input[i] = scaled
    pos = next((i for i, n in enumerate(out.graph.node) if x in n.output), -1) + 1
    out.graph.node.insert(pos, helper.make_node("Mul", [x, SCALE_INPUT], [scaled],
                                                name="precision_doctor_stress_mul"))
    out.graph.input.append(helper.make_tensor_value_info(SCALE_INPUT, onnx.TensorProto.FLOAT,
                                                         []))
    return out, x


def _feeds(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], factor: float,
           internal: bool) -> dict[str, np.ndarray]:
    if internal:
        return {**feeds, SCALE_INPUT: np.asarray(factor, np.float32)}
    return {k: (v * np.asarray(factor, v.dtype)) if np.issubdtype(v.dtype, np.floating) else v
            for k, v in feeds.items()}


def _overflow(probe: HeadroomProbe, got: Mapping[str, np.ndarray]
              ) -> tuple[str, str, str, float] | None:
    """(kind, node, tensor, peak) of the first overflowing site in graph order, or None, from
    one run's site tensors: the residual max|x|, the square (x - mean)^2 of a LayerNorm with
    FP16 statistics (``diagnosis.headroom.probe``), the attention scores max|s|."""
    hits = []
    for s in probe.lns:
        x = got[s.input]
        top = float(np.abs(x).max()) if x.size else 0.0
        if top > FP16_OVERFLOW:
            hits.append(("residual", s.node, s.input, top))
        elif s.fp16_statistics:
            peak = float(np.abs(centered(x, s.axis)).max()) ** 2 if x.size else 0.0
            if peak > FP16_OVERFLOW:
                hits.append(("variance", s.node, s.input, peak))
    for a in probe.atts:
        sc = got[a.scores]
        top = float(np.abs(sc).max()) if sc.size else 0.0
        if top > FP16_OVERFLOW:
            hits.append(("scores", a.matmul, a.scores, top))
    return hits[0] if hits else None


def stress_probe(model: onnx.ModelProto, samples: Sequence[Mapping[str, np.ndarray]],
                 report: TransformerReport | None = None) -> StressResult:
    """Find the smallest factor on the first sample's inputs that overflows a site in FP16.

    Args:
        model: FP32 model (nodes named).
        samples: Real feeds; the first one is scaled.
        report: The unscaled analysis (``analyze_transformer``); for integer-input models it
            picks the LayerNorm whose input is scaled (see the module docstring).

    Returns:
        ``StressResult`` (checked with the FP16 emulator when an overflow is found).

    Raises:
        ValueError: ``samples`` is empty.
        BackendError: ONNX Runtime fails on the model.
    """
    if not samples:
        raise ValueError("the stress probe needs at least one sample")
    probe, tensor = scaled_model(model, report)
    internal = tensor is not None
    base = dict(samples[0])
    scaled = f"tensor: {tensor}" if internal else "inputs: " + ", ".join(
        k for k, v in base.items() if np.issubdtype(np.asarray(v).dtype, np.floating))
    sites = HeadroomProbe(probe)  # sites and session once; each factor is one run
    if not sites.lns and not sites.atts:
        return StressResult(scaled, None, GRID[-1], None, None, None, None, 0, None)
    evaluations = 0

    def at(factor: float) -> tuple[str, str, str, float] | None:
        nonlocal evaluations
        evaluations += 1
        return _overflow(sites, sites.fetch(_feeds(probe, base, factor, internal)))

    safe, hit, factor = 0.0, None, None
    with sites:
        for f in GRID:
            hit = at(f)
            if hit is not None:
                factor = f
                break
            safe = f
        if factor is None or hit is None:
            return StressResult(scaled, None, safe, None, None, None, None, evaluations, None)
        if safe > 0:
            lo, hi = safe, factor
            for _ in range(BISECT_STEPS):
                mid = math.sqrt(lo * hi)
                got = at(mid)
                if got is None:
                    lo = mid
                else:
                    hi, hit = mid, got
            safe, factor = lo, hi
    kind, node, where, peak = hit
    check = next((s.square for s in sites.lns if s.node == node and s.square), None)
    # a fused LayerNorm's square is internal to the op: no tensor to check (verified None)
    target: str | None = check if kind == "variance" else where
    verified = None
    if target is not None:
        with EmulatorRunner(mark_outputs(probe, [target]), PrecisionPlan(Precision.FP16)) as r:
            out = r.run(_feeds(probe, base, factor, internal), [target])[target]
        verified = bool(not np.isfinite(np.asarray(out, np.float64)).all())
    return StressResult(scaled, factor, safe, kind, node, target, peak, evaluations, verified)


__all__ = ["FP16_OVERFLOW", "StressResult", "scaled_model", "stress_probe"]
