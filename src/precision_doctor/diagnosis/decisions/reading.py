"""Decisions as the task reads them: find the outputs that carry decisions and the flips.

Which outputs carry decisions: ``diagnosis.decisions.outputs``.

A *flip* is a position (all axes but the class axis, batch included) whose decision differs:
argmax over the class axis, or the thresholded value. For each flip: the FP32 margin (top-1
minus top-2 score of the reference, in output units; for sigmoid maps the distance to the
threshold), the FP32 noise there (the largest change of the position's scores under the noise
floor probes: ONNX Runtime without graph optimizations, float64), whether the task result
changed (CTC: the decoded text of that item; a classifier's class: always; maps: unknown), and
its *error share*: the squared error at the position over the output's total squared error
(all samples). ``rel_l2_without_flips`` is the L2 error of all other positions relative to the
L2 norm of the whole reference output (so it compares directly with the output's rel L2).

How a flip reads (``DecisionFlip.reading``):

* ``task-neutral``: the task result did not change (CTC: the decoded text is equal; an
  alignment shift moves a character one time step without changing the text);
* ``near-tie``: the FP32 margin is within the perturbation ordinary rounding can give that
  position: ``NEAR_TIE`` (3) times the output's *typical error* (the RMS, over the positions
  that did not flip, of the per-position L2 error across classes), or ``sqrt(u)`` times the
  L2 norm of the position's FP32 scores, whichever is larger. ``sqrt(u)`` (2.2e-2 for FP16) is
  what a relative rounding error ``u`` becomes through the largest gain that is not
  catastrophic (``1/sqrt(u)``, ``diagnosis.assessment``): a margin below it can flip without
  any defect;
* ``damage``: otherwise. A flip at a margin far above both the FP32 noise and the error
  elsewhere is not a near-tie: something changed that decision on its own (e.g. 16 of 16
  classifications flipping at FP32 margins of 1.0).

An output is *destroyed* when more than ``DESTROYED_SHARE`` (5%) of its decisions flip, and
more than one: the disagreement is systematic and the flips are counted, not listed one by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.diagnosis.decisions.outputs import (
    SIGMOID_THRESHOLD,
    ctc_charset,
    detect_decision,
)
from precision_doctor.diagnosis.decisions.records import DecisionFlip, DecisionSummary
from precision_doctor.numbers import fmt3

MAX_LISTED_FLIPS = 20  # per output, largest error share first; counts always cover all
NEAR_TIE = 3.0
DESTROYED_SHARE = 0.05
READINGS = ("task-neutral", "near-tie", "damage")
Arrays = Mapping[str, Sequence[np.ndarray]]


@dataclass
class _Acc:
    positions: int = 0
    flips: int = 0
    err2: float = 0.0
    ref2: float = 0.0
    flip_err2: float = 0.0
    nonfinite: int = 0  # positions whose candidate scores have NaN/Inf (infinite error)
    nonfinite_kept: int = 0  # of those, positions whose decision did not flip


@dataclass
class _Flipped:
    """The flips of one sample: positions, FP32 margins, squared errors, reference and
    candidate scores at those positions."""

    sample: int
    positions: np.ndarray
    margins: np.ndarray
    err2: np.ndarray
    p: np.ndarray
    q: np.ndarray


def _flip_share(acc: _Acc) -> float:
    """The flips' share of the squared error. Positions with NaN/Inf scores carry an infinite
    error: when every one of them flipped, the flips carry all of it (1.0); when some did not,
    the share is undefined (NaN)."""
    if acc.nonfinite:
        return 1.0 if not acc.nonfinite_kept else float("nan")
    return acc.flip_err2 / acc.err2 if acc.err2 > 0 else 0.0


def _scores(kind: str, a: np.ndarray, axis: int) -> np.ndarray:
    """Scores with the class axis last (sigmoid maps: one score per element, axis of 1)."""
    a = np.asarray(a, np.float64)
    return a[..., None] if kind == "sigmoid-map" else np.moveaxis(a, axis, -1)


def _decide(kind: str, s: np.ndarray) -> np.ndarray:
    if kind == "sigmoid-map":
        return (s[..., 0] > SIGMOID_THRESHOLD).astype(np.int64)
    top = s.argmax(axis=-1)
    return np.where(np.isnan(s).any(axis=-1), -1, top)


def _margins(kind: str, p: np.ndarray) -> np.ndarray:
    """FP32 margin of each row of scores ``p`` (positions x classes)."""
    if kind == "sigmoid-map":
        return np.abs(p[:, 0] - SIGMOID_THRESHOLD)
    if p.shape[-1] < 2:
        return np.abs(p[:, 0])
    top2 = np.partition(p, p.shape[-1] - 2, axis=-1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


def read_decisions(model: onnx.ModelProto, reference: Arrays, candidate: Arrays,
                   sample_names: Sequence[str], noise: Mapping[str, Arrays] | None = None,
                   model_path: str | None = None, max_listed: int = MAX_LISTED_FLIPS,
                   resolution: float = 0.0, skip: Collection[str] = ()
                   ) -> tuple[list[DecisionSummary], list[DecisionFlip]]:
    """Detect the decision outputs and compare their decisions.

    Args:
        model: The FP32 model.
        reference / candidate: Output name -> arrays (one per sample, same shapes).
        sample_names: One name per sample.
        noise: Probe name -> output name -> arrays (the FP32 noise probes' outputs), or None.
        model_path: Named in the suggested CTC metric (``ctc-string:charset=PATH``).
        max_listed: Flips listed per output (largest error share first); none are listed for
            a destroyed output.
        resolution: ``sqrt(u)`` of the target format (relative), one of the two scales a
            near-tie's margin is compared with (module docstring); 0 to use only the typical
            error.
        skip: Outputs read otherwise (a detection head: ``diagnosis.detections``), never as
            argmax decisions.

    Returns:
        ``(summaries, flips)``: one summary per decision output (graph output order) and the
        listed flips (per output, largest error share first).
    """
    summaries, flips = [], []
    for name in reference:
        found = detect_decision(model, name, reference[name]) if name not in skip else None
        if found is None:
            continue
        kind, axis = found
        s, f = _read_output(model, name, kind, axis, reference[name], candidate[name],
                            sample_names, {p: o[name] for p, o in (noise or {}).items()
                                           if name in o}, model_path, max_listed, resolution)
        summaries.append(s)
        flips.extend(f)
    return summaries, flips


def _read_output(model, name, kind, axis, refs, cands, sample_names, probes, model_path,
                 max_listed, resolution):
    acc = _Acc()
    flipped: list[_Flipped] = []
    texts_equal, items = 0, 0
    changed_items: dict[tuple[int, int], bool] = {}
    charset = ctc_charset(model, refs[0].shape[2]) if kind == "ctc" else None
    for si, (r, c) in enumerate(zip(refs, cands)):
        p, q = _scores(kind, r, axis), _scores(kind, c, axis)
        if p.shape != q.shape:
            continue
        d2 = np.square(q - p)
        bad = ~np.isfinite(d2)
        d2[bad] = 0.0  # NaN/Inf: infinite error, counted apart (``_flip_share``)
        err2, ref2 = d2.sum(axis=-1), np.square(p).sum(axis=-1)
        flip = _decide(kind, p) != _decide(kind, q)
        bad_rows = bad.any(axis=-1)
        acc.nonfinite += int(bad_rows.sum())
        acc.nonfinite_kept += int((bad_rows & ~flip).sum())
        acc.positions += flip.size
        acc.flips += int(flip.sum())
        acc.err2 += float(err2.sum())
        acc.ref2 += float(ref2.sum())
        acc.flip_err2 += float(err2[flip].sum())
        if charset is not None:
            from precision_doctor.compare.tasks.ocr import ctc_greedy_decode

            rt, ct = ctc_greedy_decode(r, charset), ctc_greedy_decode(c, charset)
            for b, (x, y) in enumerate(zip(rt, ct)):
                changed_items[(si, b)] = x[0] != y[0]
                texts_equal += x[0] == y[0]
                items += 1
        idx = np.argwhere(flip)
        if len(idx):
            pf, qf = p[flip], q[flip]
            flipped.append(_Flipped(si, idx, _margins(kind, pf), err2[flip], pf, qf))
    rest = acc.positions - acc.flips
    typical = float(np.sqrt(max(acc.err2 - acc.flip_err2, 0.0) / rest)) if rest else None
    destroyed = acc.flips > max(DESTROYED_SHARE * acc.positions, 1)
    counts = dict.fromkeys(READINGS, 0)
    damage_margins: list[np.ndarray] = []
    listed: list[tuple[float, int, tuple[int, ...], np.ndarray, np.ndarray, str]] = []
    for fl in flipped:  # vectorized: a broken map flips millions of pixels
        scale = np.maximum(NEAR_TIE * (typical or 0.0),
                           resolution * np.linalg.norm(fl.p, axis=-1))
        neutral = np.zeros(len(fl.margins), bool)
        if kind == "ctc":
            neutral = np.array([changed_items.get((fl.sample, int(pos[0]))) is False
                                for pos in fl.positions], bool)
        near = ~neutral & (fl.margins <= scale)
        damage = ~neutral & ~near
        counts["task-neutral"] += int(neutral.sum())
        counts["near-tie"] += int(near.sum())
        counts["damage"] += int(damage.sum())
        damage_margins.append(fl.margins[damage])
        if destroyed:
            continue
        top = np.argsort(-fl.err2, kind="stable")[:max_listed]
        for j in top:
            reading = ("task-neutral" if neutral[j] else "near-tie" if near[j] else "damage")
            listed.append((float(fl.err2[j]), fl.sample, tuple(int(i) for i in fl.positions[j]),
                           fl.p[j], fl.q[j], reading))
    listed.sort(key=lambda t: (-t[0], t[1], t[2]))
    shown = listed[:max_listed]
    flips = [_flip(name, kind, axis, t, acc.err2, sample_names, probes, refs, changed_items,
                   charset) for t in shown]
    margins_damaged = np.concatenate(damage_margins) if damage_margins else np.zeros(0)
    agreement = 1 - acc.flips / acc.positions if acc.positions else 1.0
    without = (float(np.sqrt(max(acc.err2 - acc.flip_err2, 0.0) / acc.ref2)) if acc.ref2 > 0
               else None)
    rank = refs[0].ndim
    task_agreement, task_metric = None, None
    if kind == "ctc" and items:
        task_agreement, task_metric = texts_equal / items, "ctc-string"
    elif kind in ("class-probabilities", "class-logits") and rank == 2:
        task_agreement, task_metric = agreement, "top1"
    suggested, why = _suggest(kind, axis, rank, model_path, acc.flips, changed_items)
    return DecisionSummary(
        name, kind, axis, acc.positions, acc.flips, agreement, task_agreement, task_metric,
        suggested, why, without, _flip_share(acc),
        counts["near-tie"], counts["task-neutral"], counts["damage"], typical,
        float(np.median(margins_damaged)) if margins_damaged.size else None, destroyed), flips


def _flip(name, kind, axis, t, total_err2, sample_names, probes, refs, changed_items,
          charset) -> DecisionFlip:
    e, si, pos, p, q, reading = t
    if kind == "sigmoid-map":
        top1 = int(p[0] > SIGMOID_THRESHOLD)
        top = (top1, 1 - top1)
        margin = abs(float(p[0]) - SIGMOID_THRESHOLD)
        cand = int(q[0] > SIGMOID_THRESHOLD) if np.isfinite(q[0]) else -1
    else:
        order = np.argsort(-p, kind="stable")
        top = (int(order[0]), int(order[1]))
        margin = float(p[order[0]] - p[order[1]])
        cand = int(q.argmax()) if np.isfinite(q).all() else -1
    noise = None
    for arrays in probes.values():
        if si < len(arrays) and np.shape(arrays[si]) == np.shape(refs[si]):
            s = _scores(kind, arrays[si], axis)[pos]
            delta = float(np.abs(s - p).max())
            noise = delta if noise is None else max(noise, delta)
    changed: bool | None = None
    if kind == "ctc":
        changed = changed_items.get((si, pos[0]))
    elif kind in ("class-probabilities", "class-logits") and refs[si].ndim == 2:
        changed = True
    sample = sample_names[si] if si < len(sample_names) else str(si)
    share = e / total_err2 if total_err2 > 0 else 0.0

    def label(i: int) -> str:
        if charset is not None and 0 <= i < len(charset):
            return repr(charset[i]) if i else "blank"
        return str(i)

    what = ("time step" if kind == "ctc" else "element" if kind == "sigmoid-map"
            else "position")
    detail = (f"{what} {list(pos)} of {sample}: FP32 picks {label(top[0])} over "
              f"{label(top[1])} by {fmt3(margin)}, the candidate picks {label(cand)}; "
              f"{share:.1%} of the output's squared error")
    if changed is not None and kind == "ctc":
        detail += "; decoded text " + ("changed" if changed else "unchanged")
    detail += f"; {reading}"
    return DecisionFlip(name, sample, pos, margin, noise, changed, share, top, cand, detail,
                        reading)


def _suggest(kind: str, axis: int, rank: int, model_path: str | None, flips: int,
             changed_items: Mapping) -> tuple[str | None, str]:
    if kind == "ctc":
        changed = sum(bool(v) for v in changed_items.values())
        return (f"ctc-string:charset={model_path or 'MODEL.onnx'}",
                "CTC class scores with the character list in the model metadata: the task reads "
                f"the decoded text ({changed} of {len(changed_items)} texts changed, {flips} "
                "time steps flipped); an alignment shift moves error between time steps "
                "without changing the text, so the softmax's rel L2 overstates the damage")
    if kind == "sigmoid-map":
        return (f"mask-iou:threshold={SIGMOID_THRESHOLD:g}",
                "a sigmoid map is read binarized; compare masks (DB text detectors such as "
                "PP-OCR det binarize at 0.3: use db-boxes or mask-iou:threshold=0.3)")
    if rank == 2:
        return ("top1", "one class decision per sample: the task reads the argmax")
    return (f"top1:axis={axis}", "one class decision per position (e.g. per pixel or token): "
            "the task reads the argmax over the class axis")


__all__ = ["DecisionFlip", "DecisionSummary", "detect_decision", "read_decisions"]
