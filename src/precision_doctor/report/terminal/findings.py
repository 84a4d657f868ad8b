"""Terminal rendering of findings as a list: one entry per cause, repeated causes grouped.

A finding repeated in every block of an encoder is one entry (``diagnosis.causes.groups``):
``activation-overflow: Pow b*/pow in blocks 3-7 (5 nodes), up to 4.35e+05; together 99% of the
error; remedy: ...``. Entries are lists, never table cells: a sentence folds at the console's
width with a hanging indent instead of being wrapped into a 20-character column, and long ONNX
names are shortened to their distinctive tail (``short_name``; the JSON and HTML reports keep
the full names).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from rich.console import Console
from rich.padding import Padding
from rich.text import Text

from precision_doctor.diagnosis.causes.findings import MINOR_IMPACT, Finding
from precision_doctor.diagnosis.causes.groups import FindingGroup, entries, name_pattern
from precision_doctor.diagnosis.causes.hazards import Hazard
from precision_doctor.diagnosis.report import DiagnosisReport
from precision_doctor.numbers import fmt3, fmt_share
from precision_doctor.report.terminal.sources import causes_by_module, known_sources, module_names

NAME_LIMIT = 36  # characters of an ONNX name in the terminal (longer: its tail, ``short_name``)
HAZARD_CHARS = 200  # of a hazard's sentence in a failing report (3 lines at 80 columns)
SHOWN_HAZARDS = 5  # kinds of medium/high hazards listed (they follow the measured findings)
FULL_ENTRIES = 3  # main entries shown with their evidence and remedy
SHOWN_ENTRIES = 10  # main entries shown at all (the rest are counted)
SHOWN_PARTS = 3  # parts of a joint group's pattern shown
_COLORS = {"error": "red", "warning": "yellow"}


def short_name(name: str, limit: int = NAME_LIMIT) -> str:
    """``name`` if it has at most ``limit`` characters, else its distinctive tail: the last
    ``/``-components that fit behind ``.../`` (``/model/encoder/layers.3/self_attn/Pow`` ->
    ``.../layers.3/self_attn/Pow``), or its last ``limit - 3`` characters behind ``...``."""
    if len(name) <= limit:
        return name
    parts = name.split("/")
    tail = parts[-1]
    for part in reversed(parts[:-1]):
        if len(part) + 1 + len(tail) + 4 > limit:
            break
        tail = f"{part}/{tail}"
    if len(tail) + 4 <= limit and tail != name:
        return ".../" + tail
    return "..." + name[-(limit - 3):]


def short_pattern(pattern: str, parts: int = SHOWN_PARTS) -> str:
    """A group's pattern as shown: each `` + ``-joined part shortened (``short_name``), at
    most ``parts`` of them and a count of the rest."""
    pieces = pattern.split(" + ")
    shown = " + ".join(short_name(p) for p in pieces[:parts])
    return shown + (f" + {len(pieces) - parts} more" if len(pieces) > parts else "")


def impact_text(e: Finding | FindingGroup) -> str:
    """The measured share of an entry, or why it has none: ``impact 99%``, ``98% of what the
    joint cause's cure leaves (rel L2 4.88e-02 -> 8.27e-04)``, ``not measured: <reason>``."""
    residual = e.evidence.get("residual_share") if isinstance(e, Finding) else None
    after = ""
    if isinstance(e, Finding) and isinstance(residual, (int, float)):
        after = (f"{fmt_share(residual)} of what the "
                 f"{e.evidence.get('residual_cure', 'joint cause')}'s cure leaves (rel L2 "
                 f"{fmt3(e.evidence.get('residual_before'))} -> "
                 f"{fmt3(e.evidence.get('residual_after'))})")
    if e.impact is not None:
        return f"impact {fmt_share(e.impact)}" + (f"; {after}" if after else "")
    return after or f"not measured: {e.not_measured or 'no reason recorded (an older report)'}"


def group_line(g: FindingGroup, remedy: bool = True) -> str:
    """One sentence for a group: kind, op and pattern, blocks, magnitudes, joint impact (or why
    it was not measured), and (``remedy``) the remedy (``FindingGroup.describe`` with the
    pattern shortened)."""
    why = f"; not measured: {g.not_measured}" if g.impact is None and g.not_measured else ""
    return (f"{g.kind}: {g.describe(short_pattern(g.pattern))}{why}"
            + (f"; remedy: {g.remedy}" if remedy else ""))


def _entry(i: int, e: Finding | FindingGroup, full: bool,
           modules: Mapping[str, str | None] | None = None) -> list[Text]:
    color = _COLORS.get(e.severity, "")
    if isinstance(e, FindingGroup):
        held = module_names(e.members, modules or {})
        return [Text.assemble(f"#{i} ", (group_line(e, full), color)),
                *([Text(f"modules: {held}", style="cyan")] if held else [])]
    head = Text.assemble(f"#{i} ", (e.kind, color),
                         f": {e.op_type} {short_name(e.node)} ({impact_text(e)})")
    where = [Text(f"source: {e.source.describe()}", style="cyan")] \
        if e.source is not None and e.source.describe() else []
    return [head, *where, Text(e.summary), Text(f"remedy: {e.remedy}")] if full \
        else [head, *where]


def render_findings(report: DiagnosisReport, console: Console) -> None:
    """The main findings as a list (groups once; the first ``FULL_ENTRIES`` with their
    evidence and remedy, the next up to ``SHOWN_ENTRIES`` in one line each), then one line
    for the minor ones with why those without a share have none."""
    listed = entries(report.findings, report.finding_groups)
    # a pass: nothing was measured to matter, so every finding is counted in one line
    main = [] if report.passed else [e for e in listed if e.group == "main"]
    modules = {n: s.module for n, s in known_sources(report).items()}
    if main:
        console.print(Text("Findings (ranked by measured impact)", style="italic"))
        for i, e in enumerate(main[:SHOWN_ENTRIES], 1):
            first, *rest = _entry(i, e, i <= FULL_ENTRIES, modules)
            console.print(first)
            for line in rest:
                console.print(Padding(line, (0, 0, 0, len(f"#{i} "))))
        if len(main) > SHOWN_ENTRIES:
            console.print(f"  ({len(main) - SHOWN_ENTRIES} more main entries in the JSON and "
                          "HTML reports)")
        by_module = causes_by_module(report)
        if by_module:
            console.print(Text(by_module, style="cyan"))
    elif not report.passed:
        console.print("No main findings.")
    minor = [e for e in listed if e not in main]
    if not minor:
        return
    count: Counter[str] = Counter()
    why: Counter[str] = Counter()
    by_node = {f.node: f for f in report.findings}
    for e in minor:
        count[e.kind] += len(e.members) if isinstance(e, FindingGroup) else 1
        members = ([by_node[m] for m in e.members if m in by_node]
                   if isinstance(e, FindingGroup) else [e])
        why.update(f.not_measured for f in members if f.impact is None and f.not_measured
                   and "residual_share" not in f.evidence)  # measured on the main cure
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(count.items()))
    groups = sum(isinstance(e, FindingGroup) for e in minor)
    if groups:
        kinds += f" (in {groups} group(s) repeated per block)"
    if report.passed:
        console.print(f"{len(report.findings)} finding(s) ({kinds}); none breaks the "
                      "tolerance on these inputs (--html lists them).")
    else:
        reasons = "".join(f"; {n} not measured: {r}" for r, n in why.most_common(2))
        console.print(f"{sum(count.values())} minor finding(s) collapsed (measured impact < "
                      f"{MINOR_IMPACT:.0%} each, or unmeasured warnings): {kinds}{reasons}; "
                      "see the JSON or HTML report")


def render_hazards(report: DiagnosisReport, console: Console) -> None:
    """On a pass one line; otherwise the medium/high hazards, repeated ones once."""
    total = len(report.hazards)
    if not total:
        return
    if report.passed:
        console.print(f"{total} static hazard(s) checked, none measured to matter.")
        return
    hazards = [h for h in report.hazards if h.severity != "low"]
    if not hazards:
        return
    console.print(f"Static hazards ({len(hazards)} medium/high of {total}):")
    grouped = _hazard_groups(hazards)
    for h, n in grouped[:SHOWN_HAZARDS]:
        more = f" (and {n - 1} more like it)" if n > 1 else ""
        detail = h.detail if len(h.detail) <= HAZARD_CHARS else h.detail[:HAZARD_CHARS] + "..."
        console.print(Text(f"  - [{h.severity}] {detail}{more}"))
    if len(grouped) > SHOWN_HAZARDS:
        console.print(f"  ({len(grouped) - SHOWN_HAZARDS} more kinds in the JSON and "
                      "HTML reports)")


def _hazard_groups(hazards: Sequence[Hazard]) -> list[tuple[Hazard, int]]:
    """Hazards of one kind, op and name pattern once, with their count."""
    seen: dict[tuple[str, str, str, str], int] = {}
    out: list[list] = []
    for h in hazards:
        key = (h.kind, h.op_type, h.severity, name_pattern(h.node)[0])
        if key in seen:
            out[seen[key]][1] += 1
        else:
            seen[key] = len(out)
            out.append([h, 1])
    return [(h, n) for h, n in out]


__all__ = ["group_line", "impact_text", "render_findings", "render_hazards", "short_name",
           "short_pattern"]
