"""Terminal rendering of a diagnosis with rich: verdict first, then outputs, findings, layers."""

from __future__ import annotations

import math

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from precision_doctor.analysis.diagnosis import DiagnosisReport


def _g(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.{digits}g}"


def render_diagnosis(report: DiagnosisReport, console: Console, layers: int = 12) -> None:
    """Print ``report``.

    Args:
        report: The diagnosis.
        console: Where to print.
        layers: How many rows of the layerwise table to show (worst and around the first
            divergence); 0 hides it.
    """
    ok = report.passed
    title = (f"[bold {'green' if ok else 'red'}]{'PASS' if ok else 'FAIL'}[/] "
             f"{escape(report.model.get('path') or 'model')} in {report.target.upper()} "
             f"({escape(report.candidate)} vs {escape(report.reference)}, "
             f"{len(report.samples)} sample(s))")
    console.print(Panel(title, expand=False))

    t = Table(title="Outputs", title_justify="left")
    for col in ("output", "verdict", "rel L2", "max abs", "p99 abs", "cosine", "SNR dB",
                "NaN/Inf", "argmax", "x noise"):
        t.add_column(col, justify="right" if col not in ("output", "verdict") else "left")
    for o in report.outputs:
        m = o.metrics
        t.add_row(escape(o.name), "[green]pass[/]" if o.passed else "[red]fail[/]",
                  _g(m.rel_l2), _g(m.max_abs), _g(m.p99_abs), _g(m.cosine, 6), _g(m.snr_db),
                  f"{m.nan}/{m.inf}", _g(m.argmax_agreement, 4), _g(o.noise_multiple))
    console.print(t)
    for o in report.outputs:
        console.print(f"  {escape(o.name)}: {escape(o.reason)}")

    if report.findings:
        ft = Table(title="Findings (ranked by measured impact)", title_justify="left")
        for col in ("#", "kind", "node", "impact", "evidence", "remedy"):
            ft.add_column(col, overflow="fold")
        for i, f in enumerate(report.findings, 1):
            color = {"error": "red", "warning": "yellow"}.get(f.severity, "white")
            impact = "-" if f.impact is None else f"{f.impact:.0%}"
            ft.add_row(str(i), f"[{color}]{f.kind}[/]", escape(f.node), impact,
                       escape(f.summary), escape(f.remedy))
        console.print(ft)
    else:
        console.print("No findings.")

    lw = report.layerwise
    if lw is not None and layers:
        unit = "segment" if lw.mode == "segments" else "marked-output chunk"
        console.print(f"Layerwise: {len(lw.records)} tensors in {lw.chunks} {unit}(s); first "
                      f"divergence (rel L2 > {lw.threshold:g}): "
                      f"[bold]{escape(lw.first_divergence or 'none')}[/]; NaN/Inf born at: "
                      f"[bold]{escape(lw.nan_birth or 'nowhere')}[/]")
        if lw.fallback_reason:
            console.print(f"  (each chunk re-ran the whole model: {escape(lw.fallback_reason)})")
        idx = {r.tensor: i for i, r in enumerate(lw.records)}
        start = max(0, idx.get(lw.first_divergence, len(lw.records)) - layers // 2)
        rows = lw.records[start:start + layers] if lw.first_divergence else sorted(
            lw.records, key=lambda r: -r.rel_l2 if math.isfinite(r.rel_l2) else -1e300)[:layers]
        lt = Table(title="Layerwise (around the first divergence)" if lw.first_divergence
                   else "Layerwise (largest errors)", title_justify="left")
        for col in ("#", "tensor", "op", "rel L2", "ref max|x|", "headroom bits", "overflow",
                    "flush", "NaN/Inf"):
            lt.add_column(col, overflow="fold")
        for r in rows:
            style = "red" if r.tensor == lw.first_divergence else None
            lt.add_row(str(r.index), escape(r.tensor), r.op_type, _g(r.rel_l2),
                       _g(r.ref_max_abs), _g(r.headroom_bits), str(r.overflow),
                       str(r.flush_to_zero), f"{r.cand_nan}/{r.cand_inf}", style=style)
        console.print(lt)
    hazards = [h for h in report.hazards if h.severity != "low"]
    if hazards:
        console.print(f"Static hazards ({len(hazards)} medium/high of {len(report.hazards)}):")
        for h in hazards[:10]:
            console.print(f"  - [{h.severity}] {escape(h.detail)}")
    if report.noise is not None:
        floor = ", ".join(f"{escape(k)}={_g(v)}" for k, v in report.noise.per_output.items())
        probes = ", ".join(report.noise.probes) or "none"
        console.print(f"FP32 noise floor (rel L2): {floor} (probes: {probes})")
    for w in report.warnings:
        console.print(f"[yellow]warning:[/] {escape(w)}")
