"""How every report (terminal, HTML, the texts of the diagnosis) writes a number: one formatter,
so the same value reads the same everywhere.

Rules (every report readable at 80 columns):

- A metric (relative L2, max/p99/mean abs error, noise floor, headroom, ratios) gets **3
  significant digits**. Magnitudes in [0.1, 1000) are written in fixed notation (``0.999``,
  ``24.5``, ``145``); smaller or larger ones in scientific notation with a two-digit exponent
  (``1.14e-02``, ``9.79e+07``). Every such string is at most 9 characters wide (``-1.14e-02``),
  which is what lets a terminal table give each number column a fixed minimum width.
- A score compared against a threshold (a task metric such as mask IoU >= 0.99) gets the digits
  needed to show on which side of the threshold it lies: 0.98996 against 0.99 is written
  ``0.98996``, never ``0.990`` (see ``fmt_vs``).
- A share in [0, 1] is a percentage (``fmt_share``).

The JSON report keeps full precision; these strings are only for people.
"""

from __future__ import annotations

import math
from typing import Any

WIDTH = 9  # the widest fmt3 string: sign, 3 digits, point, "e", sign, 2 exponent digits
MISSING = "-"


def fmt3(x: Any) -> str:
    """A metric value with 3 significant digits.

    Args:
        x: A float or int (bools and None allowed: ``yes``/``no``, ``-``).

    Returns:
        ``"1.14e-02"``, ``"0.999"``, ``"24.5"``, ``"145"``, ``"0"``, ``"inf"``, ``"-inf"``,
        ``"nan"``; never wider than ``WIDTH`` characters for finite numbers.
    """
    if x is None:
        return MISSING
    if isinstance(x, bool):
        return "yes" if x else "no"
    v = float(x)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "0"
    rounded = float(f"{v:.2e}")  # 999.6 rounds to 1.00e+03: decide the style on the rounding
    if 0.1 <= abs(rounded) < 1000:
        return f"{v:#.3g}".rstrip(".")
    return f"{v:.2e}"


def fmt_count(n: Any) -> str:
    """An integer count (NaN count, overflowed elements) in full: counts are exact."""
    return MISSING if n is None else str(int(n))


def fmt_share(x: float | None, digits: int = 0) -> str:
    """A share in [0, 1] as a percentage (``0.0213`` -> ``2%``), ``-`` when not measured."""
    return MISSING if x is None or math.isnan(x) else f"{x:.{digits}%}"


def fmt_vs(value: float | None, threshold: float | None, higher_is_better: bool = True,
           min_digits: int = 3, max_digits: int = 9) -> str:
    """A score with the fewest significant digits (>= ``min_digits``) that keep it on its own
    side of ``threshold``.

    3 significant digits can put a failing score on the passing side (0.98996 -> ``0.990`` against
    a threshold of 0.99): digits are added until the printed value passes or fails the same way
    as the true one.

    Args:
        value: The score.
        threshold: The pass mark (None: plain ``fmt3``).
        higher_is_better: Whether the score must be >= the threshold (else <=).
        min_digits / max_digits: The range of significant digits tried.

    Returns:
        The score as text.
    """
    if value is None or threshold is None or not math.isfinite(value):
        return fmt3(value)

    def passes(v: float) -> bool:
        return v >= threshold if higher_is_better else v <= threshold

    text = fmt3(value)
    for digits in range(min_digits, max_digits + 1):
        text = fmt3(value) if digits == 3 else f"{value:.{digits}g}"
        if passes(float(text)) == passes(value):
            return text
    return text
