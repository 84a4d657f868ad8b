"""Measure what changed an output's shape: the integer decisions, near-tie or destroyed, and
the cure.

Both the FP32 reference and the candidate run once more with every decision site's integer
and its float source marked as outputs (``graph.outputs.mark_outputs``). A site *changed* when
its integers differ on some sample. Each changed site is read (thresholds shared with the
output decisions of ``diagnosis.decisions.reading``):

``near-tie``
    Every changed integer moved by one step, and the FP32 source value of each was within
    ``NEAR_TIE`` (3x) the candidate error expected there of its rounding boundary: the format's
    ordinary error carried a value across a boundary it sat on (one duration rounded up by one
    frame). The expected error is the source's RMS relative error over all positions times the
    boundary's size (floats err relative to their size; a masked 0 says nothing about a
    duration of 3). Distances are in units in the last place (ULP) of the target format at the
    boundary: 2^(floor(log2 |b|) - p) for a normal b and p explicit fraction bits (IEEE-754).
``destroyed``
    The candidate's source has NaN/Inf, more than half of the integers changed, or their total
    moved by more than ``DESTROYED_RATIO`` (1.5x either way): the predictor itself is broken.
``damage``
    Otherwise.

The *roots* are the changed sites whose input cone holds no other changed site: downstream sites
change because the roots did. The cure is measured on an emulated candidate: the roots' input
cones in FP32 (one evaluation; ``diagnosis.causes.trials``), and it cures when every output has
the reference's shape on every sample again.
"""

from __future__ import annotations

import math
import time
from typing import Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.compare.metrics import shape_changes as changed_samples
from precision_doctor.diagnosis.lengths.cone import cone_model, cone_samples
from precision_doctor.diagnosis.lengths.records import DecisionChange, LengthReport, ShapeChange
from precision_doctor.diagnosis.lengths.sites import (
    ROUNDING_OPS,
    DecisionSite,
    decision_sites,
    input_cone,
)
from precision_doctor.diagnosis.lengths.summary import (
    length_summary,
    spectral_distances,
    spectral_text,
)
from precision_doctor.formats import FORMATS, Precision
from precision_doctor.graph.outputs import mark_outputs
from precision_doctor.layerwise.candidates import (
    Candidate,
    emulated,
    reference_factory,
    run_samples,
)

Outputs = Mapping[str, Sequence[np.ndarray]]
NEAR_TIE = 3.0  # as diagnosis.decisions.reading: a margin within 3x the typical error
DESTROYED_RATIO = 1.5
DESTROYED_CHANGED = 0.5


def shape_changes(reference: Outputs, candidate: Outputs, sample_names: Sequence[str]
                  ) -> list[ShapeChange]:
    """Every (output, sample) whose candidate shape differs from the reference's
    (``compare.metrics.shape_changes``), output order then sample order."""
    return [ShapeChange(name, sample_names[i], tuple(np.shape(reference[name][i])),
                        tuple(np.shape(candidate[name][i])))
            for name, changed in changed_samples(reference, candidate).items() for i in changed]


def ulp(value: np.ndarray, target: Precision) -> np.ndarray:
    """Spacing of ``target`` at |value| (float64 array): 2^(floor(log2|v|) - mantissa bits),
    the smallest subnormal below the normal range."""
    fmt = FORMATS[target]
    v = np.maximum(np.abs(np.asarray(value, np.float64)), fmt.min_normal)
    return np.exp2(np.floor(np.log2(v)) - fmt.mantissa_bits)


def boundary(x: np.ndarray, rounding: str) -> np.ndarray:
    """The rounding boundary nearest each FP32 value: integers for Ceil/Floor and a Cast's
    truncation, half-integers for Round (round half to even switches there)."""
    x = np.asarray(x, np.float64)
    if rounding == "Round":
        return np.floor(x) + 0.5
    return np.round(x)


def measure_site(site: DecisionSite, ref: Outputs, cand: Outputs, target: Precision
                 ) -> DecisionChange | None:
    """How one site fared (module docstring); None when its integers never changed."""
    refs, cands = ref[site.tensor], cand[site.tensor]
    n = len(refs)
    samples_changed = positions = changed = up = down = 0
    steps: list[float] = []
    moved_at: list[tuple[float, float]] = []  # changed decisions: (|x - b|, |b|) in FP32
    rel: list[np.ndarray] = []  # the source's relative candidate error, every position
    total_r = total_c = 0.0
    nonfinite = 0
    scalar = bool(site.rounding)
    for i in range(n):
        r, c = np.asarray(refs[i]), np.asarray(cands[i])
        total_r += float(np.sum(r, dtype=np.float64))
        total_c += float(np.sum(c, dtype=np.float64))
        src_c = np.asarray(cand[site.source][i], np.float64)
        nonfinite += int(np.count_nonzero(~np.isfinite(src_c)))
        if r.shape != c.shape:
            samples_changed += 1
            continue
        diff = c.astype(np.float64) - r.astype(np.float64)
        moved = diff != 0
        positions += r.size
        src_r = np.asarray(ref[site.source][i], np.float64)
        if scalar and src_r.size == r.size and src_c.size == r.size:  # reshapes keep order
            src_r, src_c = src_r.reshape(r.shape), src_c.reshape(r.shape)
            ok = np.isfinite(src_c) & (np.abs(src_r) >= FORMATS[target].min_normal)
            rel.append(np.abs(src_c - src_r)[ok] / np.abs(src_r[ok]))
            b = boundary(src_r, site.rounding)
            moved_at.extend(zip(np.abs(src_r - b)[moved].tolist(), np.abs(b)[moved].tolist()))
        if not moved.any():
            continue
        samples_changed += 1
        changed += int(moved.sum())
        up += int((diff > 0).sum())
        down += int((diff < 0).sum())
        steps.append(float(np.abs(diff[moved]).max()))
    if not samples_changed:
        return None
    worst_dist, typical = _boundary_ulps(moved_at, rel, target)
    ratio = total_c / total_r if total_r else None
    max_step = max(steps) if steps else None
    reading = _reading(site, positions, changed, max_step, worst_dist, typical, ratio,
                       nonfinite, samples_changed, n)
    change = DecisionChange(site.node, site.op, site.tensor, site.source, site.rounding,
                            site.sets_shape, n, samples_changed, positions, changed, up, down,
                            max_step, ratio, worst_dist, typical, nonfinite, reading, "")
    return _with_detail(change, target)


def _boundary_ulps(moved_at: Sequence[tuple[float, float]], rel: Sequence[np.ndarray],
                   target: Precision) -> tuple[float | None, float | None]:
    """(distance from its boundary, expected candidate error there), both in target ULPs at
    the boundary, of the changed decision that sat farthest from its boundary relative to the
    error expected there. The expected error is the source's RMS relative error over every
    position (floats err relative to their size) times |boundary|; a boundary of 0 takes the
    value's own size."""
    errors = np.concatenate(rel) if rel else np.zeros(0)
    if not moved_at or not errors.size:
        return None, None
    rho = float(np.sqrt(np.mean(np.square(errors))))
    worst: tuple[float, float, float] | None = None  # (ratio, distance, expected) in ULPs
    for dist, size in moved_at:
        scale = size if size > 0 else dist
        spacing = float(ulp(np.array([scale]), target)[0])
        expected = max(rho * scale / spacing, 0.5)
        ratio = (dist / spacing) / expected
        if worst is None or ratio > worst[0]:
            worst = (ratio, dist / spacing, expected)
    assert worst is not None
    return worst[1], worst[2]


def _reading(site: DecisionSite, positions: int, changed: int, max_step: float | None,
             dist: float | None, typical: float | None, ratio: float | None, nonfinite: int,
             samples_changed: int, n: int) -> str:
    if nonfinite or (positions and changed > DESTROYED_CHANGED * positions):
        return "destroyed"
    if ratio is not None and ratio > 0 and not (
            1 / DESTROYED_RATIO <= ratio <= DESTROYED_RATIO):
        return "destroyed"
    if (site.rounding and changed and max_step == 1 and dist is not None
            and typical is not None and dist <= NEAR_TIE * typical):
        return "near-tie"
    return "damage"


def _with_detail(d: DecisionChange, target: Precision) -> DecisionChange:
    what = d.op if d.rounding in ("", "Cast", d.op) else f"{d.rounding} -> {d.op}"
    fmt = target.value.upper()
    noun = "lengths" if d.sets_shape else "values"
    head = f"{d.node} ({what})"
    if d.reading == "near-tie":
        direction = "up" if d.up and not d.down else ("down" if d.down and not d.up
                                                      else "up or down")
        text = (f"{d.changed} of {d.positions} {noun} rounded at {head} moved {direction} by "
                f"one step; the FP32 input was at most {d.boundary_ulps:.2g} {fmt} ULP from "
                f"the rounding boundary, within {NEAR_TIE:g}x the typical {fmt} error there "
                f"({d.typical_ulps:.2g} ULP): a near-tie")
    elif d.reading == "destroyed":
        parts = []
        if d.nonfinite:
            parts.append(f"its input has {d.nonfinite} NaN/Inf values")
        if d.positions:
            parts.append(f"{d.changed} of {d.positions} {noun} changed")
        if d.total_ratio is not None and math.isfinite(d.total_ratio):
            parts.append(f"their total is {d.total_ratio:.3g}x the reference's")
        text = f"the {noun} rounded at {head} are destroyed: " + ", ".join(
            parts or [f"its {noun} changed"])
    else:
        text = (f"{d.changed} of {d.positions} {noun} rounded at {head} changed (largest step "
                f"{d.max_step if d.max_step is not None else 'n/a'}"
                + (f", input up to {d.boundary_ulps:.3g} {fmt} ULP from the boundary"
                   if d.boundary_ulps is not None else "") + "): not near-ties")
    if d.positions == 0:
        text += f"; their shape changed on {d.samples_changed} of {d.samples} samples"
    return DecisionChange(**{**d.__dict__, "detail": text})


def roots(model: onnx.ModelProto, changed: Sequence[DecisionChange]) -> list[DecisionChange]:
    """The changed decisions whose input cone holds no other changed decision."""
    nodes = {d.node for d in changed}
    out = []
    for d in changed:
        upstream = set(input_cone(model, [d.source])) & nodes
        if not upstream - {d.node}:
            out.append(d)
    return out


def decision_cone(model: onnx.ModelProto, first: Sequence[DecisionChange | DecisionSite]
                  ) -> list[str]:
    """The nodes to keep in FP32 so that decisions read their exact FP32 inputs: the input
    cones of their sources, and the rounding ops themselves (a Round in FP16 reads its input
    rounded to FP16: 3.50002 becomes 3.5 and rounds half to even; on the int8 Kokoro voice
    that alone changed one duration of 31 with the whole cone in FP32)."""
    if not first:
        return []
    rounding = {d.node for d in first if d.op in ROUNDING_OPS}
    cone = set(input_cone(model, [d.source for d in first])) | rounding
    return [n.name for n in model.graph.node if n.name in cone]


def read_sites(model: onnx.ModelProto, samples: Sequence, candidate: Candidate,
               target: Precision, sites: Sequence[DecisionSite] | None = None
               ) -> list[DecisionChange]:
    """Run the reference and the candidate up to the decision sites (``cone.cone_model``: what
    follows them, a vocoder over a destroyed length, is not run), and measure every site
    (graph order; only the changed ones). A candidate that runs whole models only (a real
    engine's own written model) runs the whole model with the sites marked.

    Raises:
        BackendError: A run fails.
    """
    sites = decision_sites(model) if sites is None else sites
    if not sites:
        return []
    ref, cand = run_sites(model, samples, candidate, sites)
    found = (measure_site(s, ref, cand, target) for s in sites)
    return [d for d in found if d is not None]


def run_sites(model: onnx.ModelProto, samples: Sequence, candidate: Candidate,
              sites: Sequence[DecisionSite]) -> tuple[Outputs, Outputs]:
    """The reference's and the candidate's integers and float sources of ``sites`` (tensor ->
    one array per sample), run up to them (``read_sites``).

    Raises:
        BackendError: A run fails.
    """
    names = list(dict.fromkeys([s.tensor for s in sites] + [s.source for s in sites]))
    if candidate.segments:
        marked = cone_model(model, names)
        samples = cone_samples(marked, samples)
    else:
        marked = mark_outputs(model, names)
    return (run_samples(reference_factory(marked), samples, names),
            run_samples(candidate.factory(marked), samples, names))


def analyse_lengths(model: onnx.ModelProto, samples: Sequence, target: Precision,
                    candidate: Candidate, changes: Sequence[ShapeChange], measure=None,
                    outputs: tuple[Outputs, Outputs] | None = None) -> LengthReport:
    """The length report of a candidate whose outputs changed shape.

    Args:
        model: The FP32 model (nodes named).
        samples: Objects with ``.feeds`` (and ``.name``).
        target: The target format (ULPs are its).
        candidate: The candidate (its factory runs the marked model).
        changes: ``shape_changes`` of the plain runs (non-empty).
        measure: ``measure(nodes) -> worst output rel L2`` with ``nodes`` in FP32
            (``diagnosis.causes.trials.ImpactTrials``), or None: the cure is not measured.
        outputs: The plain runs' (reference, candidate) outputs, for the spectral distance
            of audio outputs; None: not computed.

    Returns:
        The ``LengthReport``.

    Raises:
        BackendError: A run fails.
    """
    t0 = time.perf_counter()
    sites = decision_sites(model)
    changed = read_sites(model, samples, candidate, target, sites)
    # the decisions that set a shape explain a shape change; the others only if none does
    first = roots(model, [d for d in changed if d.sets_shape] or changed)
    cone = decision_cone(model, first)
    cure = restores = None
    if measure is not None and cone and candidate.plan is not None:
        cure = measure(cone)
        cured = emulated(candidate.plan.keep_fp32(cone, "diagnose"), candidate.conv_bias)
        by_node = {s.node: s for s in sites}
        restores = not read_sites(model, samples, cured, target,
                                  [by_node[d.node] for d in first])
    order = {"destroyed": 0, "damage": 1, "near-tie": 2}
    reading = min((d.reading for d in first), key=order.__getitem__, default="unknown")
    names = [getattr(s, "name", str(i)) for i, s in enumerate(samples)]
    spectral = spectral_distances(changes, *outputs, names) if outputs is not None else {}
    others = (spectral_distances(changes, *outputs, names, changed=False)
              if outputs is not None else {})
    summary = length_summary(changes, first, changed, len(samples), cone, cure, restores)
    summary += spectral_text(spectral, others)
    return LengthReport(tuple(changes), tuple(changed), tuple(d.node for d in first), reading,
                        summary, tuple(cone), cure, spectral or None, time.perf_counter() - t0,
                        restores)


__all__ = ["DESTROYED_RATIO", "NEAR_TIE", "analyse_lengths", "boundary", "decision_cone",
           "measure_site",
           "read_sites", "roots", "run_sites", "shape_changes", "ulp"]
