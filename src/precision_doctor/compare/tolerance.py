"""Tolerances: when is a candidate output close enough to the reference?

A ``Tolerance`` bounds the relative L2 error and, optionally, the elementwise error
``|c - r| <= atol + rtol * |r|`` (the numpy/Polygraphy form) for a share of elements given by the
statistic (``elemwise`` = every element, ``p99`` = 99% of elements, ...).

Default bounds per target precision are 20 x the format's unit roundoff u = 2^-(mantissa+1):
FP16/TF32 u = 4.9e-4 -> 1e-2 (rounded), BF16 u = 3.9e-3 -> 8e-2. A deep network accumulates
roughly sqrt(depth) * u of independent rounding errors; 20u leaves room for ~400 layers while an
overflow, underflow or cancellation (errors of order 1) still fails clearly. NVIDIA's guidance
for FP16 engines (~1e-3 absolute on O(1) outputs, NVIDIA/TensorRT issue #3893) is consistent with
it. FP32 candidates (another FP32 engine) default to 1e-4: well above FP32 reordering noise
(u = 6e-8) on well-conditioned models.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping, Sequence

import numpy as np

from precision_doctor.compare.metrics import OutputMetrics
from precision_doctor.formats import Precision

_STATISTICS = ("elemwise", "p90", "p95", "p99", "p999")


@dataclass(frozen=True)
class Tolerance:
    """Acceptance bounds for one output.

    Attributes:
        rel_l2: Maximum relative L2 error, or None to skip that check.
        atol / rtol: Elementwise bound |c - r| <= atol + rtol * |r|; both None to skip.
        statistic: Share of elements that must meet the elementwise bound: ``elemwise`` (all),
            ``p90``, ``p95``, ``p99``, ``p999``.
    """

    rel_l2: float | None = 1e-2
    atol: float | None = None
    rtol: float | None = None
    statistic: str = "elemwise"

    def __post_init__(self) -> None:
        if self.statistic not in _STATISTICS:
            raise ValueError(f"statistic must be one of {', '.join(_STATISTICS)}")

    def required_share(self) -> float:
        """Share of elements that must pass the elementwise bound."""
        return {"elemwise": 1.0, "p90": 0.9, "p95": 0.95, "p99": 0.99, "p999": 0.999}[
            self.statistic]

    def describe(self) -> str:
        parts = []
        if self.rel_l2 is not None:
            parts.append(f"rel_l2 <= {self.rel_l2:g}")
        if self.atol is not None or self.rtol is not None:
            parts.append(f"|c-r| <= {self.atol or 0:g} + {self.rtol or 0:g}*|r| "
                         f"({self.statistic})")
        return " and ".join(parts) or "none"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> Tolerance:
        return cls(**dict(data))

    @classmethod
    def parse(cls, text: str, base: Tolerance | None = None) -> Tolerance:
        """Parse ``rel_l2=1e-2,atol=1e-3,rtol=1e-3,statistic=p99`` (keys optional).

        Raises:
            ValueError: Unknown key or a value that is not a number.
        """
        values = asdict(base or cls())
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, _, val = part.partition("=")
            key = key.strip().replace("-", "_")
            if key not in values:
                raise ValueError(f"unknown tolerance key {key!r}: use rel_l2, atol, rtol, "
                                 "statistic")
            if key == "statistic":
                values[key] = val.strip()
            else:
                values[key] = None if val.strip().lower() in ("none", "") else float(val)
        return cls(**values)


def default_tolerance(target: Precision) -> Tolerance:
    """Default tolerance for a target precision (see the module docstring for the source)."""
    return {Precision.FP16: Tolerance(1e-2), Precision.TF32: Tolerance(1e-2),
            Precision.BF16: Tolerance(8e-2), Precision.FP32: Tolerance(1e-4)}[target]


def elementwise_pass_share(reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray],
                           tol: Tolerance) -> float:
    """Share of elements meeting |c - r| <= atol + rtol*|r| (NaN/Inf in c never passes; a
    sample whose candidate shape differs counts as all of its reference elements failing)."""
    passed = total = 0
    for r, c in zip(reference, candidate):
        r64, c64 = np.asarray(r, np.float64), np.asarray(c, np.float64)
        if r64.shape != c64.shape:
            total += r64.size
            continue
        bound = (tol.atol or 0.0) + (tol.rtol or 0.0) * np.abs(r64)
        ok = np.abs(c64 - r64) <= bound
        passed += int(ok.sum())
        total += ok.size
    return passed / total if total else 1.0


def check(metrics: OutputMetrics, tol: Tolerance, pass_share: float | None = None
          ) -> tuple[bool, str]:
    """Verdict for one output.

    Args:
        metrics: The output's statistics.
        tol: Bounds to apply.
        pass_share: Result of ``elementwise_pass_share`` when ``tol`` has atol/rtol.

    Returns:
        (passed, reason) where reason names the violated bound with the numbers.
    """
    if metrics.shape_changed:
        return False, (f"shape differs from the reference on {metrics.shape_changed} "
                       f"sample{'s' if metrics.shape_changed > 1 else ''}")
    return check_values(metrics.rel_l2, metrics.nan, metrics.inf, tol, pass_share)


def check_values(rel_l2: float, nan: int, inf: int, tol: Tolerance,
                 pass_share: float | None = None) -> tuple[bool, str]:
    """``check`` from the numbers it reads: relative L2 error, NaN and Inf counts of the
    candidate, and the elementwise pass share (for ``tol`` with atol/rtol)."""
    if nan or inf:
        return False, f"candidate has {nan} NaN and {inf} Inf values"
    if tol.rel_l2 is not None and not rel_l2 <= tol.rel_l2:
        return False, f"rel_l2 {rel_l2:.3g} > {tol.rel_l2:g}"
    if pass_share is not None and pass_share < tol.required_share():
        return False, (f"{(1 - pass_share) * 100:.2f}% of elements exceed "
                       f"{tol.atol or 0:g} + {tol.rtol or 0:g}*|r| ({tol.statistic})")
    return True, "within " + tol.describe()
