"""Inline SVG plots of a layerwise comparison, drawn with matplotlib.

Two plots, both against the topological index of the producing node (x axis):

* ``error_vs_depth_svg``: relative L2 error of every compared tensor (log scale), with the
  divergence threshold, the FP32 noise floor of the outputs, the first divergence and the
  NaN/Inf birth marked.
* ``range_svg``: each tensor's largest reference |x| (log scale) against the format limits
  (max finite value, smallest normal and subnormal; ``precision_doctor.formats``), i.e. the
  headroom left before overflow.

No model-derived string (node or tensor name) is ever drawn: points are labelled by their
index only, and the HTML around the plot names the tensors (escaped by the template engine).
matplotlib escapes the text it writes into SVG in any case (``backend_svg._escape_cdata``).
Output is deterministic: no date metadata, a fixed ``svg.hashsalt`` for element ids.
"""

from __future__ import annotations

import importlib.util
import io
import math
import re
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from precision_doctor.formats import FORMATS, Precision
from precision_doctor.layerwise.compare import LayerRecord, LayerwiseResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

RC: dict[str, Any] = {"svg.fonttype": "none", "svg.hashsalt": "precision-doctor", "font.size": 9,
      "font.family": "sans-serif", "axes.spines.top": False, "axes.spines.right": False,
      "axes.grid": True, "grid.alpha": 0.25, "axes.titlesize": 10, "legend.fontsize": 8,
      "legend.framealpha": 0.9}
BLUE, RED, ORANGE, GREEN, GREY, PURPLE = ("#2563eb", "#dc2626", "#ea580c", "#16a34a",
                                          "#6b7280", "#7c3aed")
FIGSIZE = (10.0, 3.8)  # inches; the page scales the SVG to its column width
LOW_HEADROOM_BITS = 2.0  # same threshold as diagnosis.causes.findings (a 4x larger input overflows)
RASTER_POINTS = 2000  # larger scatters are embedded as a PNG inside the SVG (keeps it small)


def available() -> bool:
    """Whether matplotlib is installed (the report omits its plots otherwise).

    matplotlib is imported lazily, on the first plot, to keep the CLI's start-up fast.
    """
    return importlib.util.find_spec("matplotlib") is not None


def to_svg(fig: Figure, prefix: str) -> str:
    """Serialize ``fig`` as an SVG element to inline into HTML.

    The XML declaration and DOCTYPE are dropped, the fixed width/height become ``width=100%``
    (the viewBox keeps the aspect ratio), and every element id is prefixed with ``prefix`` so
    that several plots can share one HTML document.

    Args:
        fig: A matplotlib figure.
        prefix: Id prefix, ``[a-z0-9-]`` only.

    Returns:
        The ``<svg ...>...</svg>`` text.
    """
    buf = io.StringIO()
    with _style():
        fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight", dpi=150)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r'(<svg[^>]*?) width="[^"]*" height="[^"]*"', r'\1 width="100%"', svg, count=1)
    svg = re.sub(r'\bid="', f'id="{prefix}-', svg)
    svg = re.sub(r"url\(#", f"url(#{prefix}-", svg)
    return re.sub(r'href="#', f'href="#{prefix}-', svg)


def _style() -> AbstractContextManager[None]:
    """matplotlib's rcParams of these plots, for the duration of a ``with`` block."""
    import matplotlib

    return matplotlib.rc_context(RC)  # type: ignore[arg-type]  # keys are checked at runtime


def _figure() -> tuple[Figure, Axes]:
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogFormatter, MaxNLocator

    with _style():
        fig = Figure(figsize=FIGSIZE, layout="constrained")
        ax = fig.add_subplot()
        ax.set_yscale("log")
        # plain-text tick labels ("1e-5", "0.01", "100"): the default scientific labels are
        # mathtext, whose parsing made a fresh process's plots of PP-OCRv4 rec's 403 tensors
        # take 0.43 / 0.61 s instead of 0.24 / 0.23 s (benchmarks/probes/plots_speed.py,
        # 2026-11-28)
        ax.yaxis.set_major_formatter(FuncFormatter(_decade))
        # minor ticks labelled where matplotlib's default would (narrow ranges), in plain text
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("topological index of the producing node")
    return fig, ax


def _decade(value: float, _position: int) -> str:
    """Label of a log axis' major tick (a power of ten): ``0.001`` to ``1000`` written out,
    ``1e-5`` and ``1e6`` beyond; any other value as ``%g``."""
    if value <= 0 or not math.isfinite(value):
        return ""
    k = round(math.log10(value))
    return f"1e{k}" if abs(k) > 3 and math.isclose(value, 10.0 ** k) else f"{value:g}"


def _finite_positive(values: Sequence[float]) -> list[float]:
    return [v for v in values if v > 0 and math.isfinite(v)]


def error_vs_depth_svg(layerwise: LayerwiseResult, noise_floor: float | None = None) -> str | None:
    """Relative L2 error per tensor against topological index (log y).

    Tensors with zero error are drawn at the bottom edge, tensors with NaN/Inf (infinite
    relative error) at the top edge as red crosses.

    Args:
        layerwise: The layerwise comparison (records in topological order).
        noise_floor: FP32 noise floor of the outputs (relative L2), drawn as a horizontal line.

    Returns:
        SVG text, or None when matplotlib is missing or there are no records.
    """
    recs = layerwise.records
    if not available() or not recs:
        return None
    positive = _finite_positive([r.rel_l2 for r in recs])
    lo = min(positive + [layerwise.threshold, noise_floor or math.inf]) / 3 if positive else 1e-8
    hi = max(positive + [layerwise.threshold]) * 3  # NaN/Inf points are drawn at ``hi``
    fig, ax = _figure()
    with _style():
        ax.set_ylim(lo, hi * 2.5)
        xs = [r.index for r in recs]
        ys = [min(max(r.rel_l2, lo), hi) if not math.isnan(r.rel_l2) else hi for r in recs]
        ax.plot(xs, ys, color=BLUE, linewidth=0.8, alpha=0.5, zorder=2)
        ok = [(x, y) for x, y, r in zip(xs, ys, recs, strict=True)
              if math.isfinite(r.rel_l2) and r.rel_l2 <= layerwise.threshold]
        bad = [(x, y) for x, y, r in zip(xs, ys, recs, strict=True)
               if math.isfinite(r.rel_l2) and r.rel_l2 > layerwise.threshold]
        inf = [(x, hi) for x, r in zip(xs, recs, strict=True) if not math.isfinite(r.rel_l2)]
        _scatter(ax, ok, BLUE, "o", "candidate error (rel. L2)")
        _scatter(ax, bad, ORANGE, "o", "above threshold")
        _scatter(ax, inf, RED, "x", "NaN/Inf in candidate", size=30)
        ax.axhline(layerwise.threshold, color=GREY, linestyle="--", linewidth=1,
                   label=f"divergence threshold {layerwise.threshold:.3g}")
        if noise_floor and noise_floor > 0:
            ax.axhline(noise_floor, color=GREEN, linestyle=":", linewidth=1.4,
                       label=f"FP32 noise floor (outputs) {noise_floor:.2g}")
        _mark(ax, layerwise, layerwise.first_divergence, ORANGE, "first divergence")
        _mark(ax, layerwise, layerwise.nan_birth, RED, "NaN/Inf birth")
        ax.set_ylabel("relative L2 error vs FP32")
        fig.legend(loc="outside upper center", ncols=4, frameon=False)
    return to_svg(fig, "err")


def range_svg(layerwise: LayerwiseResult) -> str | None:
    """Largest reference |x| per tensor against the format limits (log y).

    Red points overflow the target format, orange ones have less than ``LOW_HEADROOM_BITS``
    bits of headroom; purple triangles on the smallest-subnormal line mark tensors with
    non-zero values that flush to zero. FP16 and BF16 max lines are drawn when they fall in
    the plotted range (otherwise the legend says where they are).

    Returns:
        SVG text, or None when matplotlib is missing or no tensor has a positive range.
    """
    recs = [r for r in layerwise.records if r.ref_max_abs > 0 and math.isfinite(r.ref_max_abs)]
    if not available() or not recs:
        return None
    target = FORMATS[Precision.parse(layerwise.target)]
    fmt_max = target.max if target.name in ("fp16", "bf16") else FORMATS[Precision.FP16].max
    values = [r.ref_max_abs for r in recs]
    lo = min(values + [target.min_subnormal]) / 10
    hi = max(values + [fmt_max]) * 30
    fig, ax = _figure()
    with _style():
        ax.set_ylim(lo, hi)
        groups: dict[str, list[tuple[int, float]]] = {"ok": [], "low": [], "over": []}
        for r in recs:
            key = ("over" if r.overflow or r.headroom_bits < 0 else
                   "low" if r.headroom_bits < LOW_HEADROOM_BITS else "ok")
            groups[key].append((r.index, r.ref_max_abs))
        _scatter(ax, groups["ok"], BLUE, "o", "reference max |x| per tensor")
        _scatter(ax, groups["low"], ORANGE, "o", f"< {LOW_HEADROOM_BITS:g} bits of headroom")
        _scatter(ax, groups["over"], RED, "o", f"overflows {target.name.upper()}")
        flushed = [(r.index, target.min_subnormal) for r in layerwise.records if r.flush_to_zero]
        _scatter(ax, flushed, PURPLE, "v", "has values flushed to zero", size=22)
        _limit_lines(ax, lo, hi, target.name)
        ax.set_ylabel("max |x| (FP32 reference)")
        fig.legend(loc="outside upper center", ncols=4, frameon=False)
    return to_svg(fig, "rng")


def _limit_lines(ax: Axes, lo: float, hi: float, target: str) -> None:
    fp16, bf16 = FORMATS[Precision.FP16], FORMATS[Precision.BF16]
    tgt = FORMATS[Precision.parse(target)]
    small = tgt if tgt.name in ("fp16", "bf16") else fp16
    name = small.name.upper()
    lines = [(fp16.max, RED, "-", f"FP16 max {fp16.max:.0f}"),
             (bf16.max, PURPLE, "-", f"BF16 max {bf16.max:.2g}"),
             (small.min_normal, GREY, "--", f"{name} smallest normal {small.min_normal:.2g}"),
             (small.min_subnormal, GREY, ":",
              f"{name} smallest subnormal {small.min_subnormal:.2g}")]
    for value, color, style, label in lines:
        if lo <= value <= hi:
            ax.axhline(value, color=color, linestyle=style, linewidth=1.2, label=label)
        else:
            ax.plot([], [], color=color, linestyle=style, label=f"{label} (off scale)")


def _scatter(ax: Axes, points: Sequence[tuple[float, float]], color: str, marker: str, label: str,
             size: float = 12) -> None:
    if points:
        ax.scatter([p[0] for p in points], [p[1] for p in points], s=size, color=color,
                   marker=marker, label=label, zorder=3, linewidths=1.2 if marker == "x" else 0,
                   rasterized=len(points) > RASTER_POINTS)


def _mark(ax: Axes, layerwise: LayerwiseResult, tensor: str | None, color: str, label: str) -> None:
    rec: LayerRecord | None = layerwise.record(tensor) if tensor else None
    if rec is not None:
        ax.axvline(rec.index, color=color, linewidth=1.2, alpha=0.8,
                   label=f"{label} (#{rec.index})")
