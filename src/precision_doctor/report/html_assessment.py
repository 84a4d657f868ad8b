"""The HTML assessment section: assessment, decisions, flips, rewritten run (``assessment.j2``).

Numbers use 3 significant digits in scientific notation (``1.14e-02``), as in the terminal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from precision_doctor.analysis.diagnosis import DiagnosisReport
from precision_doctor.numbers import fmt3

if TYPE_CHECKING:
    from precision_doctor.report.html import Section


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


def assessment_section(report: DiagnosisReport) -> Section | None:
    """The section (id ``assessment``), or None for a report without an assessment."""
    from precision_doctor.report.html import Section, _env

    if report.assessment is None:
        return None
    env = _env()
    env.filters.setdefault("sci", sci)
    html = env.get_template("assessment.j2").render(r=report)
    from markupsafe import Markup

    return Section("assessment", "Assessment", Markup(html))


__all__ = ["assessment_section", "sci"]
