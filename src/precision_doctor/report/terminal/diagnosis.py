"""Terminal rendering of a diagnosis with rich: verdict first, then outputs, findings, layers.

Every number goes through ``numbers.fmt3`` (3 significant digits, the same strings as the HTML
report) and every table through ``tables.metric_table``, which turns into key: value blocks
when the console is too narrow: at 80 columns no number or header is ever cut with ``…``.
"""

from __future__ import annotations

import math

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from precision_doctor.diagnosis.report import DiagnosisReport, OutputResult
from precision_doctor.layerwise.compare import LayerRecord, LayerwiseResult
from precision_doctor.numbers import fmt3, fmt_count, fmt_share
from precision_doctor.report.evidence import tightest
from precision_doctor.report.terminal.assessment import render_assessment, render_flip_lines
from precision_doctor.report.terminal.findings import (
    NAME_LIMIT,
    render_findings,
    render_hazards,
    short_name,
)
from precision_doctor.report.terminal.sources import autocast_lines, code_line
from precision_doctor.report.terminal.tables import Cell, Col, MetricTable, metric_table

OUTPUT_COLUMNS = (Col("output", "key"), Col("verdict", "tag"), Col("rel L2"), Col("max abs"),
                  Col("p99 abs"), Col("1-cos"), Col("SNR dB"), Col("NaN/Inf"),
                  Col("argmax", label="argmax agree"), Col("x noise"))
OUTPUT_CAPTION = ("rel L2 = |c - r| / |r|; 1-cos = 1 - cosine similarity; argmax = share of "
                  "positions with the same argmax; x noise = rel L2 / FP32 noise floor")
NOT_COMPUTED = "n/a"  # a statistic of an output with NaN/Inf
SHAPE_CHANGED = "shape"  # the rel L2 of an output whose shape changed (not reproduced)
OP_LIMIT = 16  # characters of an op type in the layerwise table (longer: cut with "~")
LAYER_COLUMNS = (Col("#", "tag"), Col("tensor", "key"), Col("op", "name"), Col("rel L2"),
                 Col("max|x|", label="ref max|x|"), Col("bits", label="headroom bits"),
                 Col("ovf", label="overflow"), Col("ftz", label="flush"), Col("NaN/Inf"))
LAYER_CAPTION = ("max|x| = largest FP32 magnitude; bits = headroom to the format's max (log2); "
                 "ovf / ftz = elements that overflow / flush to zero")


def verdict_tag(passed: bool) -> Text:
    """``pass`` in green or ``fail`` in red."""
    return Text("pass", style="green") if passed else Text("fail", style="red")


def outputs_table(outputs: tuple[OutputResult, ...] | list[OutputResult],
                  title: str | None = "Outputs") -> MetricTable:
    """Per-output metrics (``OutputResult``) as a width-adaptive table."""
    rows: list[list[Cell]] = []
    for o in outputs:
        m = o.metrics
        one_minus_cos = None if m.cosine is None else 1.0 - m.cosine
        stats = [fmt3(m.max_abs), fmt3(m.p99_abs), fmt3(one_minus_cos), fmt3(m.snr_db)]
        if m.nan or m.inf or (m.shape_changed and not m.numel):
            # computed without the NaN/Inf (or without any sample), they would look finite
            stats = [NOT_COMPUTED] * len(stats)
        elif m.shape_changed:  # over the samples that kept their shape; SNR follows rel L2
            stats[-1] = NOT_COMPUTED
        rel: Cell = Text(SHAPE_CHANGED, style="red") if m.shape_changed else fmt3(m.rel_l2)
        rows.append([o.name, verdict_tag(o.passed), rel, *stats,
                     Text(f"{m.nan}/{m.inf}", style="red") if m.nan or m.inf
                     else f"{m.nan}/{m.inf}", fmt3(m.argmax_agreement),
                     fmt3(o.noise_multiple)])
    nonfinite = any(o.metrics.nan or o.metrics.inf for o in outputs)
    reshaped = any(o.metrics.shape_changed for o in outputs)
    return metric_table(title, OUTPUT_COLUMNS, rows, caption=OUTPUT_CAPTION + (
        f"; {NOT_COMPUTED} = not computed: the output has NaN/Inf" if nonfinite else "") + (
        f"; {SHAPE_CHANGED} = another shape than the reference's on some sample: the "
        "statistics cover the others (the length report says which)" if reshaped else ""))


def layer_rows(lw: LayerwiseResult, layers: int) -> list[LayerRecord]:
    """The rows to show: around the first divergence, else the largest errors."""
    if lw.first_divergence:
        idx = {r.tensor: i for i, r in enumerate(lw.records)}
        start = max(0, idx.get(lw.first_divergence, len(lw.records)) - layers // 2)
        return list(lw.records[start:start + layers])
    return sorted(lw.records,
                  key=lambda r: -r.rel_l2 if math.isfinite(r.rel_l2) else -1e300)[:layers]


def layers_table(lw: LayerwiseResult, layers: int, width: int | None = None) -> MetricTable:
    """The layerwise rows (see ``layer_rows``), the first divergence in red.

    Args:
        lw: The layerwise comparison.
        layers: Rows to show.
        width: The console's width in characters: the count columns (ovf, ftz, NaN/Inf) that
            are 0 in every row shown are left out (the caption says so) and tensor names are
            shortened (``short_name``, to no fewer than ``NAME_LIMIT / 2`` characters) so that
            the table keeps one line per row there; None: every column, names of at most
            ``NAME_LIMIT``.
    """
    rows = layer_rows(lw, layers)
    cells = [[f"#{r.index}", r.tensor, _op(r.op_type), fmt3(r.rel_l2), fmt3(r.ref_max_abs),
              fmt3(r.headroom_bits), fmt_count(r.overflow), fmt_count(r.flush_to_zero),
              f"{r.cand_nan}/{r.cand_inf}"] for r in rows]
    columns, caption, limit = list(LAYER_COLUMNS), LAYER_CAPTION, NAME_LIMIT
    if width is not None:
        zero = [i for i in (6, 7, 8) if all(str(c[i]) in ("0", "0/0") for c in cells)]
        if zero:
            names = ", ".join(LAYER_COLUMNS[i].header for i in zero)
            caption += f"; {names}: 0 in every row shown (left out)"
            columns = [c for i, c in enumerate(LAYER_COLUMNS) if i not in zero]
            cells = [[v for i, v in enumerate(c) if i not in zero] for c in cells]
        probe = metric_table(None, columns, [[*c[:1], "", *c[2:]] for c in cells])
        limit = max(NAME_LIMIT // 2,
                    min(NAME_LIMIT, width - probe.table_min_width() + len("tensor")))
    for c in cells:
        c[1] = short_name(str(c[1]), limit)
    styles = ["red" if r.tensor == lw.first_divergence else None for r in rows]
    title = ("Layerwise (around the first divergence)" if lw.first_divergence
             else "Layerwise (largest errors)")
    return metric_table(title, columns, cells, caption=caption, row_styles=styles)


def _op(op_type: str) -> str:
    """An op type of at most ``OP_LIMIT`` characters (``InstanceNormali~``)."""
    return op_type if len(op_type) <= OP_LIMIT else op_type[:OP_LIMIT - 1] + "~"


def render_diagnosis(report: DiagnosisReport, console: Console, layers: int = 12) -> None:
    """Print ``report``, the answer first.

    A passing report is short (``render_pass``: the verdict, the assessment in one sentence,
    the outputs, the headroom, where to look next); a failing one adds the assessment's
    evidence, the findings (repeated ones grouped), the layerwise rows and the hazards.

    Args:
        report: The diagnosis.
        console: Where to print (its width decides tables vs lists).
        layers: How many rows of the layerwise table to show (worst and around the first
            divergence); 0 hides it.
    """
    ok = report.passed
    title = (f"[bold {'green' if ok else 'red'}]{'PASS' if ok else 'FAIL'}[/] "
             f"{escape(report.model.get('path') or 'model')} in {report.target.upper()} "
             f"({escape(report.candidate)} vs {escape(report.reference)}, "
             f"{len(report.samples)} sample(s))")
    console.print(Panel(title, expand=False, box=box.ASCII))  # ASCII: 80 bytes are 80 columns
    if report.model.get("reference"):  # shipped in FP16/BF16: graph.upcast.Upcast.statement
        console.print(Text(report.model["reference"], style="bold yellow"))
    render_assessment(report, console)

    console.print(outputs_table(report.outputs))
    reasons = {o.reason for o in report.outputs}
    if ok and len(report.outputs) > 1 and len(reasons) == 1:
        console.print(Text(f"  every output: {reasons.pop()}"))
    else:
        for o in report.outputs:
            console.print(Text(f"  {o.name}: {o.reason}"))
    if report.recording:
        _render_recording(report.recording, console)
    if ok:
        render_pass(report, console)
    else:
        _render_failure(report, console, layers)
    for w in report.warnings:
        console.print(Text.assemble(("warning:", "yellow"), f" {w}"))


def render_pass(report: DiagnosisReport, console: Console) -> None:
    """The rest of a passing report: decisions in one line each, the headroom, findings and
    hazards in one line each, and where to look next."""
    for d in report.decisions:
        task = (f", {d.task_metric} agreement {fmt_share(d.task_agreement, 1)}"
                if d.task_agreement is not None else "")
        console.print(Text(f"Decisions of {d.output} ({d.kind}): {d.flips} of {d.positions} "
                           f"flipped{task}"))
    render_flip_lines(report, console)
    line = headroom_line(report)
    if line:
        console.print(Text(line))
    render_findings(report, console)
    render_hazards(report, console)
    if report.noise is not None:
        _render_noise(report, console)
    console.print(Text(next_steps(report), style="dim"))


def headroom_line(report: DiagnosisReport) -> str | None:
    """The tightest tensor that fits the format and its bits to the format's max
    (``report.evidence.tightest``), or None without a layerwise comparison."""
    lw = report.layerwise
    t = tightest(lw)
    if lw is None or t is None:
        return None
    return (f"Headroom: the tightest of {len(lw.records)} tensors is {short_name(t.tensor)} "
            f"({t.op_type}), max |x| {fmt3(t.ref_max_abs)}, {fmt3(t.headroom_bits)} bits "
            f"below the {report.target.upper()} max (a {fmt3(2.0 ** t.headroom_bits)}x larger "
            "input would overflow it)")


def next_steps(report: DiagnosisReport) -> str:
    """Where to look next: the HTML and JSON reports, and ``fix`` (with a task metric)."""
    metric = next((d.suggested_metric for d in report.decisions if d.suggested_metric), None)
    steps = ["--html report.html for every tensor and hazard", "--json for the numbers"]
    if report.passed and metric:
        steps.append(f"`precision-doctor fix --metric {metric}` to go further than the "
                     "default tolerance")
    elif not report.passed:
        steps.append("`precision-doctor fix` writes the cured model"
                     + (f" (with --metric {metric})" if metric else ""))
    return "Next: " + "; ".join(steps) + "."


def _render_failure(report: DiagnosisReport, console: Console, layers: int) -> None:
    render_findings(report, console)
    lw = report.layerwise
    if lw is not None and layers:
        unit = "segment" if lw.mode == "segments" else "marked-output chunk"
        console.print(Text.assemble(
            f"Layerwise: {len(lw.records)} tensors in {lw.chunks} {unit}(s); first divergence "
            f"(rel L2 > {fmt3(lw.threshold)}): ", (lw.first_divergence or "none", "bold"),
            "; NaN/Inf born at: ", (lw.nan_birth or "nowhere", "bold")))
        if lw.fallback_reason:
            console.print(Text(f"  (each chunk re-ran the whole model: {lw.fallback_reason})"))
        console.print(layers_table(lw, layers, console.width))
        first = lw.record(lw.first_divergence) if lw.first_divergence else None
        line = code_line(report, first.node if first else None, "first divergence",
                         console.width)
        if line:
            console.print(Text(line, style="cyan"))
    render_hazards(report, console)
    if report.noise is not None:
        _render_noise(report, console)
    console.print(Text(next_steps(report), style="dim"))


def _render_noise(report: DiagnosisReport, console: Console) -> None:
    assert report.noise is not None
    floor = ", ".join(f"{k}={fmt3(v)}" for k, v in report.noise.per_output.items())
    probes = ", ".join(report.noise.probes) or "none"
    console.print(Text(f"FP32 noise floor (rel L2): {floor} (probes: {probes})"))


def _render_recording(rec: dict, console: Console) -> None:
    """The recorded candidate: the plain statement, the cross-check per output, the gaps."""
    console.print(f"[bold]Recording:[/] {escape(rec['statement'])}")
    cc = rec.get("cross_check")
    if cc:
        for o in cc["outputs"]:
            console.print(f"  {escape(o['name'])}: recorded rel L2 "
                          f"{fmt3(_f(o['recorded_rel_l2']))} vs emulated "
                          f"({escape(cc['emulator'])}) "
                          f"{fmt3(_f(o['emulated_rel_l2']))}")
        worse = cc.get("worse_than_emulated") or []
        if worse:
            console.print(f"  {len(worse)} tensor(s) > 4x worse than the emulation, first "
                          f"[bold]{escape(worse[0])}[/]: not what the plan computes there "
                          "(a fused region in lower precision, or weights changed)")
    for line in autocast_lines(rec.get("autocast")):
        console.print(line, markup=False)
    if rec.get("missing"):
        kinds = ", ".join(f"{c} {escape(k)}" for k, c in rec["missing_by_reason"].items())
        console.print(f"  {len(rec['missing'])} ONNX tensor(s) not in the recording ({kinds})")


def _f(x: object) -> float | None:
    return None if x is None else float(x)  # type: ignore[arg-type]
