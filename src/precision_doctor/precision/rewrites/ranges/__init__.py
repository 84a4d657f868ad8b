"""Rewrites that move a value's range to where the reduced format holds it, exactly in FP32.

- ``reduce-periodic-argument`` (``periodic``): a Sin/Cos/Tan argument reduced modulo 2 pi in
  FP32, so that FP16/BF16 rounds a value in [-pi, pi] instead of one of 1e3.
- ``prescale-normalized-residual`` (``residual``; the streams it scales: ``streams``, with
  decomposed RMSNorms found by ``rms``): a residual stream that only scale-invariant
  normalizations read, scaled by 2^-k through its producers' constants, so that FP16 holds it.
"""

from precision_doctor.precision.rewrites.ranges.periodic import ReducePeriodicArgument
from precision_doctor.precision.rewrites.ranges.residual import PrescaleNormalizedResidual

__all__ = ["PrescaleNormalizedResidual", "ReducePeriodicArgument"]
