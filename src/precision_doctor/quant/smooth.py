"""SmoothQuant scale migration for the GEMMs whose input has outlier channels.

Xiao et al. 2023, "SmoothQuant: Accurate and Efficient Post-Training Quantization for Large
Language Models", eq. 4: per input channel j of ``Y = X W`` (X[..., K], W[K, N]),

    s_j = max|X_j|^alpha / max|W_j|^(1 - alpha),   Y = (X / s) (diag(s) W),

exact in real arithmetic; the activation's channels are evened out (its per-tensor scale no
longer set by a few wide channels) at the cost of wider weight rows, which per-channel weight
scales absorb. ``alpha`` moves the difficulty between them (0.5 the paper's default).

The division is written as a ``Mul`` by 1/s before the activation's Q/DQ (an engine runs it in
the float precision between; it can be folded into a preceding LayerNorm's gamma and beta).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np
import onnx

from precision_doctor.graph.constants import constant_values
from precision_doctor.quant.collect import Calibration
from precision_doctor.quant.placement import QuantUnit
from precision_doctor.quant.qdq import QuantConfig

SMOOTH_SPREAD = 4.0  # channel spread (max / median channel amax) worth smoothing
S_RANGE = (1e-5, 1e5)  # s clipped to this range so no channel is scaled to 0 or inf


def smoothing_factors(x_amax: np.ndarray, w_row_amax: np.ndarray, alpha: float) -> np.ndarray:
    """``s`` of the module docstring, float32 over K; channels with a zero amax get s = 1."""
    x = np.asarray(x_amax, np.float64)
    w = np.asarray(w_row_amax, np.float64)
    ok = (x > 0) & (w > 0)
    s = np.ones_like(x)
    s[ok] = x[ok] ** alpha / w[ok] ** (1 - alpha)
    return np.clip(s, *S_RANGE).astype(np.float32)


def smoothquant(model: onnx.ModelProto, units: Sequence[QuantUnit], config: QuantConfig,
                calibration: Calibration, alpha: float) -> QuantConfig | None:
    """``config`` with SmoothQuant on every quantized MatMul/Gemm unit with an initializer
    weight and an input channel spread of at least ``SMOOTH_SPREAD``.

    Args:
        model: The FP32 model.
        units: Its units.
        config: The configuration to extend.
        calibration: Its calibration (per-channel amax of the GEMM inputs over K).
        alpha: Migration strength in [0, 1].

    Returns:
        The new configuration (``smooth`` and ``smooth_amax`` set: the smoothed activation's
        per-tensor amax is its largest smoothed channel amax), or None when no unit qualifies.
    """
    inits = constant_values(model)
    smooth: dict[str, np.ndarray] = {}
    smooth_amax: dict[str, float] = {}
    for u in units:
        if u.op_type not in ("MatMul", "Gemm") or u.name not in config.quantized:
            continue
        acts = [s for s in u.activation_sites if s.input_index == 0 and s.node == u.name]
        weights = [s for s in u.weight_sites if s.tensor in inits]
        if not acts or not weights:
            continue
        x_ch = calibration.channel_amax.get(acts[0].tensor)
        if x_ch is None or calibration.channel_spread(acts[0].tensor) < SMOOTH_SPREAD:
            continue
        w = np.asarray(inits[weights[0].tensor], np.float32)
        transposed = u.op_type == "Gemm" and weights[0].axis == 0  # B[N, K]
        if w.ndim != 2 or (w.shape[1] if transposed else w.shape[0]) != x_ch.shape[0]:
            continue
        w_rows = np.abs(w).max(axis=0 if transposed else 1)
        s = smoothing_factors(x_ch, w_rows, alpha)
        smooth[u.name] = s
        smooth_amax[u.name] = float(np.max(x_ch / s))
    if not smooth:
        return None
    return replace(config, smooth=smooth, smooth_amax=smooth_amax)
