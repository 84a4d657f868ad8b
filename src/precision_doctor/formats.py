"""Floating-point formats the tool reasons about: FP32, TF32, FP16, BF16.

Limits come from the IEEE-754 binary16 and binary32 definitions, Google's bfloat16 and NVIDIA's
TF32 (FP32 exponent range, 10 explicit mantissa bits; "NVIDIA A100 Tensor Core GPU Architecture",
2020). Rounding uses ``ml_dtypes`` (round-to-nearest-even, overflow to inf, subnormals kept).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np


class Precision(str, enum.Enum):
    """Precision of a node's computation (the values of a ``PrecisionPlan``)."""

    FP32 = "fp32"
    TF32 = "tf32"
    FP16 = "fp16"
    BF16 = "bf16"

    @classmethod
    def parse(cls, value: str) -> Precision:
        """Parse ``fp16``/``FP16``/``float16``/``half`` style names.

        Raises:
            ValueError: The name is not one of fp32, tf32, fp16, bf16.
        """
        aliases = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "fp32",
                   "float": "fp32"}
        key = aliases.get(value.strip().lower(), value.strip().lower())
        try:
            return cls(key)
        except ValueError:
            raise ValueError(f"unknown precision {value!r}: use fp32, tf32, fp16 or bf16") from None


@dataclass(frozen=True)
class FloatFormat:
    """Numeric limits of one storage format.

    Attributes:
        name: ``fp32``, ``tf32``, ``fp16`` or ``bf16``.
        mantissa_bits: Explicit fraction bits (23, 10, 10, 7).
        max: Largest finite value (65504 = largest finite IEEE-754 binary16).
        min_normal: Smallest positive normal value (2**-14 for binary16).
        min_subnormal: Smallest positive subnormal; values below half of it flush to zero.
    """

    name: str
    mantissa_bits: int
    max: float
    min_normal: float
    min_subnormal: float

    @property
    def unit_roundoff(self) -> float:
        """Relative rounding error bound u = 2**-(mantissa_bits + 1) of round-to-nearest."""
        return 2.0 ** -(self.mantissa_bits + 1)

    def headroom_bits(self, observed_max: float) -> float:
        """Headroom in bits: log2(format max / observed max abs); negative means overflow.

        Returns ``inf`` for an all-zero tensor.
        """
        if not observed_max or not math.isfinite(observed_max):
            return math.inf if observed_max == 0 else -math.inf
        return math.log2(self.max / observed_max)


_F32 = np.finfo(np.float32)
_F16 = np.finfo(np.float16)
_BF16 = ml_dtypes.finfo(ml_dtypes.bfloat16)

FORMATS: dict[Precision, FloatFormat] = {
    Precision.FP32: FloatFormat("fp32", 23, float(_F32.max), float(_F32.tiny),
                                float(_F32.smallest_subnormal)),
    # TF32 keeps the FP32 exponent: same range, 10-bit mantissa.
    Precision.TF32: FloatFormat("tf32", 10, float(_F32.max), float(_F32.tiny),
                                float(_F32.smallest_subnormal)),
    Precision.FP16: FloatFormat("fp16", 10, float(_F16.max), float(_F16.tiny),
                                float(_F16.smallest_subnormal)),
    Precision.BF16: FloatFormat("bf16", 7, float(_BF16.max), float(_BF16.tiny),
                                float(_BF16.smallest_subnormal)),
}


def round_to(values: np.ndarray, precision: Precision) -> np.ndarray:
    """Round float values to ``precision`` and return them as float32.

    FP16/BF16 use round-to-nearest-even with overflow to inf (ml_dtypes). TF32 rounds the FP32
    mantissa to 10 bits with round-to-nearest-even on the bit pattern (exponent range unchanged).

    Args:
        values: Any float array.
        precision: Target precision.

    Returns:
        float32 array of the same shape.
    """
    x = np.asarray(values, dtype=np.float32)
    if precision is Precision.FP32:
        return x.copy()
    with np.errstate(over="ignore"):
        if precision is Precision.FP16:
            return x.astype(np.float16).astype(np.float32)
        if precision is Precision.BF16:
            return x.astype(ml_dtypes.bfloat16).astype(np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    drop = 23 - FORMATS[Precision.TF32].mantissa_bits
    half = np.uint64(1 << (drop - 1))
    lsb = (bits >> np.uint64(drop)) & np.uint64(1)
    rounded = ((bits + half - np.uint64(1) + lsb) >> np.uint64(drop)) << np.uint64(drop)
    finite = np.isfinite(x)
    out = np.where(finite, rounded.astype(np.uint32).view(np.float32), x)
    return out.astype(np.float32)
