"""JSON encoding shared by every result: non-finite floats and the stable text form.

JSON has no numbers for infinity or NaN, so every report writes them as the strings ``"inf"``,
``"-inf"`` and ``"nan"`` (:func:`json_float`) and reads them back with :func:`from_json_float`.
:func:`dumps` is the one text form of a report: indented, sorted keys, UTF-8 kept, so that two
runs with the same results give byte-identical files.
"""

from __future__ import annotations

import json
import math
from typing import Any


def json_float(v: Any) -> Any:
    """``v`` unchanged, except a non-finite float becomes ``"inf"``, ``"-inf"`` or ``"nan"``."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def from_json_float(v: Any) -> Any:
    """Inverse of :func:`json_float`: ``"inf"``/``"-inf"``/``"nan"`` (any str) -> float."""
    return float(v) if isinstance(v, str) else v


def dumps(data: object) -> str:
    """The stable JSON text of ``data`` (indent 2, sorted keys, non-ASCII kept), newline-ended."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


__all__ = ["dumps", "from_json_float", "json_float"]
