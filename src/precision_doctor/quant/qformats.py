"""Quantized storage formats (INT8, FP8 E4M3FN, FP8 E5M2) and the exact ONNX Q/DQ arithmetic.

``quantize``/``dequantize`` reproduce ONNX ``QuantizeLinear``/``DequantizeLinear`` (opset 21) with
zero point 0 bit for bit as ONNX Runtime CPU computes them (checked against ORT 1.32 and
``onnx.reference`` in tests/quant/test_qformats.py):

* ``x / scale`` is one float32 division (not a multiplication by ``1 / scale``: the two differ in
  ~4 % of exact half-way inputs);
* INT8: round half to even, then saturate to [-128, 127]; NaN gives -128 (what ORT's x86 kernel
  and the reference produce: the float-to-int32 conversion of NaN is INT32_MIN);
* FP8: round-to-nearest-even with ``saturate=1``: out of range and +-inf give +-max finite, NaN
  stays NaN (ONNX operator spec, "Cast" saturation table);
* DequantizeLinear: ``float32(q) * scale`` in float32.

Limits: 127 for symmetric INT8, 448 for E4M3FN and 57344 for E5M2 (OCP 8-bit Floating Point
Specification (OFP8) rev. 1.0, 2023, table 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
from onnx import TensorProto

_INT8_MIN, _INT8_MAX = -128, 127


@dataclass(frozen=True)
class QuantFormat:
    """A quantized storage format with a symmetric scale (zero point 0).

    Attributes:
        name: ``int8``, ``fp8`` (E4M3FN) or ``fp8e5m2``.
        qmax: Largest magnitude a symmetric scale maps ``amax`` to: 127 for INT8 (narrow range
            [-127, 127], TensorRT's symmetric INT8; activations may still reach -128 in ONNX),
            448 for E4M3FN and 57344 for E5M2 (OFP8 spec, largest finite values).
        onnx_type: ``onnx.TensorProto`` element type of the zero point / quantized tensor.
        is_float: True for the FP8 formats.
    """

    name: str
    qmax: float
    onnx_type: int
    is_float: bool

    @property
    def dtype(self) -> np.dtype:
        """numpy storage dtype: ``int8``, ``ml_dtypes.float8_e4m3fn`` or ``float8_e5m2``."""
        return np.dtype(_STORAGE[self.onnx_type])

    def scale_for(self, amax: float | np.ndarray) -> np.floating | np.ndarray:
        """Symmetric scale ``amax / qmax`` in float32.

        An ``amax`` of 0, NaN or inf has no meaningful scale; it gets ``1 / qmax`` (the scale of
        amax 1.0), which keeps Q/DQ finite and maps an all-zero tensor to zeros exactly. A scale
        that would underflow float32 normals (amax below ~1e-36) is raised to the smallest normal
        float32, 2**-126, so that ``x / scale`` never divides by zero.

        Args:
            amax: Clipping threshold(s) >= 0, scalar or array (per-channel), any float dtype.

        Returns:
            float32 scalar for a scalar ``amax``, else a float32 array of its shape.

        Raises:
            ValueError: An ``amax`` is negative.
        """
        a = np.asarray(amax, dtype=np.float32)
        if np.any(a < 0):
            raise ValueError(f"amax must be >= 0 for a symmetric {self.name} scale, got {amax!r}")
        usable = np.isfinite(a) & (a > 0)
        with np.errstate(invalid="ignore"):
            scale = np.where(usable, a / np.float32(self.qmax), np.float32(1.0 / self.qmax))
        scale = np.maximum(scale, np.float32(np.finfo(np.float32).tiny)).astype(np.float32)
        return scale[()] if scale.ndim == 0 else scale


_STORAGE: dict[int, type] = {
    TensorProto.INT8: np.int8,
    TensorProto.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn,
    TensorProto.FLOAT8E5M2: ml_dtypes.float8_e5m2,
}

QUANT_FORMATS: dict[str, QuantFormat] = {
    "int8": QuantFormat("int8", 127.0, TensorProto.INT8, False),
    "fp8": QuantFormat("fp8", float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max),
                       TensorProto.FLOAT8E4M3FN, True),
    "fp8e5m2": QuantFormat("fp8e5m2", float(ml_dtypes.finfo(ml_dtypes.float8_e5m2).max),
                           TensorProto.FLOAT8E5M2, True),
}

_ALIASES = {
    "int8": "int8", "fp8": "fp8", "fp8e4m3": "fp8", "fp8e4m3fn": "fp8", "e4m3": "fp8",
    "e4m3fn": "fp8", "float8": "fp8", "float8e4m3": "fp8", "float8e4m3fn": "fp8",
    "fp8e5m2": "fp8e5m2", "e5m2": "fp8e5m2", "float8e5m2": "fp8e5m2",
}


def parse_quant_target(name: str) -> QuantFormat | None:
    """The quantized format a target name means, or None for any other name (``fp16``, ...).

    Case, spaces, ``_`` and ``-`` are ignored: ``int8``, ``FP8``, ``fp8_e4m3``, ``e4m3``,
    ``float8e4m3fn`` give E4M3FN; ``fp8e5m2``, ``E5M2`` give E5M2.

    Args:
        name: A ``--target`` style name.

    Returns:
        The ``QuantFormat``, or None when the name is not a quantized format (the caller then
        parses it as a float precision, whose parser reports unknown names).
    """
    key = "".join(ch for ch in name.strip().lower() if ch not in "_- ")
    canonical = _ALIASES.get(key)
    return QUANT_FORMATS[canonical] if canonical else None


def _scale_like(scale: float | np.ndarray, shape: tuple[int, ...],
                axis: int | None) -> np.ndarray:
    """float32 scale reshaped to broadcast against ``shape`` along ``axis`` (ONNX's rules)."""
    s = np.asarray(scale, dtype=np.float32)
    if s.ndim == 0 or (s.ndim == 1 and s.size == 1):
        return s.reshape(())
    if s.ndim > 1:
        raise ValueError(f"scale must be a scalar or 1-D per-channel vector, got shape {s.shape}"
                         " (blocked quantization is not supported)")
    if axis is None:
        raise ValueError(f"a per-channel scale of {s.size} values needs `axis`")
    if not -len(shape) <= axis < len(shape):
        raise ValueError(f"axis {axis} is out of range for a tensor of shape {shape}")
    axis %= len(shape)
    if shape[axis] != s.size:
        raise ValueError(f"per-channel scale has {s.size} values but axis {axis} of the tensor "
                         f"has {shape[axis]} (shape {shape})")
    return s.reshape([s.size if d == axis else 1 for d in range(len(shape))])


def quantize(x: np.ndarray, scale: float | np.ndarray, fmt: QuantFormat,
             axis: int | None = None) -> np.ndarray:
    """ONNX ``QuantizeLinear`` (opset 21, zero point 0, ``saturate=1``), bit-exact to ORT CPU.

    Args:
        x: Values, any shape; cast to float32 first (the Q node's float32 input).
        scale: float32 scalar, or a 1-D vector of ``x.shape[axis]`` scales (per-channel, like
            ONNX's ``axis`` attribute; a 1-element vector counts as a scalar). Not validated:
            a zero scale yields what float32 division gives (inf/NaN, then saturation).
        fmt: Target format.
        axis: Channel axis of a per-channel ``scale`` (negative counts from the end).

    Returns:
        Storage values of ``x.shape`` with dtype ``fmt.dtype`` (int8 or an ml_dtypes float8).

    Raises:
        ValueError: ``scale`` is not a scalar or does not match ``x.shape[axis]``, or ``axis``
            is missing or out of range.
    """
    x32 = np.asarray(x, dtype=np.float32)
    s = _scale_like(scale, x32.shape, axis)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        v = np.asarray(x32 / s, dtype=np.float32)
    if fmt.is_float:
        # ml_dtypes' E4M3FN cast turns overflow into NaN: clip first (RNE would round 448..464
        # down to 448 anyway; +-inf clips to +-max; NaN passes through np.clip).
        return np.clip(v, -fmt.qmax, fmt.qmax).astype(fmt.dtype)
    r = np.where(np.isnan(v), np.float32(_INT8_MIN), np.rint(v))
    return np.clip(r, _INT8_MIN, _INT8_MAX).astype(np.int8)


def dequantize(q: np.ndarray, scale: float | np.ndarray, fmt: QuantFormat,
               axis: int | None = None) -> np.ndarray:
    """ONNX ``DequantizeLinear`` (zero point 0): ``float32(q) * scale`` in float32.

    Args:
        q: Storage values of dtype ``fmt.dtype``, any shape.
        scale: As for ``quantize``.
        fmt: The format ``q`` is stored in.
        axis: As for ``quantize``.

    Returns:
        float32 array of ``q.shape``.

    Raises:
        ValueError: ``q`` is not of dtype ``fmt.dtype`` (ONNX Runtime returns FP8 tensors as
            uint8 bit patterns: view those as the ml_dtypes float8 type first), or the scale
            does not fit (see ``quantize``).
    """
    q = np.asarray(q)
    if q.dtype != fmt.dtype:
        raise ValueError(f"dequantize expects {fmt.dtype} storage values for {fmt.name}, got "
                         f"{q.dtype} (view uint8 FP8 bit patterns as {fmt.dtype} first)")
    s = _scale_like(scale, q.shape, axis)
    return np.asarray(q.astype(np.float32) * s, dtype=np.float32)


def fake_quant(x: np.ndarray, scale: float | np.ndarray, fmt: QuantFormat,
               axis: int | None = None) -> np.ndarray:
    """``dequantize(quantize(x))``: what a Q/DQ pair makes of ``x``, float32 of ``x.shape``.

    Args and raises as for ``quantize``.
    """
    return dequantize(quantize(x, scale, fmt, axis), scale, fmt, axis)


def sqnr_db(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio ``10 log10(sum(ref^2) / sum((ref - cand)^2))`` in dB.

    Computed in float64. Special cases: ``inf`` when the two are identical (all-zero reference
    included); ``-inf`` when the candidate holds a non-finite value where the reference is
    finite, or when the reference is all zeros and the candidate is not; ``nan`` when the
    reference itself holds a non-finite value or the arrays are empty (no SQNR is defined).

    Args:
        reference: Exact values, any shape.
        candidate: Approximation, same shape.

    Returns:
        SQNR in decibels (higher is better; INT8 with a good scale gives ~40 dB on Gaussians).

    Raises:
        ValueError: The shapes differ.
    """
    ref = np.asarray(reference, dtype=np.float64)
    cand = np.asarray(candidate, dtype=np.float64)
    if ref.shape != cand.shape:
        raise ValueError(f"sqnr_db needs equal shapes, got {ref.shape} and {cand.shape}")
    if ref.size == 0 or not np.all(np.isfinite(ref)):
        return float("nan")
    if not np.all(np.isfinite(cand)):
        return float("-inf")
    noise = float(np.sum(np.square(ref - cand)))
    if noise == 0.0:
        return float("inf")
    signal = float(np.sum(np.square(ref)))
    return float("-inf") if signal == 0.0 else 10.0 * float(np.log10(signal / noise))


def clipped_share(x: np.ndarray, amax: float) -> float:
    """Fraction of elements with ``|x| > amax`` (what a Q/DQ with threshold ``amax`` saturates).

    Args:
        x: Values, any shape and float dtype; +-inf counts as clipped, NaN does not.
        amax: Threshold (same units as ``x``).

    Returns:
        Share in [0, 1]; 0.0 for an empty array.
    """
    a = np.abs(np.asarray(x))
    return float(np.count_nonzero(a > amax) / a.size) if a.size else 0.0
