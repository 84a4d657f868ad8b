"""Terminal rendering (rich) of a ``ForensicsResult``.

File names and summaries go through ``Text`` so that brackets in them are never read as rich
markup. Numbers use ``numbers.fmt3`` (3 significant digits, as in every report) and tables
``tables.metric_table`` (key: value blocks when the console is narrow: nothing is cut).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.text import Text

from precision_doctor.forensics.analyze import EXPLAINED_REL_STD
from precision_doctor.forensics.result import ForensicsResult, InputFinding
from precision_doctor.numbers import fmt3
from precision_doctor.report.terminal.tables import Cell, Col, MetricTable, metric_table

KIND_COLORS = {"layout": "red", "channel-order": "red", "scale": "red", "normalization": "red",
               "resize": "yellow", "padding": "yellow", "crop-offset": "yellow",
               "interpolation": "yellow", "dtype": "cyan", "unexplained": "magenta"}
_EVIDENCE_KEYS = ("permutation", "shift_px", "window_offset", "a_size", "b_size",
                  "gradient_energy_ratio_b_over_a", "duplicate_excess_b", "rel_std_best",
                  "rel_std_identity", "a_dtype", "b_dtype", "inferred", "residual_rel_std")


def _num(value: Any) -> str:
    if isinstance(value, float):
        return fmt3(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_num(v) for v in value) + "]"
    return str(value)


def _evidence(finding: InputFinding) -> str:
    ev = finding.evidence
    parts = [f"{k}={_num(ev[k])}" for k in _EVIDENCE_KEYS if k in ev]
    for side in ("a", "b"):
        rec = ev.get(side)
        if isinstance(rec, Mapping) and rec.get("normalization"):
            parts.append(f"{side}={rec['normalization']}")
    return ", ".join(parts[:4])


def _pct(value: Any) -> str:
    if value is None:
        return "-"
    v = float(value)
    return "inf" if math.isinf(v) else f"{v:.2%}"


def _transform_lines(result: ForensicsResult) -> list[Text]:
    t = result.transform
    lines = []
    layout = t.get("layout")
    if isinstance(layout, Mapping) and layout.get("a") != layout.get("b"):
        lines.append(Text(f"layout: A {layout.get('a')} -> B {layout.get('b')}"))
    for key in ("reinterpreted", "resampled"):
        if t.get(key):
            lines.append(Text(str(t[key])))
    if t.get("shift_px"):
        lines.append(Text(f"shift: B[y, x] = A[y + {t['shift_px'][0]}, x + {t['shift_px'][1]}]"))
    perm, scale, offset = t.get("channel_permutation"), t.get("scale"), t.get("offset")
    if perm is not None and scale is not None and offset is not None:
        terms = ", ".join(f"B{c} = {_num(float(s))}*A{p} {float(o):+.4g}"
                          for c, (p, s, o) in enumerate(zip(perm, scale, offset)))
        lines.append(Text(f"values: {terms}"))
    norm = t.get("normalization")
    if isinstance(norm, Mapping):
        lines.append(Text(f"recognized normalization: A {norm.get('a') or 'unknown'}, "
                          f"B {norm.get('b') or 'unknown'}"))
    if isinstance(t.get("nonfinite"), Mapping):
        counts = t["nonfinite"]
        lines.append(Text(f"NaN/Inf values (compared as 0): A {counts.get('a', 0)}, "
                          f"B {counts.get('b', 0)}", style="red"))
    if t.get("channel_order_observable") is False:
        lines.append(Text("A is (nearly) gray: its channel order cannot be seen in the data",
                          style="yellow"))
    return lines


def _effect_table(effect: Mapping[str, Any]) -> MetricTable:
    target = str(effect.get("target", "fp16")).upper()
    cols = (Col("output", "key"), Col("B vs A", label="B vs A rel L2"),
            Col(f"{target} on A", label=f"{target} on A rel L2"),
            Col("argmax B", label="argmax agree B"),
            Col(f"argmax {target}", label=f"argmax agree {target}"))
    rows: list[list[Cell]] = []
    for name, stats in dict(effect.get("outputs", {})).items():
        pre, prec = stats.get("preprocessing") or {}, stats.get("precision") or {}
        rows.append([Text(name), _rel(pre.get("rel_l2")), _rel(prec.get("rel_l2")),
                     _rel(pre.get("argmax_agreement")), _rel(prec.get("argmax_agreement"))])
    rows.append([Text("all outputs", style="bold"), _rel(effect.get("preprocessing_rel_l2")),
                 _rel(effect.get("precision_rel_l2")), "", ""])
    caption = (f"rel L2 of the outputs: B vs A = what the preprocessing difference moves, "
               f"{target} on A = what {target} moves; argmax = share of positions with the "
               "same argmax")
    return metric_table(f"Output effect ({effect.get('model', 'model')})", cols, rows,
                        caption=caption)


def _rel(value: Any) -> str:
    return fmt3(None if value is None else float(value))


def render_forensics(result: ForensicsResult, console: Console) -> None:
    """Print the findings, the estimated transform, the residual and the output effect.

    Args:
        result: From ``compare_inputs`` / ``analyze_tensors`` (or ``ForensicsResult.from_dict``).
        console: Where to print.
    """
    console.print(Text("Preprocessing forensics", style="bold"))
    console.print(Text("A: ", style="bold") + Text(result.a_desc))
    console.print(Text("B: ", style="bold") + Text(result.b_desc))
    if not result.findings:
        console.print(Text("No difference found: A and B are the same input.", style="green"))
    else:
        cols = (Col("#", "tag"), Col("kind", "tag"), Col("confidence", "tag"),
                Col("finding", "text"), Col("evidence", "text"))
        console.print(metric_table("Findings (most important first)", cols, [
            [f"#{i}", Text(f.kind, style=KIND_COLORS.get(f.kind, "")), f"{f.confidence:.0%}",
             Text(f.summary), Text(_evidence(f), style="dim")]
            for i, f in enumerate(result.findings, 1)]))
    for line in _transform_lines(result):
        console.print(Text("  ") + line)
    rel_std = result.transform.get("residual_rel_std")
    before = result.transform.get("difference_rel_l2")
    head = f"difference before explanation: rel L2 {_rel(before)}; " if before is not None else ""
    complete = rel_std is not None and float(rel_std) <= EXPLAINED_REL_STD
    verdict = Text("explained" if complete else "not fully explained",
                   style="green" if complete else "yellow")
    console.print(Text(f"{head}residual after the estimated transform: rel L2 "
                       f"{_rel(result.residual_rel_l2)}, {_pct(rel_std)} of B's spread: ")
                  + verdict)
    effect = result.output_effect
    if effect:
        if effect.get("outputs"):
            console.print(_effect_table(effect))
        style = "bold" if effect.get("preprocessing_rel_l2") is not None else "bold yellow"
        console.print(Text(str(effect.get("summary", "")), style=style))
