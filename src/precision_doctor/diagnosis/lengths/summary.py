"""The length report's sentences: which outputs changed shape, which decisions did it, the
cure, and how far the audio moved (the log-spectral distance after DTW,
``compare.tasks.audio``)."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from precision_doctor.compare.tasks.audio import is_signal, lsd_dtw
from precision_doctor.diagnosis.lengths.records import DecisionChange, ShapeChange
from precision_doctor.errors import MetricError

Outputs = Mapping[str, Sequence[np.ndarray]]


def spectral_distances(changes: Sequence[ShapeChange], reference: Outputs, candidate: Outputs,
                       sample_names: Sequence[str], changed: bool = True) -> dict[str, float]:
    """Output -> mean log-spectral distance in dB after DTW (``compare.tasks.audio``) over its
    samples of another shape (``changed`` False: over its other samples, for comparison), for
    outputs with a changed shape that read as one audio signal."""
    index = {name: i for i, name in enumerate(sample_names)}
    moved = {(c.output, index[c.sample]) for c in changes
             if is_signal(c.reference) and is_signal(c.candidate)}
    by_output: dict[str, list[float]] = {}
    for name in sorted({o for o, _ in moved}):
        for i, (r, c) in enumerate(zip(reference[name], candidate[name])):
            if ((name, i) in moved) != changed or not is_signal(np.shape(c)):
                continue
            try:
                value = lsd_dtw(r, c)
            except MetricError:  # NaN/Inf audio: no spectrum to compare
                value = math.inf
            by_output.setdefault(name, []).append(value)
    return {k: float(np.mean(v)) for k, v in by_output.items()}


def spectral_text(spectral: Mapping[str, float], others: Mapping[str, float]) -> str:
    """The report's sentence on the spectral distances ("" without any)."""
    if not spectral:
        return ""

    def db(v: float) -> str:
        return f"{v:.3g} dB" if math.isfinite(v) else "n/a (NaN/Inf audio)"

    return " Log-spectral distance after DTW on those samples: " + ", ".join(
        f"{k} {db(v)}" + (f" ({db(others[k])} on the samples of equal length)"
                          if k in others else "") for k, v in spectral.items()) + "."


def length_summary(changes: Sequence[ShapeChange], first: Sequence[DecisionChange],
                   changed: Sequence[DecisionChange], samples: int, cone: Sequence[str],
                   cure: float | None, restores: bool | None = None,
                   decisions_run: bool = True) -> str:
    """The report's sentences: which outputs changed shape, which decision did it, the cure
    (``restores``: whether it gives the reference's decisions; ``cure``: the outputs' worst
    rel L2 with it) (``decisions_run`` False: recorded results, whose integer decisions could
    not be run)."""
    by_output: dict[str, list[ShapeChange]] = {}
    for c in changes:
        by_output.setdefault(c.output, []).append(c)
    parts = []
    for name, cs in by_output.items():
        c = cs[0]
        delta = _length_delta(c)
        parts.append(f"'{name}' has another shape on {len(cs)} of {samples} samples "
                     f"({c.sample}: {_shape(c.reference)} -> {_shape(c.candidate)}{delta})")
    text = "Output " + "; ".join(parts) + "."
    if first:
        details = "; ".join(d.detail for d in first)
        text += " " + details[:1].upper() + details[1:]
        rest = len(changed) - len(first)
        text += (f" ({rest} later decision(s) changed with it)." if rest > 0 else ".")
    elif not decisions_run:
        text += " Recorded results: the integer decisions were not run."
    else:
        text += (" No integer decision of the graph changed: the shape comes from elsewhere "
                 "(a shape computed from a float, or a custom op).")
    if restores is not None and cure is not None:
        if not restores:
            verdict = "does not give the reference's lengths back"
        elif math.isfinite(cure):
            verdict = (f"gives the reference's lengths on every sample again (worst rel L2 "
                       f"{cure:.3g})")
        else:
            verdict = ("gives the reference's lengths on every sample again; the outputs "
                       "still have NaN/Inf or another shape from causes after the decisions")
        text += f" Keeping its input cone ({len(cone)} nodes) in FP32 {verdict}."
    return text


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


def _length_delta(c: ShapeChange) -> str:
    """``, 8 shorter`` / ``, 4.5x longer`` along the one axis that changed."""
    if len(c.reference) != len(c.candidate):
        return ""
    axes = [i for i, (a, b) in enumerate(zip(c.reference, c.candidate)) if a != b]
    if len(axes) != 1:
        return ""
    a, b = c.reference[axes[0]], c.candidate[axes[0]]
    if a and (b / a >= 1.5 or b / a <= 1 / 1.5):
        return f", {b / a:.3g}x as long"
    return f", {abs(b - a)} {'longer' if b > a else 'shorter'}"


__all__ = ["length_summary", "spectral_distances", "spectral_text"]
