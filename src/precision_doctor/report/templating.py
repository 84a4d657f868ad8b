"""The HTML report's building blocks: ``Section``, the Jinja2 environment with its number
filters, and what every section shares.

Templates live in ``report/templates`` and render with autoescaping and ``StrictUndefined``:
every model-derived string is escaped, and a missing variable is an error, not an empty cell.
Numbers are written as in the terminal (``numbers.fmt3``: 3 significant digits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import PurePath
from typing import Any

import jinja2
from markupsafe import Markup

from precision_doctor.diagnosis.report import DiagnosisReport
from precision_doctor.numbers import fmt3

COLLAPSE_ROWS = 40  # longer tables start collapsed in <details>


@dataclass(frozen=True)
class Section:
    """One section of the page.

    Attributes:
        id: HTML id and anchor (fixed by the code, ``[a-z-]``, never model-derived).
        title: Title in the navigation bar.
        html: The rendered section body (already escaped by its template).
    """

    id: str
    title: str
    html: Markup


def fmt_num(x: Any, digits: int = 3) -> str:
    """A number for a table cell: ``numbers.fmt3`` (3 significant digits, the terminal's
    strings) unless ``digits`` asks for more; ``∞``/``NaN``, ``–`` for None; integers (and
    integral floats below 1e6) in full with thousands separators."""
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if math.isnan(x):
            return "NaN"
        if math.isinf(x):
            return "∞" if x > 0 else "−∞"
        if x.is_integer() and abs(x) < 1e6:
            return f"{int(x):,}"
        return fmt3(x) if digits == 3 else f"{x:.{digits}g}"
    return str(x)


def sort_key(x: Any) -> str:
    """``data-sort`` value read by the page's sorting script (``parseFloat`` for numbers)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-Infinity"
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        if isinstance(x, int):
            return str(x)
        return "Infinity" if x == math.inf else "-Infinity" if x == -math.inf else f"{x:.7g}"
    return str(x)


def fmt_pct(x: float | None, digits: int = 0) -> str:
    """A share in [0, 1] as a percentage, ``not measured`` for None."""
    return "not measured" if x is None else f"{x:.{digits}%}"


def sci(x: object) -> str:
    """A JSON scalar for the page: numbers as ``precision_doctor.numbers.fmt3`` writes them, text
    unchanged, ``–`` for None."""
    if x is None:
        return "–"
    if isinstance(x, str):
        return fmt3(float(x)) if x in ("inf", "-inf", "nan") else x
    if isinstance(x, (int, float)):
        return fmt3(x)
    return str(x)


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The Jinja2 environment of ``report/templates`` (autoescaping, strict undefined)."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("precision_doctor", "report/templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(num=fmt_num, sortkey=sort_key, pct=fmt_pct, sci=sci)
    return env


def render(template: str, **context: Any) -> Markup:
    """Render ``template`` (a file in ``report/templates``) with ``context``, autoescaped."""
    return Markup(environment().get_template(template).render(**context))


def model_name(report: DiagnosisReport) -> str:
    """The model file's name for titles (``model`` without a path)."""
    path = report.model.get("path")
    return PurePath(path).name if path else "model"
