"""Decisions as the task reads them: find the outputs that carry decisions and the flips.

Detection (per float output, from the graph and the reference values; no ``--metric`` needed):

* ``class-probabilities``: produced by Softmax (through Identity nodes) along its axis, or any
  output whose values along the last axis (rank >= 2) or axis 1 (rank 4) lie in [0, 1] and sum
  to 1 within 1e-3 (FP32 sums of up to 1e5 probabilities are exact to ~1e-5).
* ``class-logits``: produced by LogSoftmax along its axis; or produced by a linear head
  (MatMul/Gemm, or an Add of a constant bias to one) as a rank-2 ``[N, C]`` output with
  ``C >= 2`` (a classifier), or rank-3 ``[N, T, C]`` with ``C >= 10`` (token classification,
  LM heads; box regressions have 4 values per position). Rank-2 outputs of Flatten/Reshape/
  Squeeze (a head after global pooling) count too. Hidden states (a LayerNorm's final Add,
  pooled embeddings) are not decisions.
* ``ctc``: class scores ``[N, T, C]`` of a model whose metadata ``character`` (PP-OCR's CTC
  dictionary) fits ``C``; decoded with best-path CTC (``compare.tasks.ocr``).
* ``sigmoid-map``: produced by Sigmoid: every element is a binary decision at
  ``SIGMOID_THRESHOLD`` = 0.5 (logit 0, the Bayes boundary of a calibrated sigmoid). Task
  post-processing may binarize elsewhere (PP-OCR's DB text detector uses 0.3).

A *flip* is a position (all axes but the class axis, batch included) whose decision differs:
argmax over the class axis, or the thresholded value. For each flip: the FP32 margin (top-1
minus top-2 score of the reference, in output units; for sigmoid maps the distance to the
threshold), the FP32 noise there (the largest change of the position's scores under the noise
floor probes: ONNX Runtime without graph optimizations, float64), whether the task result
changed (CTC: the decoded text of that item; a classifier's class: always; maps: unknown), and
its *error share*: the squared error at the position over the output's total squared error
(all samples). ``rel_l2_without_flips`` is the relative L2 error over all other positions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.errors import PrecisionDoctorError
from precision_doctor.jsonable import from_json_float, json_float
from precision_doctor.numbers import fmt3

SIGMOID_THRESHOLD = 0.5
SUM_TOLERANCE = 1e-3
MAX_LISTED_FLIPS = 20  # per output, largest error share first; counts always cover all
MAX_CLASSES = 100_000
LINEAR = ("Gemm", "MatMul")
RESHAPES = ("Flatten", "Reshape", "Squeeze")
Arrays = Mapping[str, Sequence[np.ndarray]]


@dataclass(frozen=True)
class DecisionFlip:
    """One position whose decision changed. See the module docstring for the definitions.

    Attributes:
        output / sample: Output name; the input's name (file name or index).
        position: Index in the sample's output array without the class axis (batch first).
        fp32_margin: Reference top-1 minus top-2 score (sigmoid maps: |p - threshold|).
        fp32_noise: Largest per-class change at the position under the FP32 noise probes
            (output units); None when no probe output was available.
        task_changed: Whether the task-level result changed (None: unknown).
        error_share: Squared error at the position / total squared error of the output.
        fp32_top: Reference top-1 and top-2 class (sigmoid maps: [decision, other]).
        candidate_top: Candidate top-1 class (-1 when its scores are NaN).
        detail: One sentence for reports.
    """

    output: str
    sample: str
    position: tuple[int, ...]
    fp32_margin: float
    fp32_noise: float | None
    task_changed: bool | None
    error_share: float
    fp32_top: tuple[int, int]
    candidate_top: int
    detail: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["position"], d["fp32_top"] = list(self.position), list(self.fp32_top)
        return {k: json_float(v) for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: Mapping) -> DecisionFlip:
        noise = d.get("fp32_noise")
        return cls(d["output"], str(d["sample"]), tuple(int(i) for i in d["position"]),
                   from_json_float(d["fp32_margin"]),
                   from_json_float(noise) if noise is not None else None, d.get("task_changed"),
                   from_json_float(d["error_share"]), tuple(d.get("fp32_top", (0, 0))),
                   int(d.get("candidate_top", -1)), d.get("detail", ""))


@dataclass(frozen=True)
class DecisionSummary:
    """How one decision output's decisions fared.

    Attributes:
        output / kind / axis: The output, its kind (module docstring) and class axis.
        positions / flips: Decisions compared and decisions changed (all samples).
        argmax_agreement: ``1 - flips / positions``.
        task_agreement: CTC: share of items whose decoded text is equal; classifier: the
            argmax agreement; else None.
        task_metric: The metric behind ``task_agreement`` (``ctc-string``, ``top1``) or None.
        suggested_metric: The ``--metric`` spec that ``fix`` should target, or None.
        why: Why (one sentence).
        rel_l2_without_flips: Relative L2 error over the positions that did not flip.
        flip_error_share: Share of the output's squared error carried by the flips.
    """

    output: str
    kind: str
    axis: int
    positions: int
    flips: int
    argmax_agreement: float
    task_agreement: float | None
    task_metric: str | None
    suggested_metric: str | None
    why: str
    rel_l2_without_flips: float | None
    flip_error_share: float = 0.0

    def to_dict(self) -> dict:
        return {k: json_float(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: Mapping) -> DecisionSummary:
        f = {k: (from_json_float(v) if k in ("argmax_agreement", "task_agreement",
                                              "rel_l2_without_flips", "flip_error_share")
                 and v is not None else v) for k, v in d.items()}
        return cls(**f)


def _producer(model: onnx.ModelProto, name: str) -> onnx.NodeProto | None:
    by_out = {o: n for n in model.graph.node for o in n.output}
    node = by_out.get(name)
    while node is not None and node.op_type == "Identity" and node.input:
        node = by_out.get(node.input[0])
    return node


def _linear_head(model: onnx.ModelProto, node: onnx.NodeProto | None) -> bool:
    """MatMul/Gemm, or Add(MatMul/Gemm output, constant bias)."""
    if node is None:
        return False
    if node.op_type in LINEAR:
        return True
    if node.op_type != "Add" or len(node.input) != 2:
        return False
    consts = {t.name for t in model.graph.initializer} | {
        o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    by_out = {o: n for n in model.graph.node for o in n.output}
    kinds = [("const" if i in consts else by_out[i].op_type if i in by_out else "")
             for i in node.input]
    return "const" in kinds and any(k in LINEAR for k in kinds)


def _is_probabilities(arrays: Sequence[np.ndarray], axis: int) -> bool:
    for a in arrays:
        if a.ndim < 2 or not (2 <= a.shape[axis] <= MAX_CLASSES) or a.size == 0:
            return False
        if float(a.min()) < -1e-6 or float(a.max()) > 1 + 1e-6:
            return False
        if float(np.abs(a.sum(axis=axis, dtype=np.float64) - 1).max()) > SUM_TOLERANCE:
            return False
    return True


def _charset(model: onnx.ModelProto, classes: int) -> list[str] | None:
    from precision_doctor.compare.tasks.ocr import ctc_charset_from_model

    if not any(p.key == "character" for p in model.metadata_props):
        return None
    try:
        charset = ctc_charset_from_model(model)
    except PrecisionDoctorError:
        return None
    return charset if len(charset) == classes else None


def detect_decision(model: onnx.ModelProto, name: str, arrays: Sequence[np.ndarray]
                    ) -> tuple[str, int] | None:
    """The decision kind and class axis of output ``name``, or None (rules: module docstring).

    Args:
        model: The FP32 model (producers, opset, metadata).
        name: A graph output.
        arrays: Its reference values, one array per sample.

    Returns:
        ``(kind, axis)`` with a non-negative axis, or None.
    """
    if not arrays or arrays[0].dtype.kind != "f" or arrays[0].ndim < 2:
        return None
    rank = arrays[0].ndim
    node = _producer(model, name)
    op = node.op_type if node is not None else ""
    axis = None
    if node is not None and op in ("Softmax", "LogSoftmax"):
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        attr = next((a.i for a in node.attribute if a.name == "axis"), -1 if opset >= 13 else 1)
        axis = attr % rank
        if op == "LogSoftmax":
            return "class-logits", axis
        if not _is_probabilities(arrays, axis):
            axis = None
    if op == "Sigmoid":
        return "sigmoid-map", 0
    if axis is None:
        axis = next((a for a in ((rank - 1, 1) if rank == 4 else (rank - 1,))
                     if _is_probabilities(arrays, a)), None)
    if axis is not None:
        if rank == 3 and axis == 2 and _charset(model, arrays[0].shape[2]) is not None:
            return "ctc", 2
        return "class-probabilities", axis
    classes = arrays[0].shape[-1]
    linear = _linear_head(model, node)
    if rank == 2 and 2 <= classes <= MAX_CLASSES and (linear or op in RESHAPES):
        return "class-logits", 1
    if rank == 3 and 10 <= classes <= MAX_CLASSES and linear:
        return "class-logits", 2
    return None


@dataclass
class _Acc:
    positions: int = 0
    flips: int = 0
    err2: float = 0.0
    ref2: float = 0.0
    flip_err2: float = 0.0
    flip_ref2: float = 0.0


def _scores(kind: str, a: np.ndarray, axis: int) -> np.ndarray:
    """Scores with the class axis last (sigmoid maps: one score per element, axis of 1)."""
    a = np.asarray(a, np.float64)
    return a[..., None] if kind == "sigmoid-map" else np.moveaxis(a, axis, -1)


def _decide(kind: str, s: np.ndarray) -> np.ndarray:
    if kind == "sigmoid-map":
        return (s[..., 0] > SIGMOID_THRESHOLD).astype(np.int64)
    top = s.argmax(axis=-1)
    return np.where(np.isnan(s).any(axis=-1), -1, top)


def read_decisions(model: onnx.ModelProto, reference: Arrays, candidate: Arrays,
                   sample_names: Sequence[str], noise: Mapping[str, Arrays] | None = None,
                   model_path: str | None = None, max_listed: int = MAX_LISTED_FLIPS
                   ) -> tuple[list[DecisionSummary], list[DecisionFlip]]:
    """Detect the decision outputs and compare their decisions.

    Args:
        model: The FP32 model.
        reference / candidate: Output name -> arrays (one per sample, same shapes).
        sample_names: One name per sample.
        noise: Probe name -> output name -> arrays (the FP32 noise probes' outputs), or None.
        model_path: Named in the suggested CTC metric (``ctc-string:charset=PATH``).
        max_listed: Flips listed per output (largest error share first).

    Returns:
        ``(summaries, flips)``: one summary per decision output (graph output order) and the
        listed flips (per output, largest error share first).
    """
    from precision_doctor.diagnosis.detections import read_detections

    # a detection head is read as boxes (diagnosis.detections), never as argmax decisions
    summaries, flips, boxes = read_detections(model, reference, candidate, sample_names)
    for name in reference:
        found = detect_decision(model, name, reference[name]) if name not in boxes else None
        if found is None:
            continue
        kind, axis = found
        s, f = _read_output(model, name, kind, axis, reference[name], candidate[name],
                            sample_names, {p: o[name] for p, o in (noise or {}).items()
                                           if name in o}, model_path, max_listed)
        summaries.append(s)
        flips.extend(f)
    return summaries, flips


def _read_output(model, name, kind, axis, refs, cands, sample_names, probes, model_path,
                 max_listed):
    acc = _Acc()
    listed: list[tuple[float, int, tuple[int, ...], np.ndarray, np.ndarray]] = []
    texts_equal, items = 0, 0
    changed_items: dict[tuple[int, int], bool] = {}
    charset = _charset(model, refs[0].shape[2]) if kind == "ctc" else None
    for si, (r, c) in enumerate(zip(refs, cands)):
        p, q = _scores(kind, r, axis), _scores(kind, c, axis)
        if p.shape != q.shape:
            continue
        d2 = np.square(q - p)
        d2[~np.isfinite(d2)] = 0.0  # NaN/Inf are counted by the output metrics, not here
        err2, ref2 = d2.sum(axis=-1), np.square(p).sum(axis=-1)
        flip = _decide(kind, p) != _decide(kind, q)
        acc.positions += flip.size
        acc.flips += int(flip.sum())
        acc.err2 += float(err2.sum())
        acc.ref2 += float(ref2.sum())
        acc.flip_err2 += float(err2[flip].sum())
        acc.flip_ref2 += float(ref2[flip].sum())
        if charset is not None:
            from precision_doctor.compare.tasks.ocr import ctc_greedy_decode

            rt, ct = ctc_greedy_decode(r, charset), ctc_greedy_decode(c, charset)
            for b, (x, y) in enumerate(zip(rt, ct)):
                changed_items[(si, b)] = x[0] != y[0]
                texts_equal += x[0] == y[0]
                items += 1
        idx = np.argwhere(flip)
        if len(idx):
            e = err2[flip]
            for j in np.argsort(-e, kind="stable")[:max_listed]:
                pos = tuple(int(i) for i in idx[j])
                listed.append((float(e[j]), si, pos, p[pos], q[pos]))
    listed.sort(key=lambda t: -t[0])
    flips = [_flip(name, kind, axis, t, acc.err2, sample_names, probes, refs, changed_items,
                   charset) for t in listed[:max_listed]]
    agreement = 1 - acc.flips / acc.positions if acc.positions else 1.0
    rest_ref2 = acc.ref2 - acc.flip_ref2
    without = (float(np.sqrt(max(acc.err2 - acc.flip_err2, 0.0) / rest_ref2)) if rest_ref2 > 0
               else None)
    rank = refs[0].ndim
    task_agreement, task_metric = None, None
    if kind == "ctc" and items:
        task_agreement, task_metric = texts_equal / items, "ctc-string"
    elif kind in ("class-probabilities", "class-logits") and rank == 2:
        task_agreement, task_metric = agreement, "top1"
    suggested, why = _suggest(kind, axis, rank, model_path, acc.flips, changed_items)
    return DecisionSummary(name, kind, axis, acc.positions, acc.flips, agreement,
                           task_agreement, task_metric, suggested, why, without,
                           acc.flip_err2 / acc.err2 if acc.err2 > 0 else 0.0), flips


def _flip(name, kind, axis, t, total_err2, sample_names, probes, refs, changed_items,
          charset) -> DecisionFlip:
    e, si, pos, p, q = t
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
    return DecisionFlip(name, sample, pos, margin, noise, changed, share, top, cand, detail)


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
