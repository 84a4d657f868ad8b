"""Detection heads as exporters write them, read into per-image detections.

Heads (the ``head=`` option of the box metrics; ``auto`` reads the outputs' shapes and names):

* ``yolov8``: the raw head of ultralytics YOLOv8/v9/v11 (``nms=False``), one output
  ``[N, 4+C, A]``: box centre x, y, width, height in input pixels, then ``C`` class scores
  (sigmoid applied in the graph), ``A`` anchor points over the strides (8, 16, 32). A
  transposed export ``[N, A, 4+C]`` (``A > 4+C``) is read too. Score: the best class score.
* ``yolov5``: ``[N, A, 5+C]``: cx, cy, w, h, objectness, ``C`` class scores; score =
  objectness x class score (YOLOv5 ``non_max_suppression``).
* ``ssd``: two outputs, boxes ``[N, A, 4]`` (``box_format``, pixels or normalized) and class
  probabilities ``[N, A, C]``; a background column is dropped: ``background=K``, or by
  default column 0 when each row sums to 1 within 0.02 (a softmax over background + classes,
  as SSD and RetinaFace export it; ``background=-1`` keeps every column).
* ``detr``: DETR-family query heads, no NMS: one output ``[N, Q, 4+C]`` (ultralytics RT-DETR:
  normalized cx, cy, w, h, then sigmoid class scores) or boxes ``[N, Q, 4]`` + logits
  ``[N, Q, C]`` (``activation=sigmoid`` as RT-DETR / Deformable DETR, ``softmax`` as DETR,
  whose last class is "no object" and is dropped). Score: the best class; the ``max_det``
  best queries are kept (RT-DETR's postprocessor keeps 300).
* ``nms``: detections after NMS: one output ``[N, K, 5]`` (x1 y1 x2 y2 score) or
  ``[N, K, >=6]`` (``... score class``: ultralytics ``nms=True`` and end-to-end YOLOv10/YOLO26
  exports), or separate ``boxes`` ``[N, K, 4]``, ``scores``, ``labels`` and ``count`` outputs
  (TensorRT EfficientNMS: ``num_dets``, ``det_boxes``, ``det_scores``, ``det_classes``).
* ``paddle``: PaddleDetection exports with NMS: ``[K, 6]`` rows ``class, score, x1, y1, x2,
  y2`` for the whole batch, and the boxes per image ``[N]``; class -1 rows are padding.

``yolov8``, ``yolov5`` and ``ssd`` keep boxes scoring above ``score_threshold`` (default
0.25, ultralytics ``predict``'s ``conf``), then run class-aware NMS at IoU ``nms_iou`` (default
0.7, ultralytics' ``iou``) with OpenCV's ``cv2.dnn.NMSBoxesBatched`` and keep the ``max_det``
(300, ultralytics) best. ``detr`` uses the same score threshold; ``nms`` and ``paddle``
keep what scores above 0 (zero-padded slots drop).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from precision_doctor.compare.tasks.io import select_output
from precision_doctor.errors import MetricError

HEADS = ("auto", "yolov8", "yolov5", "ssd", "detr", "nms", "paddle")
BOX_FORMATS = ("xyxy", "xywh", "cxcywh")
ACTIVATIONS = ("auto", "none", "sigmoid", "softmax")
RAW_SCORE_THRESHOLD = 0.25  # ultralytics predict's default conf
NMS_IOU = 0.7  # ultralytics predict's default iou
MAX_DET = 300  # ultralytics max_det; RT-DETR's num_top_queries
EFFICIENT_NMS = ("num_dets", "det_boxes", "det_scores", "det_classes")
# rows of a softmax sum to 1 within this even when each probability was stored in BF16
# (relative rounding 2^-9 per value: <= 4e-3 for two classes); per-class sigmoids do not
SOFTMAX_SUM_TOLERANCE = 2e-2


@dataclass(frozen=True)
class ImageDetections:
    """Detections of one image after the score threshold: ``boxes [K,4]`` xyxy float64,
    ``scores [K]`` float64, ``labels [K]`` int64. ``normalized``: boxes are in [0, 1] units of
    the input image instead of input pixels."""

    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    normalized: bool = False


@dataclass(frozen=True)
class HeadSpec:
    """How to read a detection head.

    Attributes:
        kind: One of :data:`HEADS` but ``auto``.
        boxes / scores / labels / count: Output names per role (None: not used or the first
            output).
        box_format: Box coordinates of ``ssd`` and ``nms`` heads.
        why: How ``auto`` decided (one sentence, for reports).
    """

    kind: str
    boxes: str | None = None
    scores: str | None = None
    labels: str | None = None
    count: str | None = None
    box_format: str = "xyxy"
    why: str = ""

    def options(self) -> str:
        """The metric options naming this head (``head=yolov8`` or ``head=ssd,boxes=..``)."""
        parts = [f"head={self.kind}"]
        parts += [f"{k}={v}" for k, v in (("boxes", self.boxes), ("scores", self.scores),
                                           ("labels", self.labels), ("count", self.count))
                  if v is not None and self.kind in ("ssd", "detr", "nms", "paddle")]
        if self.box_format != "xyxy" and self.kind in ("ssd", "nms"):
            parts.append(f"box_format={self.box_format}")
        return ",".join(parts)


def to_xyxy(boxes: np.ndarray, box_format: str) -> np.ndarray:
    """``[..., 4]`` boxes in ``box_format`` -> x1 y1 x2 y2."""
    if box_format == "xyxy":
        return boxes
    x, y, w, h = boxes[..., 0], boxes[..., 1], boxes[..., 2], boxes[..., 3]
    if box_format == "xywh":
        return np.stack([x, y, x + w, y + h], axis=-1)
    return np.stack([x - w / 2, y - h / 2, x + w / 2, y + h / 2], axis=-1)


def _shape(outputs: Mapping[str, Any], name: str) -> tuple[int, ...]:
    return tuple(np.shape(outputs[name]))


def infer_head(outputs: Mapping[str, Any], boxes: str | None = None,
               scores: str | None = None, labels: str | None = None,
               count: str | None = None, box_format: str = "xyxy") -> HeadSpec:
    """Guess the head from output shapes and names (``head=auto``); see the module docstring.

    Args:
        outputs: Output name -> array (or anything with a ``shape``), model output order.
        boxes / scores / labels / count: Output names given by the user (kept).
        box_format: The user's box format (kept).

    Returns:
        The :class:`HeadSpec`; ``nms`` with a note when nothing more specific fits.
    """
    names = list(outputs)
    lower = {n.lower(): n for n in names}
    if all(k in lower for k in EFFICIENT_NMS) and boxes is None:
        b, s, c, n = (lower[k] for k in ("det_boxes", "det_scores", "det_classes", "num_dets"))
        return HeadSpec("nms", b, s, c, n, box_format, "TensorRT EfficientNMS outputs")
    if boxes is not None or scores is not None:
        kind = "ssd" if _scores_per_class(outputs, boxes, scores) else "nms"
        return HeadSpec(kind, boxes, scores, labels, count, box_format,
                        "the outputs named by the options")
    first = names[0] if names else None
    shape = _shape(outputs, first) if first else ()
    if len(shape) == 2 and shape[1] == 6 and len(names) >= 2:
        counts = [n for n in names[1:] if len(_shape(outputs, n)) == 1]
        if counts:
            return HeadSpec("paddle", first, None, None, counts[0], box_format,
                            f"[K, 6] rows and a count output '{counts[0]}' (PaddleDetection)")
    if len(shape) == 3 and len(names) >= 2 and shape[2] == 4:
        other = _shape(outputs, names[1])
        if len(other) == 3 and other[0] == shape[0] and shape[1] in other[1:]:
            kind = "detr" if not _probabilities(outputs[names[1]]) else "ssd"
            why = ("boxes and class logits per query" if kind == "detr"
                   else "boxes and class probabilities per anchor (NMS needed)")
            return HeadSpec(kind, first, names[1], None, None,
                            "cxcywh" if kind == "detr" else box_format, why)
    if len(shape) == 3 and 5 <= shape[1] and shape[2] > 2 * shape[1]:
        return HeadSpec("yolov8", first, why=f"one output [N, 4+C, A] = {list(shape)}: "
                        f"{shape[1] - 4} class scores over {shape[2]} anchor points")
    if first is not None and len(shape) == 3 and shape[2] > 7:
        arr = np.asarray(outputs[first])
        if arr.size and float(np.nanmax(np.abs(arr[..., :4]))) <= 2.0:
            return HeadSpec("detr", first, why=f"one output [N, Q, 4+C] = {list(shape)} with "
                            "normalized boxes (a DETR-family query head)")
        return HeadSpec("yolov5", first, why=f"one output [N, A, 5+C] = {list(shape)} with "
                        "boxes in pixels and an objectness column")
    return HeadSpec("nms", first, None, None, count, box_format,
                    "detections after NMS (x1 y1 x2 y2 score [class] rows)")


def _scores_per_class(outputs: Mapping[str, Any], boxes: str | None,
                      scores: str | None) -> bool:
    """Boxes ``[N, A, 4]`` with scores ``[N, A, C]``: per-class scores (an ``ssd`` head)."""
    if boxes is None or scores is None or boxes not in outputs or scores not in outputs:
        return False
    return len(_shape(outputs, boxes)) == 3 and len(_shape(outputs, scores)) == 3


def _probabilities(a: Any) -> bool:
    arr = np.asarray(a)
    return bool(arr.size) and float(np.nanmin(arr)) >= 0.0 and float(np.nanmax(arr)) <= 1.0


def nms(boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray, iou: float,
        max_det: int) -> np.ndarray:
    """Class-aware NMS with OpenCV's ``cv2.dnn.NMSBoxesBatched``.

    Args:
        boxes: ``[K, 4]`` xyxy. scores: ``[K]``. labels: ``[K]`` int.
        iou: Suppress a box overlapping a better one of its class above this IoU.
        max_det: Keep at most this many, best first.

    Returns:
        Indices kept, by descending score.

    Raises:
        MetricError: OpenCV is not installed (the message says how to install it).
    """
    if len(scores) == 0:
        return np.zeros(0, np.int64)
    try:
        import cv2
    except ImportError:
        raise MetricError("reading a raw detection head needs OpenCV for NMS "
                          "(cv2.dnn.NMSBoxesBatched): pip install 'precision-doctor[detect]'"
                          ) from None
    xywh = np.concatenate([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], axis=1)
    batched: Any = cv2.dnn.NMSBoxesBatched  # its stubs want lists; arrays are accepted
    picked = batched(xywh.astype(np.float64), scores.astype(np.float32),
                     labels.astype(np.int32), -np.inf, float(iou), 1.0, int(max_det))
    keep = np.asarray(picked, np.int64).reshape(-1)
    return keep[np.argsort(-scores[keep], kind="stable")]


def _nms_images(xyxy: np.ndarray, score: np.ndarray, label: np.ndarray, threshold: float,
                iou: float, max_det: int, normalized: bool) -> list[ImageDetections]:
    out = []
    for b, s, lab in zip(xyxy, score, label):
        ok = np.isfinite(s) & (s > threshold) & np.isfinite(b).all(axis=1)
        b, s, lab = b[ok], s[ok], lab[ok]
        keep = nms(b, s, lab, iou, max_det)
        out.append(ImageDetections(b[keep], s[keep], lab[keep], normalized))
    return out


def _activate(logits: np.ndarray, activation: str) -> tuple[np.ndarray, str]:
    if activation == "auto":
        activation = "none" if _probabilities(logits) else "sigmoid"
    if activation == "sigmoid":
        return 1.0 / (1.0 + np.exp(-logits)), activation
    if activation == "softmax":
        e = np.exp(logits - np.nanmax(logits, axis=-1, keepdims=True))
        return (e / e.sum(axis=-1, keepdims=True))[..., :-1], activation  # drop "no object"
    return logits, activation


def decode(outputs: Mapping[str, np.ndarray], spec: HeadSpec, *,
           score_threshold: float | None = None, nms_iou: float = NMS_IOU,
           max_det: int = MAX_DET, activation: str = "auto",
           background: int | None = None) -> list[ImageDetections]:
    """Per-image detections of a head (rules: module docstring).

    Args:
        outputs: Output name -> array.
        spec: The head (:func:`infer_head` or from the ``head=`` option).
        score_threshold: Keep detections scoring strictly above this (default: 0.25 for raw
            heads, 0 for heads after NMS).
        nms_iou: IoU of the NMS of raw heads.
        max_det: Detections kept per image (raw heads: after NMS; DETR: the top-k queries).
        activation: DETR class scores: ``auto`` (sigmoid unless already in [0, 1]), ``none``,
            ``sigmoid``, ``softmax``.
        background: ``ssd``: index of a background class column to drop (None: column 0 when
            the scores are a softmax over classes; -1: none).

    Returns:
        One :class:`ImageDetections` per image.

    Raises:
        MetricError: Shapes that do not fit the head, or OpenCV missing for NMS.
    """
    kind = spec.kind
    if kind in ("nms", "paddle"):
        return read_nms_head(outputs, spec, 0.0 if score_threshold is None else score_threshold)
    threshold = RAW_SCORE_THRESHOLD if score_threshold is None else score_threshold
    a = np.asarray(select_output(outputs, spec.boxes, role="detection head"), np.float64)
    if a.ndim == 2:
        a = a[None]
    if a.ndim != 3:
        raise MetricError(f"a {kind} head is [N, ..., ...]; got {list(a.shape)}: pass "
                          "head=... and the outputs (boxes=, scores=)", output=spec.boxes)
    if kind == "yolov8":
        if a.shape[1] < a.shape[2]:
            a = np.swapaxes(a, 1, 2)  # [N, A, 4+C]
        if a.shape[2] < 5:
            raise MetricError(f"a YOLOv8 head has 4 + C >= 5 rows; got {list(a.shape)}")
        cls = a[..., 4:]
        label = np.nanargmax(np.nan_to_num(cls, nan=-np.inf), axis=-1)
        score = np.take_along_axis(cls, label[..., None], -1)[..., 0]
        return _nms_images(to_xyxy(a[..., :4], "cxcywh"), score, label, threshold, nms_iou,
                           max_det, False)
    if kind == "yolov5":
        if a.shape[2] < 6:
            raise MetricError(f"a YOLOv5 head has 5 + C >= 6 columns; got {list(a.shape)}")
        cls = a[..., 5:] * a[..., 4:5]
        label = np.nanargmax(np.nan_to_num(cls, nan=-np.inf), axis=-1)
        score = np.take_along_axis(cls, label[..., None], -1)[..., 0]
        return _nms_images(to_xyxy(a[..., :4], "cxcywh"), score, label, threshold, nms_iou,
                           max_det, False)
    if kind == "ssd":
        s = np.asarray(select_output(outputs, spec.scores, role="scores"), np.float64)
        s = s[None] if s.ndim == 2 else s
        if s.shape[:2] != a.shape[:2] and s.shape[::2] == a.shape[:2]:
            s = np.swapaxes(s, 1, 2)  # [N, C, A] -> [N, A, C]
        if s.shape[:2] != a.shape[:2] or a.shape[2] != 4:
            raise MetricError(f"ssd head: boxes {list(a.shape)} and scores {list(s.shape)} do "
                              "not line up as [N, A, 4] and [N, A, C]")
        columns = np.arange(s.shape[2])
        if background is None and s.shape[2] > 1 and s.size and float(np.nanmax(np.abs(
                s.sum(axis=-1) - 1.0))) <= SOFTMAX_SUM_TOLERANCE:
            background = 0  # a softmax over classes including background (SSD, RetinaFace)
        if background is not None and background >= 0:
            columns = columns[columns != background]
        cls = s[..., columns]
        label = columns[np.nanargmax(np.nan_to_num(cls, nan=-np.inf), axis=-1)]
        score = np.nanmax(np.nan_to_num(cls, nan=-np.inf), axis=-1)
        boxes = to_xyxy(a, spec.box_format)
        normalized = bool(boxes.size) and float(np.nanmax(np.abs(boxes))) <= 2.0
        return _nms_images(boxes, score, label, threshold, nms_iou, max_det, normalized)
    if kind == "detr":
        if spec.scores is not None:
            logits = np.asarray(select_output(outputs, spec.scores, role="scores"), np.float64)
            logits = logits[None] if logits.ndim == 2 else logits
            box = a[..., :4]
        else:
            logits, box = a[..., 4:], a[..., :4]
        probs, _ = _activate(logits, activation)
        label = np.nanargmax(np.nan_to_num(probs, nan=-np.inf), axis=-1)
        score = np.take_along_axis(probs, label[..., None], -1)[..., 0]
        xyxy = to_xyxy(box, spec.box_format if spec.scores is not None else "cxcywh")
        out = []
        for b, s, lab in zip(xyxy, score, label):
            order = np.argsort(-np.nan_to_num(s, nan=-np.inf), kind="stable")[:max_det]
            order = order[np.isfinite(s[order]) & (s[order] > threshold)]
            out.append(ImageDetections(b[order], s[order], lab[order], True))
        return out
    raise MetricError(f"head={kind!r} is not one of {', '.join(HEADS)}")


def read_nms_head(outputs: Mapping[str, np.ndarray], spec: HeadSpec,
                  score_threshold: float) -> list[ImageDetections]:
    """Detections of a head that includes NMS (``nms``: rows ``x1 y1 x2 y2 score class`` or
    separate outputs; ``paddle``: ``[K, 6]`` rows ``class score x1 y1 x2 y2`` and a count).

    Detections are kept where ``score > score_threshold`` (strict, so zero-padded slots drop at
    0.0). Without a score column or output every box has score 1.0; without labels every box
    has label 0.

    Raises:
        MetricError: A missing output or shapes that do not line up.
    """
    if spec.kind == "paddle":
        return _read_paddle(outputs, spec, score_threshold)
    boxes, scores, labels, count = spec.boxes, spec.scores, spec.labels, spec.count
    b = np.asarray(select_output(outputs, boxes, role="boxes"), dtype=np.float64)
    if b.ndim == 2:
        b = b[None]
    if b.ndim != 3 or b.shape[-1] < 4:
        raise MetricError(f"detection boxes must be [K, >=4] or [N, K, >=4], got {b.shape}; "
                          "name the boxes output with boxes=NAME or the head with head=...",
                          output=boxes)

    def per_box(name: str | None, column: int, default: float, role: str) -> np.ndarray:
        if name is not None:
            arr = np.asarray(select_output(outputs, name, role=role), dtype=np.float64)
            if arr.size != b.shape[0] * b.shape[1]:
                raise MetricError(f"{role} output {name!r} has shape {arr.shape}, which does "
                                  f"not match boxes {b.shape}", output=name)
            return arr.reshape(b.shape[:2])
        return b[..., column] if b.shape[-1] > column else np.full(b.shape[:2], default)

    s = per_box(scores, 4, 1.0, "scores")
    lab = np.rint(np.nan_to_num(per_box(labels, 5, 0.0, "labels"), nan=-1.0)).astype(np.int64)
    keep = s > score_threshold
    if count is not None:
        n = np.asarray(select_output(outputs, count, role="count")).reshape(-1).astype(np.int64)
        if n.size != b.shape[0]:
            raise MetricError(f"count output {count!r} has {n.size} values for {b.shape[0]} "
                              "images", output=count)
        keep &= np.arange(b.shape[1])[None, :] < n[:, None]
    xyxy = to_xyxy(b[..., :4], spec.box_format)
    return [ImageDetections(xyxy[i][keep[i]], s[i][keep[i]], lab[i][keep[i]])
            for i in range(b.shape[0])]


def _read_paddle(outputs: Mapping[str, np.ndarray], spec: HeadSpec,
                 score_threshold: float) -> list[ImageDetections]:
    rows = np.asarray(select_output(outputs, spec.boxes, role="boxes"), np.float64)
    if rows.ndim != 2 or rows.shape[1] < 6:
        raise MetricError(f"a PaddleDetection head is [K, 6]; got {list(rows.shape)}",
                          output=spec.boxes)
    counts = (np.asarray(select_output(outputs, spec.count, role="count")).reshape(-1)
              .astype(np.int64) if spec.count is not None else np.array([len(rows)]))
    if int(counts.sum()) > len(rows):
        raise MetricError(f"count output {spec.count!r} sums to {int(counts.sum())} boxes; the "
                          f"[K, 6] output has {len(rows)}", output=spec.count)
    out, start = [], 0
    for n in counts:
        r = rows[start:start + int(n)]
        start += int(n)
        r = r[(r[:, 0] >= 0) & (r[:, 1] > score_threshold)]
        out.append(ImageDetections(r[:, 2:6], r[:, 1], np.rint(r[:, 0]).astype(np.int64)))
    return out


__all__ = ["ACTIVATIONS", "BOX_FORMATS", "HEADS", "HeadSpec", "ImageDetections", "decode",
           "infer_head", "nms", "read_nms_head", "to_xyxy"]
