"""Terminal rendering of a build log's precision-relevant lines (``audit.buildlog``)."""

from __future__ import annotations

from typing import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from precision_doctor.audit.buildlog import FLAGGED, BuildLog

_LABEL = {True: "on", False: "off", None: "not stated"}


def render_build_log(log: BuildLog, console: Console, links: Sequence[dict] = (),
                     max_lines: int = 40) -> None:
    """Print the settings, the flagged lines, per-layer precisions and Myelin regions.

    Args:
        log: From ``read_build_log``.
        console: Where to print.
        links: ``link_to_audit`` rows (log warning -> engine layer and its precision).
        max_lines: Rows of the line table (flagged lines first).
    """
    console.print(f"[bold]Build log[/] {escape(log.source)} ({log.tool}): TensorRT "
                  f"{escape(log.tensorrt_version or 'version not in the log')}, GPU "
                  f"{escape(log.gpu or 'not in the log')}"
                  + (f" (compute capability {escape(log.compute_capability)})"
                     if log.compute_capability else ""))
    console.print(f"  builder flags: {escape(', '.join(log.flags) or 'not printed')}; FP16 "
                  f"{_LABEL[log.fp16]}, BF16 {_LABEL[log.bf16]}, INT8 {_LABEL[log.int8]}, "
                  f"TF32 {_LABEL[log.tf32]} ({escape(log.tf32_evidence)}), strongly typed "
                  f"{_LABEL[log.strongly_typed]}")
    rows = sorted(log.entries, key=lambda e: (e.kind not in FLAGGED, e.line))[:max_lines]
    if rows:
        t = Table(title=f"Precision-relevant lines ({len(log.entries)}, flagged first)",
                  title_justify="left")
        for col in ("line", "kind", "precision", "names / ONNX nodes", "text"):
            t.add_column(col, overflow="fold")
        for e in rows:
            shown = e.nodes or e.names
            names = ", ".join(shown[:4]) + (f" (+{len(shown) - 4})" if len(shown) > 4 else "")
            kind = f"[red]{e.kind}[/]" if e.kind in FLAGGED else e.kind
            t.add_row(str(e.line), kind, e.precision or "-", escape(names),
                      escape(e.text[:160]))
        console.print(t)
    counts: dict[str, int] = {}
    for precision in log.layer_precisions.values():
        counts[precision] = counts.get(precision, 0) + 1
    if counts:
        console.print("  engine layers by output precision: " + ", ".join(
            f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])))
    for row in links:
        console.print(f"  line {row['line']} ({row['kind']}): node {escape(row['node'])} ran in "
                      f"layer {escape(str(row['layer']))} as {row['precision'] or 'unknown'}")
