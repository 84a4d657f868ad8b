"""Self-contained HTML report of a diagnosis (and, optionally, of a fix).

One file, no network: CSS, JavaScript and SVG plots are inline. The page is a list of
``Section`` objects, each rendered by one function from one template in ``report/templates``;
``report_sections`` decides their order, so a new section (e.g. the fix summary) is one more
function and one more template.

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
from dataclasses import dataclass
from functools import lru_cache
from pathlib import PurePath
from typing import Any

import jinja2
from markupsafe import Markup

from precision_doctor.diagnosis.report import DiagnosisReport
from precision_doctor.layerwise.compare import LayerRecord, LayerwiseResult
from precision_doctor.numbers import fmt3, fmt_vs
from precision_doctor.report import plots
from precision_doctor.report.html_assessment import assessment_section, sci

FOCUS_ROWS = 14  # rows of the "around the first divergence" table
COLLAPSE_ROWS = 40  # longer tables start collapsed in <details>
SHOWN_FINDINGS = 5  # further findings start collapsed
FIX_METRICS = ("rel_l2", "max_abs", "p99_abs", "mean_abs", "cosine", "snr_db", "nan", "inf",
               "argmax_agreement")  # shown per output in the fix's before/after table
MAX_TABLE_ROWS = 4000  # the full layerwise table keeps the most telling rows beyond this
_HAZARD_RANK = {"high": 0, "medium": 1, "low": 2}
_FINDING_RANK = {"error": 0, "warning": 1, "info": 2}


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


# ----------------------------------------------------------------------------- formatting
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


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("precision_doctor", "report/templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(num=fmt_num, sortkey=sort_key, pct=fmt_pct, sci=sci)
    return env


def _render(template: str, **context: Any) -> Markup:
    return Markup(_env().get_template(template).render(**context))


# ----------------------------------------------------------------------------- sections
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
    return Section("diagnosis" if secondary else "verdict",
                   "Default tolerance" if secondary else "Verdict", _render(
        "verdict.j2", r=report, model_name=_model_name(report), worst=worst, secondary=secondary,
        failing=[o for o in outputs if not o.passed], first=first, birth=birth,
        top=report.findings[0] if report.findings else None,
        errors=sum(f.severity == "error" for f in report.findings),
        hazards_high=severities.count("high") + severities.count("medium")))


def outputs_section(report: DiagnosisReport) -> Section:
    """Per-output metrics against the tolerance and the FP32 noise floor."""
    return Section("outputs", "Outputs", _render("outputs.j2", outputs=report.outputs))


def recording_html_section(report: DiagnosisReport) -> Section | None:
    """The recorded candidate: who recorded it, what is missing, emulated vs recorded error."""
    rec = report.recording
    if not rec:
        return None
    cc = rec.get("cross_check")
    return Section("recording", "Recording", _render(
        "recording.j2", rec=rec, cc=cc, worse=set(cc.get("worse_than_emulated", ())) if cc
        else set()))


def findings_section(report: DiagnosisReport) -> Section:
    """Findings ranked by measured impact: evidence, impact, remedy."""
    ids = _row_ids(report.layerwise)
    ordered = sorted(report.findings, key=lambda f: f.group != "main")  # minor ones collapse
    items = [(f, _anchor(ids, f.tensor, f.node)) for f in ordered]
    return Section("findings", "Findings", _render(
        "findings.j2", items=items, passed=report.passed,
        shown=sum(f.group == "main" for f in ordered)))


def plots_section(report: DiagnosisReport) -> Section | None:
    """Error vs depth and range vs format limits (None without a layerwise comparison)."""
    lw = report.layerwise
    if lw is None or not lw.records:
        return None
    floor = max(report.noise.per_output.values(), default=None) if report.noise else None
    finite = [r for r in lw.records if r.ref_max_abs > 0 and math.isfinite(r.headroom_bits)]
    tightest = min(finite, key=lambda r: r.headroom_bits, default=None)
    return Section("plots", "Plots", _render(
        "plots.j2", lw=lw, error_svg=Markup(plots.error_vs_depth_svg(lw, floor) or ""),
        range_svg=Markup(plots.range_svg(lw) or ""), floor=floor,
        first=lw.record(lw.first_divergence) if lw.first_divergence else None,
        birth=lw.record(lw.nan_birth) if lw.nan_birth else None, tightest=tightest,
        overflowing=sum(1 for r in lw.records if r.overflow), ids=_row_ids(lw),
        have_plots=plots.available()))


def hazards_section(report: DiagnosisReport) -> Section:
    """The static hazard scan, high severity first; low ones collapsed."""
    ids = _row_ids(report.layerwise)
    rows = sorted(report.hazards, key=lambda h: (_HAZARD_RANK.get(h.severity, 3), h.kind))
    items = [(h, _anchor(ids, h.tensor, h.node)) for h in rows]
    return Section("hazards", "Hazards", _render(
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
    return Section("layerwise", "Layerwise", _render(
        "layerwise.j2", lw=lw, focus=focus, focus_title=focus_title, recs=shown,
        total=len(recs), collapse=len(recs) > COLLAPSE_ROWS, counts=_layer_counts(lw.records)))


def transformer_section(report: DiagnosisReport) -> Section | None:
    """Per-block FP16 headroom of a transformer (``diagnosis.headroom.probe``), if measured."""
    t = report.transformer
    if not t:
        return None
    return Section("transformer", "Transformer", _render(
        "transformer.j2", t=t, collapse=len(t.get("layernorms", ())) > COLLAPSE_ROWS))


def reproduce_section(report: DiagnosisReport, command: str | None) -> Section:
    """The exact command (or, when it was not recorded, the shape of one)."""
    path = report.model.get("path") or "MODEL.onnx"
    example = shlex.join(["precision-doctor", "diagnose", str(path), "--data", "DATA",
                          "--target", report.target, "--html", "report.html"])
    return Section("reproduce", "Reproduce", _render(
        "reproduce.j2", command=command, example=example))


def details_section(report: DiagnosisReport) -> Section:
    """Model, samples, noise floor probes, emulation, timings, warnings."""
    return Section("details", "Run details", _render(
        "details.j2", r=report, collapse=len(report.samples) > 8))


def render_fix_section(fix_summary: Mapping[str, Any]) -> Section:
    """The fix summary: before/after metrics, FP32 share, the precision plan, engine recipes.

    Args:
        fix_summary: Plain dict. Keys (all optional): ``before`` / ``after``: metrics as
            ``{metric: value}`` or ``{output: {metric: value}}``; ``plan``: list of
            ``{"node", "op_type", "precision", "reason", "detail"}``; ``fp32_share_nodes`` /
            ``fp32_share_flops``: shares in [0, 1]; ``recipes``: ``{name: command}``;
            ``verdict``: ``pass``/``fail`` of the fixed model; ``model``: written model path;
            ``objective``: ``{"text", "target", "score_label", "threshold", "higher_is_better",
            "before": {"value", "passed"}, "after": {...}, "accuracy" (a line)}`` (with it, the
            page is headlined by ``fix_verdict_section``); ``resolved``: list of
            ``ResolvedCause.to_dict()`` (causes the fix removed).

    Returns:
        The section (id ``fix``).
    """
    before, after = _flatten(fix_summary.get("before") or {}), _flatten(
        fix_summary.get("after") or {})
    rows = [(k, before.get(k), after.get(k), _ratio(before.get(k), after.get(k)),
             6 if k.endswith(("cosine", "agreement")) else 3)
            for k in list(before) + [k for k in after if k not in before]]
    plan = [dict(p) for p in fix_summary.get("plan") or ()]
    return Section("fix", "Fix", _render(
        "fix.j2", rows=rows, plan=plan, collapse=len(plan) > COLLAPSE_ROWS,
        share_nodes=fix_summary.get("fp32_share_nodes"),
        share_flops=fix_summary.get("fp32_share_flops"),
        recipes=dict(fix_summary.get("recipes") or {}), verdict=fix_summary.get("verdict"),
        model=fix_summary.get("model")))


def fix_verdict_section(report: DiagnosisReport, fix_summary: Mapping[str, Any]) -> Section:
    """The headline of a fix report: the fixed model against the objective the user set (task
    metric + threshold, or tolerance), beside the original model's naive score, and the causes
    the fix removed.

    Args:
        report: The diagnosis of the fixed model (for the model name).
        fix_summary: See ``render_fix_section``; uses ``objective`` and ``resolved``.
    """
    o = fix_summary["objective"]
    threshold, higher = o.get("threshold"), bool(o.get("higher_is_better"))
    before, after = o.get("before") or {}, o.get("after") or {}
    fx = {"passed": bool(after.get("passed")), "before_passed": bool(before.get("passed")),
          "target": o.get("target") or report.target, "objective": o.get("text", ""),
          "score_label": o.get("score_label", "score"),
          "threshold": "–" if threshold is None else f"{float(threshold):g}",
          "op": "≥" if higher else "≤", "accuracy": o.get("accuracy", ""),
          "before_text": fmt_vs(_number(before.get("value")), threshold, higher),
          "after_text": fmt_vs(_number(after.get("value")), threshold, higher)}
    return Section("verdict", "Verdict", _render(
        "fix_verdict.j2", fx=fx, model_name=_model_name(report),
        resolved=[dict(c) for c in fix_summary.get("resolved") or ()]))


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
                outputs_section(report)]
    else:
        head = [verdict_section(report), assessment_section(report), outputs_section(report),
                recording_html_section(report),
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
    script = _render("script.js.j2")
    digest = base64.b64encode(hashlib.sha256(str(script).encode()).digest()).decode()
    passed = report.passed
    if fix is not None and fix.get("objective"):
        passed = bool((fix["objective"].get("after") or {}).get("passed"))
    verdict = "PASS" if passed else "FAIL"
    return _env().get_template("report.html.j2").render(passed=passed,
        sections=report_sections(report, fix, command), script=script,
        script_hash=f"sha256-{digest}", r=report, verdict=verdict,
        title=f"{verdict}: {_model_name(report)} in {report.target.upper()} - precision-doctor")


# ----------------------------------------------------------------------------- helpers
def _model_name(report: DiagnosisReport) -> str:
    path = report.model.get("path")
    return PurePath(path).name if path else "model"


def _number(x: Any) -> float | None:
    """A JSON number (``"inf"``/``"nan"`` strings too) as a float; None stays None."""
    return None if x is None else float(x)


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


def _flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{output: {metric: v}}`` -> ``{"output · metric": v}``; OutputMetrics dicts keep only
    ``FIX_METRICS``; JSON's "inf"/"nan" strings become floats."""
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, Mapping):
            keep = ({k: value[k] for k in FIX_METRICS if k in value} if "rel_l2" in value
                    else value)
            flat.update(_flatten(keep, f"{prefix}{key} · "))
        else:
            flat[f"{prefix}{key}"] = float(value) if value in ("inf", "-inf", "nan") else value
    return flat


def _ratio(before: Any, after: Any) -> float | None:
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                  for v in (before, after))
    return after / before if numbers and before != 0 else None
