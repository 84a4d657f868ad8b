"""Terminal rendering (rich) of an ``AuditReport`` and a ``BuildDiff``.

Every engine-provided string goes through ``Text`` so that TensorRT names such as
``(Unnamed Layer* 12) [Shuffle]`` are never read as rich markup. Tables are
``tables.metric_table``: a table when it fits the console, key: value blocks when it
does not, so no time or header is cut at 80 columns. Engine names longer than the limits below
are shortened on purpose (the JSON report has them in full).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from rich.console import Console
from rich.text import Text

from precision_doctor.audit.diff import BuildDiff
from precision_doctor.audit.findings import KIND_ORDER
from precision_doctor.audit.records import (
    AuditFinding,
    AuditReport,
    EngineLayer,
)
from precision_doctor.report.terminal.tables import Cell, Col, MetricTable, metric_table

COLORS = {"fp32": "green", "tf32": "yellow", "fp16": "cyan", "bf16": "blue", "fp8": "magenta",
          "int8": "magenta", "mixed": "yellow", "unknown": "red", "not-honored": "red",
          "honored": "green", "not-found": "yellow", "confirmed": "red", "likely": "yellow",
          "possible": "dim"}
TITLES = {"fp32-not-honored": "FP32 requests not honored", "tf32-tactic": "TF32 tactics",
          "sensitive-op": "Sensitive ops in reduced precision",
          "reformat": "Reformats between precisions", "unreadable": "Not readable"}


def _p(label: str | None) -> Text:
    label = label or "-"
    return Text(label, style=COLORS.get(label, ""))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _short(text: str, width: int = 70) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _nodes(nodes: Sequence[str], n: int = 2) -> str:
    if not nodes:
        return "-"
    head = ", ".join(_short(x, 60) for x in nodes[:n])
    return head + (f" (+{len(nodes) - n})" if len(nodes) > n else "")


_PAIR_COLUMNS = (Col("A", "key", label="A layer"), Col("B", "text", label="B layer"),
                 Col("A → B", "tag"), Col("A ms"), Col("B ms"), Col("paired by", "tag"))


def layer_precision_label(layer: EngineLayer) -> str:
    """``unknown (fused Myelin region)`` for hidden fused layers, else the precision."""
    return "unknown (fused Myelin region)" if layer.fused and layer.precision == "unknown" \
        else layer.precision


def _summary_table(summary: Mapping[str, Mapping[str, Any]], title: str) -> MetricTable:
    cols = (Col("precision", "key"), Col("layers"), Col("ms/inference"), Col("time share"))
    rows: list[list[Cell]] = [[_p(precision), str(row.get("layers", 0)), _ms(row.get("time_ms")),
             _pct(row.get("time_share"))] for precision, row in summary.items()]
    return metric_table(title, cols, rows)


def _findings(console: Console, kind: str, items: Sequence[AuditFinding], top: int) -> None:
    total = sum(f.time_ms or 0.0 for f in items)
    timed = any(f.time_ms is not None for f in items)
    head = f"{TITLES.get(kind, kind)}: {len(items)}" + (f", {total:.3f} ms" if timed else "")
    cols = (Col("confidence", "tag"), Col("layer", "key"), Col("ONNX nodes", "text"),
            Col("evidence", "text"), Col("ms"))
    console.print(metric_table(head, cols, [
        [_p(f.confidence), Text(_short(f.layer, 60)), Text(_nodes(f.nodes)),
         Text(_short(f.evidence, 160)), _ms(f.time_ms)] for f in items[:top]]))
    if len(items) > top:
        console.print(Text(f"  … {len(items) - top} more (see --json)", style="dim"))
    shown = list(dict.fromkeys(f.remedy for f in items[:top]))
    limit = 1
    for remedy in shown[:limit]:
        console.print(Text(f"  fix: {remedy}"))
    if len(shown) > limit:
        console.print(Text("  (the same fix, with their own names, for the others)", style="dim"))


def _regions(console: Console, report: AuditReport) -> None:
    cols = (Col("region", "key"), Col("precision", "tag"), Col("ms"), Col("share"),
            Col("ONNX nodes", "text"), Col("sensitive ops", "text"))
    rows: list[list[Cell]] = []
    for r in report.regions:
        first = [n for n in r.first if not n.startswith("(Unnamed Layer")] or list(r.first)
        last = [n for n in r.last if not n.startswith("(Unnamed Layer")] or list(r.last)
        span = f"{_short(' + '.join(first), 50)} … {_short(' + '.join(last), 50)}" \
            if r.first else _short(r.name, 80)
        nodes = f"{len(r.onnx_nodes)} ({r.nodes_source})"
        sens = "; ".join(f"{s.op}: {_short(s.node, 50)}" for s in r.sensitive[:4]) or "-"
        if len(r.sensitive) > 4:
            sens += f" (+{len(r.sensitive) - 4})"
        rows.append([Text(span), _p(r.precision), _ms(r.time_ms), _pct(r.time_share),
                     Text(nodes), Text(sens)])
    console.print(metric_table(f"Fused Myelin regions: {len(report.regions)}", cols, rows))


def _checks(console: Console, report: AuditReport) -> None:
    cols = (Col("node", "key"), Col("from", "tag"), Col("ran in", "tag"), Col("status", "tag"),
            Col("confidence", "tag"), Col("layer", "text"))
    console.print(metric_table("Nodes wanted in FP32", cols, [
        [Text(_short(c.node, 70)), c.source, _p(c.ran_in), _p(c.status),
         _p(c.confidence) if c.status == "not-honored" else Text("-"), Text(_nodes(c.layers, 1))]
        for c in report.fp32_checks]))


def _layers(console: Console, report: AuditReport, max_layers: int | None) -> None:
    layers = list(report.layers)
    if max_layers is not None and len(layers) > max_layers:
        layers = sorted(layers, key=lambda x: -(x.time_ms or 0.0))[:max_layers]
        layers.sort(key=lambda x: x.index)
    cols = (Col("#", "tag"), Col("layer", "key"), Col("type", "name"), Col("precision", "tag"),
            Col("ms"), Col("share"), Col("ONNX nodes", "text"), Col("evidence", "text"))
    console.print(metric_table(f"Layers ({len(layers)} of {len(report.layers)})", cols, [
        [f"#{x.index}", Text(_short(x.name, 60)), Text(x.type), _p(layer_precision_label(x)),
         _ms(x.time_ms), _pct(x.time_share), Text(_nodes(x.onnx_nodes, 1)),
         Text(_short(x.evidence[0], 70) if x.evidence else "-")] for x in layers]))


def render_audit(report: AuditReport, console: Console, max_layers: int | None = None,
                 top_findings: int = 10) -> None:
    """Print an engine audit: summary, findings with fixes, regions, FP32 checks, layers.

    Args:
        report: From ``audit_engine``.
        console: A rich console.
        max_layers: Show at most this many layers (the slowest, in engine order); None: all.
        top_findings: Findings shown per kind (the slowest first).
    """
    console.print(Text(f"Engine audit: {report.source}", style="bold"))
    line = (f"TensorRT {report.trt_version_guess} ({report.trt_version_evidence}); "
            f"{len(report.layers)} layers")
    if report.total_time_ms is not None:
        line += f"; {report.total_time_ms:.3f} ms/inference summed over layers"
    console.print(Text(line))
    if report.onnx_source:
        console.print(Text(f"ONNX model: {report.onnx_source}"))
    if not report.detailed:
        console.print(Text("Layer names only: precision cannot be read. Rebuild with "
                           "--profilingVerbosity=detailed.", style="bold red"))
    console.print(_summary_table(report.precision_summary, "Precision summary"))
    by_kind: dict[str, list[AuditFinding]] = {}
    for f in report.findings:
        by_kind.setdefault(f.kind, []).append(f)
    for kind in sorted(by_kind, key=lambda k: KIND_ORDER.index(k) if k in KIND_ORDER else 99):
        _findings(console, kind, by_kind[kind], top_findings)
    if not report.findings:
        console.print(Text("No findings.", style="green"))
    if report.regions:
        _regions(console, report)
    if report.fp32_checks:
        _checks(console, report)
    _layers(console, report, max_layers)
    for w in report.warnings:
        console.print(Text(f"warning: {w}", style="yellow"))


def _pair_rows(pairs: Sequence[Any]) -> list[list[Cell]]:
    """Rows of ``_PAIR_COLUMNS`` for paired layers or regions of two builds (``a_layer``,
    ``b_layer``, ``a_precision``, ``b_precision``, ``a_time_ms``, ``b_time_ms``, ``match``)."""
    return [[Text(_short(x.a_layer or "-", 50)), Text(_short(x.b_layer or "-", 50)),
             Text.assemble(_p(x.a_precision), " → ", _p(x.b_precision)), _ms(x.a_time_ms),
             _ms(x.b_time_ms), x.match] for x in pairs]


def render_build_diff(diff: BuildDiff, console: Console, top: int = 20) -> None:
    """Print a comparison of two builds: precision/time per precision, fused regions, changes.

    Args:
        diff: From ``compare_builds``.
        console: A rich console.
        top: Precision changes listed (the slowest in B first).
    """
    console.print(Text(f"Build A: {diff.a_source}\nBuild B: {diff.b_source}", style="bold"))
    if diff.a_total_ms is not None and diff.b_total_ms is not None and diff.a_total_ms:
        ratio = diff.b_total_ms / diff.a_total_ms
        console.print(Text(f"Summed layer time: A {diff.a_total_ms:.3f} ms, B "
                           f"{diff.b_total_ms:.3f} ms (B/A = {ratio:.2f})"))
    cols = (Col("precision", "key"), Col("A layers"), Col("A ms"), Col("A share"),
            Col("B layers"), Col("B ms"), Col("B share"))
    rows: list[list[Cell]] = []
    for p in dict.fromkeys((*diff.a_summary, *diff.b_summary)):
        ra, rb = diff.a_summary.get(p, {}), diff.b_summary.get(p, {})
        rows.append([_p(p), str(ra.get("layers", 0)), _ms(ra.get("time_ms")),
                     _pct(ra.get("time_share")), str(rb.get("layers", 0)),
                     _ms(rb.get("time_ms")), _pct(rb.get("time_share"))])
    console.print(metric_table("Precision per build", cols, rows))
    if diff.regions:
        console.print(metric_table("Fused regions", _PAIR_COLUMNS, _pair_rows(diff.regions)))
    counts: dict[tuple[str | None, str | None], int] = {}
    for c in diff.precision_changes:
        counts[(c.a_precision, c.b_precision)] = counts.get((c.a_precision, c.b_precision), 0) + 1
    console.print(Text(f"Layers that changed precision: {len(diff.precision_changes)} ("
                       + ", ".join(f"{a} → {b}: {n}" for (a, b), n in counts.items()) + ")"))
    changes = sorted(diff.precision_changes, key=lambda c: -(c.b_time_ms or 0.0))[:top]
    if changes:
        console.print(metric_table(f"Slowest changed layers (top {len(changes)})",
                                   _PAIR_COLUMNS, _pair_rows(changes)))
    ra, rb = diff.reformat.get("a", {}), diff.reformat.get("b", {})
    console.print(Text(f"Precision-converting reformats: A {ra.get('layers', 0)} "
                       f"({_ms(ra.get('time_ms'))} ms), B {rb.get('layers', 0)} "
                       f"({_ms(rb.get('time_ms'))} ms)"))
    console.print(Text(f"Unpaired compute layers: {len(diff.only_in_a)} only in A, "
                       f"{len(diff.only_in_b)} only in B"))
    for note in diff.notes:
        console.print(Text(f"note: {note}", style="dim"))
