"""Terminal rendering of the assessment, the decisions and their flips, and the rewritten run.

Printed right after the verdict line: the assessment is what a person reads first. Plain
``key: value`` lines (no tables), so that nothing is cut at 80 columns; numbers have 3
significant digits (``1.14e-02``), shares are percentages with one decimal.
"""

from __future__ import annotations

import math

from rich.console import Console
from rich.markup import escape

from precision_doctor.diagnosis.report import DiagnosisReport
from precision_doctor.numbers import fmt3, fmt_share
from precision_doctor.report.evidence import flip_counts, listed_flips
from precision_doctor.report.terminal.findings import short_name
from precision_doctor.report.terminal.sources import code_line, suffix_at

COLORS = {"within-tolerance": "green", "rounding": "yellow", "decision-flips": "yellow",
          "defect": "red", "unexplained": "red"}
LONG_NAME = 48  # characters of a node name on a line of its own (``short_name``)
SHOWN_NODES = 3  # nodes of the remedy named in the terminal (all of them in the JSON)
SHOWN_FLIPS = 10  # when the assessment is decision-flips
SHOWN_FLIPS_OTHERWISE = 3  # e.g. a broken map flips thousands of pixels: a sample is enough


def render_assessment(report: DiagnosisReport, console: Console) -> None:
    """Print the assessment block (nothing for a version-1 report without one); for a passing
    report, the assessment in one sentence (the rest is ``render_pass``'s)."""
    a = report.assessment
    if a is None:
        return
    if report.passed:
        console.print(f"[bold {COLORS.get(a.kind, 'green')}]Assessment: {a.kind}.[/] "
                      f"{escape(a.summary)}")
        return
    color = COLORS.get(a.kind, "white")
    console.print(f"[bold {color}]Assessment: {a.kind}[/]")
    console.print(f"  {escape(a.summary)}")
    console.print(f"  [bold]Remedy:[/] {escape(a.remedy)}")
    if report.explained_share is not None:
        share = report.explained_share
        what = ("The length cure and the findings' remedies" if report.lengths is not None
                and report.lengths.cured else "All findings' remedies together")
        console.print(f"  {what} remove {fmt_share(share, 1)} of the "
                      f"output error; unexplained: {fmt_share(1 - share, 1)}.")
    if a.nodes:
        shown = ", ".join(short_name(n, LONG_NAME) for n in a.nodes[:SHOWN_NODES])
        console.print(f"  Nodes ({len(a.nodes)}): {escape(shown)}"
                      + (f" and {len(a.nodes) - SHOWN_NODES} more (JSON assessment.nodes)"
                         if len(a.nodes) > SHOWN_NODES else ""))
    at = report.attribution
    if at:
        what = {"found": f"{len(at['nodes'])} node(s) in {len(at['clusters'])} group(s) whose "
                         "FP32 fallback removes 90% of the error",
                "spread": f"no set of at most {at['small_limit']} nodes suffices "
                          f"({at['kept_size']} needed): the error is spread",
                "budget": f"the budget ran out at {at['kept_size']} nodes before the set was "
                          "narrowed down"}.get(
            at["status"], "not even every compute node in FP32 removes 90%")
        console.print(f"  Attribution by measured cure: {what} ({at['evaluations']} "
                      f"evaluations, {fmt3(at['seconds'])} s).")
    _render_rewritten(report, console)
    for root in (report.lengths.roots[:SHOWN_NODES] if report.lengths is not None else ()):
        line = code_line(report, root, f"decision {short_name(root)}", console.width)
        if line:
            console.print(line, markup=False)
    _render_decisions(report, console)
    if report.largest_jump is not None and report.layerwise is not None:
        rec = report.layerwise.record(report.largest_jump)
        where = (f" ({escape(rec.op_type)} {escape(short_name(rec.node, LONG_NAME))})"
                 f"{escape(suffix_at(report, rec.node))}" if rec else "")
        console.print(f"First divergence by error jump: {escape(report.largest_jump)}{where}; "
                      "tolerance first crossed at: "
                      f"{escape(report.layerwise.first_divergence or 'nowhere')}")


def _render_rewritten(report: DiagnosisReport, console: Console) -> None:
    rw = report.rewritten
    if not rw:
        return
    worst = max((_float(o["metrics"]["rel_l2"]) for o in rw.get("outputs", ())), default=None)
    verdict = str(rw.get("verdict", "")).upper()
    color = "green" if verdict == "PASS" else "red"
    console.print(f"Rewritten model ({escape(', '.join(rw.get('rewrites', ())))}): "
                  f"[{color}]{verdict}[/], worst rel L2 {fmt3(worst)}")


def _render_decisions(report: DiagnosisReport, console: Console) -> None:
    for d in report.decisions:
        if d.kind.startswith("detection-"):
            console.print(f"Detection head {escape(d.output)} ({d.kind[10:]}): {d.flips} boxes "
                          f"appeared, vanished, moved or changed class ({d.near_ties} "
                          f"near-ties, {d.damage} damage); {d.task_metric} F1 "
                          f"{fmt_share(d.task_agreement, 1)}\n  read as: {escape(d.why)}")
            console.print(f"  suggested task metric: --metric {escape(d.suggested_metric or '')}")
            continue
        task = (f", {d.task_metric} agreement {fmt_share(d.task_agreement, 1)}"
                if d.task_agreement is not None else "")
        axis = "" if d.kind == "sigmoid-map" else f", axis {d.axis}"
        reading = ", ".join(f"{n} {label}" for n, label in (
            (d.near_ties, "near-tie"), (d.task_neutral, "task-neutral"), (d.damage, "damage"))
            if n)
        margin = (f" at FP32 margins ~{fmt3(d.damage_margin)}" if d.damage_margin is not None
                  else "")
        console.print(f"Decisions of {escape(d.output)} ({d.kind}{axis}): "
                      f"{d.flips} of {d.positions} flipped{task}"
                      + (f" ({reading}{margin})" if reading else "")
                      + ("; the output is destroyed (flips not listed)" if d.destroyed else "")
                      + f"; flips carry {fmt_share(d.flip_error_share, 1)} of the squared "
                      f"error; rel L2 without them {fmt3(d.rel_l2_without_flips)} (relative "
                      "to the whole output)")
        if d.suggested_metric:
            console.print(f"  suggested task metric: --metric {escape(d.suggested_metric)}")
    render_flip_lines(report, console)


def render_flip_lines(report: DiagnosisReport, console: Console) -> None:
    flips = listed_flips(report)
    shown = (SHOWN_FLIPS if report.assessment and report.assessment.kind == "decision-flips"
             else SHOWN_FLIPS_OTHERWISE)
    boxes = {d.output for d in report.decisions if d.kind.startswith("detection-")}
    for i, f in enumerate(flips[:shown], 1):
        if f.output in boxes:
            console.print(f"  box {i} ({f.reading}): {escape(f.detail)}")
            continue
        changed = {True: "changed", False: "unchanged", None: "unknown"}[f.task_changed]
        console.print(f"  flip {i}: {escape(f.sample)} {escape(f.output)} at {list(f.position)}: "
                      f"margin {fmt3(f.fp32_margin)}, FP32 noise {fmt3(f.fp32_noise)}, "
                      f"error share {fmt_share(f.error_share, 1)}, task result {changed}"
                      + (f", {f.reading}" if f.reading else ""))
    if len(flips) > shown:
        console.print(f"  ({len(flips) - shown} more listed flips in the JSON and HTML reports)")
    counts = flip_counts(report)
    if counts:
        console.print(f"  {counts}")


def _float(v: object) -> float:
    return float(v) if isinstance(v, (int, float, str)) else math.nan


__all__ = ["render_assessment", "render_flip_lines"]
