"""Detection heads as decision outputs: which boxes appear, vanish, move or change class.

A model output is read as a detection head (``compare.tasks.heads``) when the exporter says so
or its shape leaves no doubt:

* ultralytics metadata (``task: detect``; ``end2end: True`` means NMS is in the graph; an
  ``RT-DETR`` description means a query head), with the class ``names`` it stores;
* TensorRT EfficientNMS outputs (``num_dets``, ``det_boxes``, ``det_scores``, ``det_classes``);
* a PaddleDetection ``[K, 6]`` output with its count;
* a raw YOLOv8 head ``[N, 4+C, A]`` (``A > 2 (4+C)``) produced by a ``Concat`` (the exported
  ``torch.cat((box, cls.sigmoid()), 1)``);
* boxes ``[N, A, 4]`` beside per-class scores ``[N, A, C]`` with ``A >= 100`` (SSD-style
  anchors needing NMS when the scores are probabilities, else DETR queries with logits).

Reference and candidate detections are read with the same options (score above 0.25 for raw
heads, class-aware NMS at IoU 0.7 by OpenCV) and matched per image, one to one, greedily by
reference score at IoU >= ``MATCH_IOU`` = 0.5 (PASCAL VOC's match threshold) whatever the
class. A reference box without a match *vanished*, a candidate box without one *appeared*, a
match with another class *changed class*, and a match of the same class below
``MOVED_IOU`` = 0.9 *moved* (project choice: FP16 rounding moves a box by a fraction of a
pixel, IoU > 0.99 on boxes of tens of pixels). Each such box is listed as a flip (``position``
= (image, box index; -1 - index for a candidate box), the labels in ``fp32_top[0]`` /
``candidate_top``, no FP32 noise or error share) with its margin and reading
(``diagnosis.decisions.reading``): a box that vanished or appeared has the margin
``|score - score threshold|``, a box that changed class or moved ``|reference score -
candidate score|`` (the competing class or anchor scored about the candidate's score in FP32);
it is a ``near-tie`` when that margin is at most ``sqrt(u)`` (the ``resolution``) times the
score, what ordinary rounding of the scores can move, else ``damage``. The summary gives the
box-match F1 (``box-match``), counts near-ties and damage (destroyed above 5% of the boxes)
and suggests ``--metric box-map`` with the head's options.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.compare.tasks.detection import box_iou
from precision_doctor.compare.tasks.heads import (
    RAW_SCORE_THRESHOLD,
    HeadSpec,
    ImageDetections,
    decode,
    infer_head,
)
from precision_doctor.diagnosis.decisions.reading import DESTROYED_SHARE
from precision_doctor.diagnosis.decisions.records import DecisionFlip, DecisionSummary
from precision_doctor.errors import PrecisionDoctorError
from precision_doctor.numbers import fmt3

MATCH_IOU = 0.5
MOVED_IOU = 0.9
Arrays = Mapping[str, Sequence[np.ndarray]]


def model_metadata(model: onnx.ModelProto) -> dict[str, str]:
    """The model's ``metadata_props`` as a dict."""
    return {p.key: p.value for p in model.metadata_props}


def class_names(model: onnx.ModelProto) -> dict[int, str]:
    """Class index -> name from the exporter's metadata (ultralytics ``names``, a Python dict
    literal; PaddleOCR-style ``character`` lists are not class names), or {}."""
    text = model_metadata(model).get("names")
    if not text:
        return {}
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return {}
    if isinstance(value, dict):
        return {int(k): str(v) for k, v in value.items()}
    if isinstance(value, list):
        return dict(enumerate(map(str, value)))
    return {}


def _producer_op(model: onnx.ModelProto, name: str) -> str:
    return next((n.op_type for n in model.graph.node if name in n.output), "")


def find_head(model: onnx.ModelProto, shapes: Mapping[str, np.ndarray]) -> HeadSpec | None:
    """The detection head among the outputs, or None (rules: module docstring).

    Args:
        model: The FP32 model (metadata, producers).
        shapes: Output name -> one sample's reference array.
    """
    if not shapes:
        return None
    meta = model_metadata(model)
    ultralytics = meta.get("task") == "detect" or "ultralytics" in meta.get("author", "").lower()
    spec = infer_head(shapes)
    if ultralytics and meta.get("task", "detect") == "detect":
        if meta.get("end2end", "").lower() == "true" or "nms': True" in meta.get("args", ""):
            return HeadSpec("nms", spec.boxes, why="ultralytics export with NMS in the graph "
                            "(rows x1 y1 x2 y2 score class)")
        if "detr" in meta.get("description", "").lower():  # "Ultralytics rtdetr-l model ..."
            return HeadSpec("detr", spec.boxes, why="ultralytics RT-DETR export: [N, Q, 4+C] "
                            "queries, normalized cx cy w h and sigmoid class scores")
        if spec.kind in ("yolov8", "yolov5"):
            size = meta.get("imgsz", "").strip("[]").replace(", ", "x")
            hint = (f"; exported at imgsz {size}, stride {meta.get('stride', '?')} (inputs "
                    f"as ultralytics feeds them: -p ultralytics:size={size})") if size else ""
            return HeadSpec(spec.kind, spec.boxes,
                            why=f"ultralytics YOLO export: {spec.why}{hint}")
    if spec.kind == "paddle" or (spec.kind == "nms" and spec.count and spec.scores):
        return spec  # PaddleDetection rows + count; EfficientNMS outputs found by their names
    if spec.kind == "yolov8" and spec.boxes and _producer_op(model, spec.boxes) == "Concat":
        return spec
    if spec.kind in ("ssd", "detr") and spec.boxes and shapes[spec.boxes].shape[1] >= 100:
        return spec  # boxes [N, A, 4] beside per-class scores [N, A, C] for >= 100 A
    return None


def _match(ref: ImageDetections, cand: ImageDetections) -> tuple[dict[int, tuple[int, float]],
                                                                 list[int]]:
    """Reference index -> (candidate index, IoU), greedy by reference score, any class."""
    iou = box_iou(ref.boxes, cand.boxes)
    taken = np.zeros(len(cand.scores), bool)
    pairs: dict[int, tuple[int, float]] = {}
    for r in np.argsort(-ref.scores, kind="stable"):
        row = np.where(taken, -1.0, iou[r]) if iou.size else np.zeros(0)
        c = int(np.argmax(row)) if row.size else -1
        if c >= 0 and row[c] >= MATCH_IOU:
            taken[c] = True
            pairs[int(r)] = (c, float(row[c]))
    return pairs, [int(i) for i in np.flatnonzero(~taken)]


def read_detections(model: onnx.ModelProto, reference: Arrays, candidate: Arrays,
                    sample_names: Sequence[str], resolution: float = 0.0
                    ) -> tuple[list[DecisionSummary], list[DecisionFlip], set[str]]:
    """Detect a detection head and compare its boxes (rules: module docstring).

    Args:
        model: The FP32 model.
        reference / candidate: Output name -> arrays (one per sample).
        sample_names: One name per sample.
        resolution: ``sqrt(u)`` of the target format (relative score change of a near-tie).

    Returns:
        ``(summaries, flips, outputs)``: one summary for the head, its changed boxes (most
        confident reference box first) and the outputs it covers (not to be read as argmax
        decisions); all empty when no head is found or it cannot be decoded.
    """
    if not reference or not next(iter(reference.values()), None):
        return [], [], set()
    first = {k: v[0] for k, v in reference.items()}
    spec = find_head(model, first)
    if spec is None:
        return [], [], set()
    names = class_names(model)
    covered = {n for n in (spec.boxes or next(iter(reference)), spec.scores, spec.labels,
                           spec.count) if n}
    found: list[tuple[float, DecisionFlip]] = []
    n_ref = n_cand = matched_same = 0
    try:
        for si, sample in enumerate(sample_names):
            refs = decode({k: v[si] for k, v in reference.items()}, spec)
            cands = decode({k: v[si] for k, v in candidate.items()}, spec)
            for image, (r, c) in enumerate(zip(refs, cands)):
                n_ref, n_cand = n_ref + len(r.scores), n_cand + len(c.scores)
                pairs, extra = _match(r, c)
                matched_same += sum(int(r.labels[i] == c.labels[j]) for i, (j, _) in
                                    pairs.items())
                found += _changes(spec, sample, image, r, c, pairs, extra, names, resolution)
    except PrecisionDoctorError:
        return [], [], set()
    found.sort(key=lambda t: -t[0])
    flips = [f for _, f in found]
    total = n_ref + n_cand
    f1 = 1.0 if total == 0 else 2.0 * matched_same / total
    label = spec.boxes or next(iter(reference))
    spec_text = f"box-map:{spec.options()}"
    why = (f"{spec.why}: the task reads boxes after decoding and NMS, not the raw tensor "
           f"({len(flips)} boxes appeared, vanished, moved or changed class among {n_ref} "
           "FP32 detections)")
    near = sum(f.reading == "near-tie" for f in flips)
    damaged = [f.fp32_margin for f in flips if f.reading == "damage"]
    summary = DecisionSummary(
        label, f"detection-{spec.kind}", 0, total, len(flips), f1, f1, "box-match", spec_text,
        why, None, 0.0, near_ties=near, damage=len(damaged),
        damage_margin=float(np.median(damaged)) if damaged else None,
        destroyed=len(flips) > 1 and len(flips) > DESTROYED_SHARE * total)
    return [summary], flips, covered


def _changes(spec: HeadSpec, sample: str, image: int, r: ImageDetections, c: ImageDetections,
             pairs: Mapping[int, tuple[int, float]], extra: Sequence[int],
             names: Mapping[int, str], resolution: float) -> list[tuple[float, DecisionFlip]]:
    threshold = RAW_SCORE_THRESHOLD if spec.kind in ("yolov8", "yolov5", "ssd", "detr") else 0.0

    def reading(margin: float, score: float) -> str:
        return "near-tie" if margin <= resolution * max(score, threshold) else "damage"

    def cls(i: int) -> str:
        return names.get(int(i), str(int(i)))

    def box(b: np.ndarray) -> str:
        return "[" + ", ".join(fmt3(float(v)) for v in b) + "]"

    out = []
    output = spec.boxes or ""
    for i in range(len(r.scores)):
        s, lab = float(r.scores[i]), int(r.labels[i])
        if i not in pairs:
            what, cand, detail = "vanished", -1, "no candidate box overlaps it at IoU >= 0.5"
            margin = abs(s - threshold)
        else:
            j, iou = pairs[i]
            cand = int(c.labels[j])
            margin = abs(s - float(c.scores[j]))
            if cand != lab:
                what, detail = "changed class", f"the candidate calls it {cls(cand)} " \
                                                f"({fmt3(float(c.scores[j]))}), IoU {fmt3(iou)}"
            elif iou < MOVED_IOU:
                what, detail = "moved", f"IoU {fmt3(iou)} with the candidate's box " \
                                        f"{box(c.boxes[j])}"
            else:
                continue
        text = f"{cls(lab)} {fmt3(s)} at {box(r.boxes[i])} of {sample} {what}: {detail}"
        out.append((s, DecisionFlip(output, sample, (image, i), margin, None, True, 0.0,
                                    (lab, -1), cand, text, reading(margin, s))))
    for j in extra:
        s, lab = float(c.scores[j]), int(c.labels[j])
        text = (f"{cls(lab)} {fmt3(s)} at {box(c.boxes[j])} of {sample} appeared: no FP32 box "
                "overlaps it at IoU >= 0.5")
        margin = abs(s - threshold)
        out.append((s, DecisionFlip(output, sample, (image, -1 - j), margin, None, True, 0.0,
                                    (-1, -1), lab, text, reading(margin, s))))
    return out


__all__ = ["MATCH_IOU", "MOVED_IOU", "class_names", "find_head", "model_metadata",
           "read_detections"]
