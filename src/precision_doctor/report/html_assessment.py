"""The HTML assessment section: assessment, accuracy against labels, decisions, flips, rewritten
run (``assessment.j2``).

Numbers go through ``numbers.fmt3`` (the template's ``sci`` filter), as in the terminal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from precision_doctor.diagnosis.report import DiagnosisReport
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
    from precision_doctor.compare.tasks.accuracy import accuracy_line
    from precision_doctor.report.html import Section, _render

    if report.assessment is None:
        return None
    accuracy = accuracy_line(getattr(report, "accuracy", None) or {})  # api.Diagnosis
    return Section("assessment", "Assessment", _render("assessment.j2", r=report,
                                                       accuracy=accuracy))


__all__ = ["assessment_section", "sci"]
