"""Self-contained HTML report of a diagnosis (and, optionally, of a fix).

One file, no network: CSS, JavaScript and SVG plots are inline. The page is a list of
``Section`` objects (``report.templating``), each rendered by one function from one template in
``report/templates``; ``report_sections`` decides their order, so a new section is one more
function and one more template. The diagnosis's sections are here, the fix's in
``report.html_fix``.

Security: every model-derived string (node, tensor, output and file names, messages) is
untrusted input. All templates render with Jinja2 autoescaping, plots never contain model
names (see ``plots``), and a Content-Security-Policy allows only the page's own script (by its
SHA-256 hash, CSP Level 2) and no network access at all.
"""

from __future__ import annotations

import base64
import hashlib
import math
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from markupsafe import Markup

from precision_doctor.diagnosis.causes.findings import Finding
from precision_doctor.diagnosis.causes.groups import FindingGroup, entries
from precision_doctor.diagnosis.report import DiagnosisReport
from precision_doctor.layerwise.compare import LayerRecord, LayerwiseResult
from precision_doctor.report import plots
from precision_doctor.report.evidence import (
    evidence_sentences,
    flip_counts,
    listed_flips,
    tightest,
)
from precision_doctor.report.html_fix import fix_verdict_section, render_fix_section
from precision_doctor.report.templating import (
    COLLAPSE_ROWS,
    Section,
    environment,
    model_name,
    render,
)
from precision_doctor.report.terminal.sources import causes_by_module, known_sources, module_names

FOCUS_ROWS = 14  # rows of the "around the first divergence" table
MAX_TABLE_ROWS = 4000  # the full layerwise table keeps the most telling rows beyond this
_HAZARD_RANK = {"high": 0, "medium": 1, "low": 2}


def _row_ids(lw: LayerwiseResult | None) -> dict[str, str]:
    """Anchor of each tensor's (and each node's first) row in the full layerwise table."""
    ids: dict[str, str] = {}
    for i, r in enumerate(lw.records if lw else ()):
        ids.setdefault(r.tensor, f"t-{i}")
        ids.setdefault("node:" + r.node, f"t-{i}")
    return ids


def _anchor(ids: Mapping[str, str], tensor: str, node: str) -> str | None:
    return ids.get(tensor) or ids.get("node:" + node)


def verdict_section(report: DiagnosisReport, secondary: bool = False) -> Section:
    """The verdict: PASS/FAIL, target, candidate vs reference, samples, key numbers.

    ``secondary``: the page is a fix report (headlined by ``fix_verdict_section``); this verdict
    is the fixed model against the default tolerance and is labelled as such.
    """
    outputs = list(report.outputs)
    worst = max(outputs, key=lambda o: _finite_or_max(o.metrics.rel_l2), default=None)
    lw = report.layerwise
    first = lw.record(lw.first_divergence) if lw and lw.first_divergence else None
    birth = lw.record(lw.nan_birth) if lw and lw.nan_birth else None
    severities = [h.severity for h in report.hazards]
    metric = next((d.suggested_metric for d in report.decisions if d.suggested_metric), None)
    return Section("diagnosis" if secondary else "verdict",
                   "Default tolerance" if secondary else "Verdict", render(
        "verdict.j2", r=report, model_name=model_name(report), worst=worst, secondary=secondary,
        failing=[o for o in outputs if not o.passed], first=first, birth=birth,
        top=entries(report.findings, report.finding_groups)[0] if report.findings else None,
        errors=sum(f.severity == "error" for f in report.findings),
        hazards_high=severities.count("high") + severities.count("medium"),
        tightest=tightest(lw), metric=metric))


def assessment_section(report: DiagnosisReport) -> Section | None:
    """Assessment, accuracy against labels (``api.Diagnosis.accuracy``), decisions, flips and
    the rewritten run (None without an assessment)."""
    from precision_doctor.compare.tasks.accuracy import accuracy_line

    if report.assessment is None:
        return None
    accuracy = accuracy_line(getattr(report, "accuracy", None) or {})
    listed = listed_flips(report)
    return Section("assessment", "Assessment", render(
        "assessment.j2", r=report, accuracy=accuracy,
        evidence=evidence_sentences(report.assessment.evidence, report.target), listed=listed,
        unlisted=[f for f in report.decision_flips if f not in listed],
        flip_counts=flip_counts(report)))


def outputs_section(report: DiagnosisReport) -> Section:
    """Per-output metrics against the tolerance and the FP32 noise floor."""
    return Section("outputs", "Outputs", render("outputs.j2", outputs=report.outputs))


def lengths_section(report: DiagnosisReport) -> Section | None:
    """Outputs of another shape than the reference's, the decisions behind them, the cure."""
    if report.lengths is None:
        return None
    return Section("lengths", "Lengths", render("lengths.j2", l=report.lengths,
                                                sources=known_sources(report)))


def recording_html_section(report: DiagnosisReport) -> Section | None:
    """The recorded candidate: who recorded it, what is missing, emulated vs recorded error."""
    rec = report.recording
    if not rec:
        return None
    cc = rec.get("cross_check")
    return Section("recording", "Recording", render(
        "recording.j2", rec=rec, cc=cc, worse=set(cc.get("worse_than_emulated", ())) if cc
        else set()))


def findings_section(report: DiagnosisReport) -> Section:
    """Findings ranked by measured impact: evidence, impact, remedy."""
    ids = _row_ids(report.layerwise)
    listed = entries(report.findings, report.finding_groups)  # repeated findings: one group
    ordered = sorted(listed, key=lambda f: f.group != "main")  # minor ones collapse
    by_node = {f.node: f for f in report.findings}
    modules = {n: s.module for n, s in known_sources(report).items()}
    items = [(f, _anchor(ids, f.tensor, f.node) if isinstance(f, Finding) else
              _anchor(ids, "", f.members[0]),
              [by_node[m] for m in f.members if m in by_node]
              if isinstance(f, FindingGroup) else [])
             for f in ordered]
    return Section("findings", "Findings", render(
        "findings.j2", items=items, passed=report.passed, total=len(report.findings),
        shown=sum(f.group == "main" for f in ordered), by_module=causes_by_module(report),
        held_by=lambda nodes: module_names(nodes, modules)))


def plots_section(report: DiagnosisReport) -> Section | None:
    """Error vs depth and range vs format limits (None without a layerwise comparison)."""
    lw = report.layerwise
    if lw is None or not lw.records:
        return None
    floor = max(report.noise.per_output.values(), default=None) if report.noise else None
    closest = tightest(lw)
    return Section("plots", "Plots", render(
        "plots.j2", lw=lw, error_svg=Markup(plots.error_vs_depth_svg(lw, floor) or ""),
        range_svg=Markup(plots.range_svg(lw) or ""), floor=floor,
        first=lw.record(lw.first_divergence) if lw.first_divergence else None,
        birth=lw.record(lw.nan_birth) if lw.nan_birth else None, tightest=closest,
        overflowing=sum(1 for r in lw.records if r.overflow), ids=_row_ids(lw),
        have_plots=plots.available()))


def hazards_section(report: DiagnosisReport) -> Section:
    """The static hazard scan, high severity first; low ones collapsed."""
    ids = _row_ids(report.layerwise)
    rows = sorted(report.hazards, key=lambda h: (_HAZARD_RANK.get(h.severity, 3), h.kind))
    items = [(h, _anchor(ids, h.tensor, h.node)) for h in rows]
    return Section("hazards", "Hazards", render(
        "hazards.j2", main=[i for i in items if i[0].severity != "low"],
        low=[i for i in items if i[0].severity == "low"], target=report.target))


def layerwise_section(report: DiagnosisReport) -> Section | None:
    """The layerwise table: the rows around the first divergence, then every tensor."""
    lw = report.layerwise
    if lw is None:
        return None
    recs = list(enumerate(lw.records))
    pos = {r.tensor: i for i, r in recs}
    if len(recs) <= FOCUS_ROWS:
        focus, focus_title = [], ""
    elif lw.first_divergence in pos:
        start = max(0, pos[lw.first_divergence] - FOCUS_ROWS // 2)
        focus, focus_title = recs[start:start + FOCUS_ROWS], "Around the first divergence"
    else:
        focus = sorted(recs, key=lambda ir: -_finite_or_max(ir[1].rel_l2))[:FOCUS_ROWS]
        focus_title = "Largest errors"
    shown = _telling_rows(lw, recs, MAX_TABLE_ROWS)
    return Section("layerwise", "Layerwise", render(
        "layerwise.j2", lw=lw, focus=focus, focus_title=focus_title, recs=shown,
        total=len(recs), collapse=len(recs) > COLLAPSE_ROWS, counts=_layer_counts(lw.records),
        sources=known_sources(report)))


def transformer_section(report: DiagnosisReport) -> Section | None:
    """Per-block FP16 headroom of a transformer (``diagnosis.headroom.probe``), if measured."""
    t = report.transformer
    if not t:
        return None
    return Section("transformer", "Transformer", render(
        "transformer.j2", t=t, collapse=len(t.get("layernorms", ())) > COLLAPSE_ROWS))


def reproduce_section(report: DiagnosisReport, command: str | None) -> Section:
    """The exact command (or, when it was not recorded, the shape of one)."""
    path = report.model.get("path") or "MODEL.onnx"
    example = shlex.join(["precision-doctor", "diagnose", str(path), "--data", "DATA",
                          "--target", report.target, "--html", "report.html"])
    return Section("reproduce", "Reproduce", render(
        "reproduce.j2", command=command, example=example))


def details_section(report: DiagnosisReport) -> Section:
    """Model, samples, noise floor probes, emulation, timings, warnings."""
    return Section("details", "Run details", render(
        "details.j2", r=report, collapse=len(report.samples) > 8))


def report_sections(report: DiagnosisReport, fix: Mapping[str, Any] | None = None,
                    command: str | None = None) -> list[Section]:
    """The page's sections in order (verdict first); sections without data are left out.

    A fix report (``fix`` with an ``objective``) opens with the result against that objective
    and the fix section; the diagnosis of the fixed model follows as secondary information.
    """
    head: list[Section | None]
    if fix is not None and fix.get("objective"):
        head = [fix_verdict_section(report, fix), render_fix_section(fix),
                verdict_section(report, secondary=True), assessment_section(report),
                outputs_section(report), lengths_section(report)]
    else:
        head = [verdict_section(report), assessment_section(report), outputs_section(report),
                lengths_section(report), recording_html_section(report),
                render_fix_section(fix) if fix is not None else None]
    sections = [*head,
                findings_section(report), plots_section(report), hazards_section(report),
                layerwise_section(report), transformer_section(report),
                reproduce_section(report, command),
                details_section(report)]
    return [s for s in sections if s is not None]


def render_html(report: DiagnosisReport, fix: Mapping[str, Any] | None = None,
                command: str | None = None) -> str:
    """Render ``report`` as one self-contained HTML page.

    Args:
        report: The diagnosis.
        fix: Optional fix summary (see ``render_fix_section``), shown after the outputs.
        command: The exact command line that produced the report (shown to reproduce it).

    Returns:
        The HTML text (UTF-8, no external resources).
    """
    script = render("script.js.j2")
    digest = base64.b64encode(hashlib.sha256(str(script).encode()).digest()).decode()
    passed = report.passed
    if fix is not None and fix.get("objective"):
        passed = bool((fix["objective"].get("after") or {}).get("passed"))
    verdict = "PASS" if passed else "FAIL"
    return environment().get_template("report.html.j2").render(passed=passed,
        sections=report_sections(report, fix, command), script=script,
        script_hash=f"sha256-{digest}", r=report, verdict=verdict,
        title=f"{verdict}: {model_name(report)} in {report.target.upper()} - precision-doctor")


def _finite_or_max(x: float) -> float:
    return 1e308 if math.isnan(x) or math.isinf(x) else x


def _layer_counts(records: Sequence[LayerRecord]) -> dict[str, int]:
    return {"overflow": sum(1 for r in records if r.overflow),
            "flush": sum(1 for r in records if r.flush_to_zero),
            "nonfinite": sum(1 for r in records if r.cand_nan or r.cand_inf)}


def _telling_rows(lw: LayerwiseResult, recs: list[tuple[int, LayerRecord]], limit: int
                  ) -> list[tuple[int, LayerRecord]]:
    """At most ``limit`` rows in topological order: flagged rows first, then largest errors."""
    if len(recs) <= limit:
        return recs

    def rank(item: tuple[int, LayerRecord]) -> tuple[bool, float]:
        r = item[1]
        flagged = (r.tensor in (lw.first_divergence, lw.nan_birth) or r.overflow > 0
                   or r.cand_nan + r.cand_inf > 0 or r.flush_to_zero > 0)
        return (not flagged, -_finite_or_max(r.rel_l2))

    return sorted(sorted(recs, key=rank)[:limit], key=lambda item: item[0])


