"""HTML for notebooks and for results that have no page of their own.

``iframe`` wraps a self-contained report page so that its styles and script stay inside it when
Jupyter shows it inline (``_repr_html_``); ``console_page`` records a rich terminal rendering
(audit, preprocessing forensics) as a self-contained page; ``fix_summary`` is the short table of a
fix result. Every model-derived string is escaped.
"""

from __future__ import annotations

import html
import io
from typing import Any, Callable, Mapping

from rich.console import Console

from precision_doctor.numbers import fmt3, fmt_share


def iframe(page: str, height_px: int = 640) -> str:
    """``page`` in an ``<iframe srcdoc>`` (escaped), for inline display in a notebook."""
    return (f'<iframe srcdoc="{html.escape(page, quote=True)}" style="width:100%;'
            f'height:{int(height_px)}px;border:1px solid #ccc" sandbox="allow-scripts">'
            "</iframe>")


def console_page(render: Callable[[Console], None], title: str, width: int = 120) -> str:
    """A self-contained HTML page of what ``render(console)`` prints (rich escapes the text).

    Args:
        render: Prints to the console it is given (e.g. ``lambda c: render_audit(r, c)``).
        title: Page title (escaped).
        width: Console width in characters.
    """
    console = Console(record=True, width=width, file=io.StringIO(), force_terminal=False,
                      color_system="truecolor")
    render(console)
    body = console.export_html(inline_styles=True, code_format="<pre style=\"font-family:"
                               "Menlo,Consolas,monospace;font-size:13px\">{code}</pre>")
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}"
            f"</title></head><body>{body}</body></html>")


def fix_summary(report: Mapping[str, Any]) -> str:
    """A compact HTML table of a fix report (``Fix.to_dict()``): verdict, objective, errors
    before and after per output, FP32 share and the nodes kept in FP32."""
    e = html.escape
    verdict = str(report.get("verdict", "?")).upper()
    color = "#1a7f37" if verdict == "PASS" else "#cf222e"
    rows = []
    before, after = report.get("before", {}), report.get("after", {})
    for name in before:
        rows.append(f"<tr><td>{e(str(name))}</td><td>{_num(before[name].get('rel_l2'))}</td>"
                    f"<td>{_num(after.get(name, {}).get('rel_l2'))}</td></tr>")
    share = report.get("fp32_share", {})
    plan = report.get("plan", {}).get("overrides", {})
    nodes = "".join(f"<li>{e(str(n))}: {e(str(d.get('reason', '')))} "
                    f"{e(str(d.get('detail', '')))}</li>" for n, d in plan.items())
    return (f"<div><b style=\"color:{color}\">{verdict}</b> {e(str(report.get('target', '')))} "
            f"target: {e(str(report.get('objective', '')))}<table><tr><th>output</th>"
            "<th>rel. L2 naive</th><th>rel. L2 fixed (ORT CPU)</th></tr>" + "".join(rows)
            + f"</table><p>FP32: {share.get('fp32_nodes', '?')} of "
            f"{share.get('compute_nodes', '?')} compute nodes, {_pct(share.get('flops'))} of "
            f"FLOPs</p><ul>{nodes}</ul></div>")


def _num(value: Any) -> str:
    return fmt3(value) if isinstance(value, (int, float)) else html.escape(str(value))


def _pct(value: Any) -> str:
    return fmt_share(float(value), 1) if isinstance(value, (int, float)) else "?"
