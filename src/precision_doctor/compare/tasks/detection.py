"""Object-detection agreement: the candidate's detections scored against the reference's.

The reference's detections (score above ``score_threshold``) are the ground truth; the candidate's
detections are the predictions. Two metrics:

* ``box-match``: F1 of one-to-one box matching at IoU >= ``iou`` (default 0.5),
  ``2 * TP / (n_reference + n_candidate)``.
* ``box-map``: mean average precision at IoU >= ``iou``, all-point interpolated AP as in the
  PASCAL VOC devkit since VOC2010 (Everingham et al., "The PASCAL Visual Object Classes
  Challenge", IJCV 2010, sec. 4.2; same as ``voc_ap(use_07_metric=False)`` in py-faster-rcnn's
  ``voc_eval.py``).

Matching is greedy in descending candidate score, each candidate box taking the still unmatched
reference box of the same label with the highest IoU, if that IoU >= the threshold (the rule of
``COCOeval.evaluateImg`` in pycocotools, without crowd/area handling). Boxes are continuous
coordinates: area is ``(x2 - x1) * (y2 - y1)`` with no "+1" pixel convention.

Detections are read from the head as exported (``compare.tasks.heads``: raw YOLOv5/v8/v11
heads with NMS, DETR-family query heads, SSD-style boxes + scores, outputs after NMS such as
``[N,K,6]`` ``x1 y1 x2 y2 score label`` or TensorRT EfficientNMS, PaddleDetection ``[K,6]``),
chosen from the output shapes and names or by the ``head=`` option. Both runs are read with
the same options, so NMS and thresholds are those of the deployed pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from precision_doctor.compare.tasks.heads import (
    ACTIVATIONS,
    BOX_FORMATS,
    HEADS,
    MAX_DET,
    NMS_IOU,
    HeadSpec,
    ImageDetections,
    decode,
    infer_head,
)
from precision_doctor.errors import MetricError


@dataclass(frozen=True)
class DetectionMatch:
    """One image's matching of candidate detections to reference detections.

    Attributes:
        image: Index of the image in the batch.
        n_reference: Reference detections above the score threshold.
        n_candidate: Candidate detections above the score threshold.
        matches: ``(candidate_index, reference_index, iou)`` for every true positive; indices
            refer to the thresholded detections in their original order.
        unmatched_reference: Reference detections no candidate box matched (misses).
        unmatched_candidate: Candidate detections that matched nothing (false alarms).
    """

    image: int
    n_reference: int
    n_candidate: int
    matches: tuple[tuple[int, int, float], ...]
    unmatched_reference: tuple[int, ...]
    unmatched_candidate: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"image": self.image, "n_reference": self.n_reference,
                "n_candidate": self.n_candidate,
                "matches": [list(m) for m in self.matches],
                "unmatched_reference": list(self.unmatched_reference),
                "unmatched_candidate": list(self.unmatched_candidate)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DetectionMatch:
        """Inverse of :meth:`to_dict`."""
        return cls(image=int(data["image"]), n_reference=int(data["n_reference"]),
                   n_candidate=int(data["n_candidate"]),
                   matches=tuple((int(c), int(r), float(i)) for c, r, i in data["matches"]),
                   unmatched_reference=tuple(int(i) for i in data["unmatched_reference"]),
                   unmatched_candidate=tuple(int(i) for i in data["unmatched_candidate"]))


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of two sets of xyxy boxes.

    Formula: ``|A ∩ B| / (|A| + |B| - |A ∩ B|)`` with area ``(x2 - x1) * (y2 - y1)``; a pair whose
    union is 0 (two degenerate boxes) has IoU 0.

    Args:
        a: ``[M, 4]`` boxes ``x1, y1, x2, y2``.
        b: ``[K, 4]`` boxes.

    Returns:
        ``[M, K]`` float64 IoU matrix.
    """
    a = np.asarray(a, dtype=np.float64).reshape(-1, 4)
    b = np.asarray(b, dtype=np.float64).reshape(-1, 4)
    area_a = np.clip(a[:, 2] - a[:, 0], 0, None) * np.clip(a[:, 3] - a[:, 1], 0, None)
    area_b = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    w = np.clip(np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0]),
                0, None)
    h = np.clip(np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1]),
                0, None)
    inter = w * h
    union = area_a[:, None] + area_b[None, :] - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def extract_detections(outputs: Mapping[str, np.ndarray], *, head: str = "auto",
                       boxes: str | None = None, scores: str | None = None,
                       labels: str | None = None, count: str | None = None,
                       score_threshold: float | None = None, box_format: str = "xyxy",
                       nms_iou: float = NMS_IOU, max_det: int = MAX_DET,
                       activation: str = "auto", background: int | None = None
                       ) -> list[ImageDetections]:
    """Read per-image detections from model outputs, whatever the head (``compare.tasks.heads``).

    Args:
        outputs: Output name -> array.
        head: ``auto`` (from the outputs' shapes and names) or one of ``heads.HEADS``.
        boxes: Output with the boxes or the raw head (default: first output).
        scores: Output with the scores (default: column 4 of the boxes output if present).
        labels: Output with class ids (default: column 5 of the boxes output if present).
        count: Output with the number of valid detections per image (default: all).
        score_threshold: Keep detections scoring strictly above this (default: 0.25 for raw
            heads, 0 after NMS).
        box_format: ``xyxy`` (default), ``xywh`` or ``cxcywh`` (``nms`` and ``ssd`` heads).
        nms_iou / max_det / activation / background: As ``heads.decode``.

    Returns:
        One :class:`ImageDetections` per image.

    Raises:
        MetricError: A missing output, an unknown head or box format, or shapes that do not
            line up.
    """
    if box_format not in BOX_FORMATS:
        raise MetricError(f"box_format={box_format!r} is not one of {', '.join(BOX_FORMATS)}")
    if head not in HEADS:
        raise MetricError(f"head={head!r} is not one of {', '.join(HEADS)}")
    if activation not in ACTIVATIONS:
        raise MetricError(f"activation={activation!r} is not one of {', '.join(ACTIVATIONS)}")
    spec = infer_head(outputs, boxes, scores, labels, count, box_format)
    if head != "auto" and head != spec.kind:
        spec = HeadSpec(head, boxes, scores, labels, count, box_format)
    return decode(outputs, spec, score_threshold=score_threshold, nms_iou=nms_iou,
                  max_det=max_det, activation=activation, background=background)


def match_image(reference: ImageDetections, candidate: ImageDetections,
                iou_threshold: float = 0.5, image: int = 0) -> DetectionMatch:
    """Greedy one-to-one matching of one image's candidate boxes to its reference boxes.

    Candidates are visited by descending score (ties: original order); each takes the unmatched
    reference box with the same label and the highest IoU, if that IoU >= ``iou_threshold``
    (pycocotools ``COCOeval.evaluateImg`` rule).

    Args:
        reference: Reference detections (ground truth).
        candidate: Candidate detections.
        iou_threshold: Minimum IoU of a match (default 0.5, PASCAL VOC).
        image: Image index, recorded in the result.

    Returns:
        The :class:`DetectionMatch`.
    """
    iou = box_iou(candidate.boxes, reference.boxes)
    iou = np.where(candidate.labels[:, None] == reference.labels[None, :], iou, -1.0)
    taken = np.zeros(len(reference.scores), dtype=bool)
    matches: list[tuple[int, int, float]] = []
    unmatched_cand: list[int] = []
    for c in np.argsort(-candidate.scores, kind="stable"):
        row = np.where(taken, -1.0, iou[c])
        r = int(np.argmax(row)) if row.size else -1
        if r >= 0 and row[r] >= iou_threshold:
            taken[r] = True
            matches.append((int(c), r, float(row[r])))
        else:
            unmatched_cand.append(int(c))
    return DetectionMatch(image=image, n_reference=len(reference.scores),
                          n_candidate=len(candidate.scores), matches=tuple(matches),
                          unmatched_reference=tuple(int(i) for i in np.flatnonzero(~taken)),
                          unmatched_candidate=tuple(sorted(unmatched_cand)))


def average_precision(scores: np.ndarray, true_positive: np.ndarray, n_positive: int) -> float:
    """All-point interpolated average precision (PASCAL VOC devkit, VOC2010 and later).

    Formula: sort detections by descending score; recall ``r_i`` and precision ``p_i`` after each;
    make precision monotone, ``p_i := max_{j >= i} p_j``; ``AP = sum_i (r_i - r_{i-1}) * p_i``.

    Args:
        scores: ``[D]`` detection scores.
        true_positive: ``[D]`` bool, whether each detection matched a ground-truth box.
        n_positive: Number of ground-truth boxes.

    Returns:
        AP in [0, 1]; 0.0 when there is no ground truth or no detection.
    """
    if n_positive == 0 or len(scores) == 0:
        return 0.0
    order = np.argsort(-np.asarray(scores), kind="stable")
    tp = np.cumsum(np.asarray(true_positive, dtype=np.float64)[order])
    fp = np.cumsum(1.0 - np.asarray(true_positive, dtype=np.float64)[order])
    recall = np.concatenate([[0.0], tp / n_positive, [1.0]])
    precision = np.concatenate([[0.0], tp / (tp + fp), [0.0]])
    precision = np.maximum.accumulate(precision[::-1])[::-1]
    changed = np.flatnonzero(recall[1:] != recall[:-1])
    return float(np.sum((recall[changed + 1] - recall[changed]) * precision[changed + 1]))


def _both(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray],
          options: dict[str, Any]) -> tuple[list[ImageDetections], list[ImageDetections]]:
    output = options.pop("output", None)
    if output is not None and options.get("boxes") is None:
        options["boxes"] = output
    ref = extract_detections(reference, **options)
    cand = extract_detections(candidate, **options)
    if len(ref) != len(cand):
        raise MetricError(f"reference has {len(ref)} images of detections, candidate {len(cand)}")
    return ref, cand


def box_match_details(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray],
                      *, iou: float = 0.5, **options: Any) -> list[DetectionMatch]:
    """Per-image matching (see :func:`match_image`); ``options`` as :func:`extract_detections`
    (and ``output``, the same as ``boxes``).

    Raises:
        MetricError: As :func:`extract_detections`, or batch sizes differ.
    """
    ref, cand = _both(reference, candidate, options)
    return [match_image(r, c, iou, i) for i, (r, c) in enumerate(zip(ref, cand, strict=True))]


def box_match(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray], *,
              iou: float = 0.5, head: str = "auto", output: str | None = None,
              boxes: str | None = None, scores: str | None = None, labels: str | None = None,
              count: str | None = None, score_threshold: float | None = None,
              box_format: str = "xyxy", nms_iou: float = NMS_IOU, max_det: int = MAX_DET,
              activation: str = "auto", background: int | None = None) -> float:
    """F1 of box matching, pooled over images: ``2 * TP / (n_reference + n_candidate)``.

    Args:
        reference: Reference outputs (name -> array).
        candidate: Candidate outputs (name -> array).
        iou: Minimum IoU of a match (default 0.5).
        head / boxes / scores / labels / count / score_threshold / box_format / nms_iou /
            max_det / activation / background: How to read the head, as
            :func:`extract_detections`; ``output`` is the same as ``boxes``.

    Returns:
        F1 in [0, 1]; 1.0 when both have no detections.

    Raises:
        MetricError: As :func:`extract_detections`.
    """
    details = box_match_details(
        reference, candidate, iou=iou, head=head, output=output, boxes=boxes, scores=scores,
        labels=labels, count=count, score_threshold=score_threshold, box_format=box_format,
        nms_iou=nms_iou, max_det=max_det, activation=activation, background=background)
    total = sum(d.n_reference + d.n_candidate for d in details)
    return 1.0 if total == 0 else 2.0 * sum(len(d.matches) for d in details) / total


def box_map(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray], *,
            iou: float = 0.5, head: str = "auto", output: str | None = None,
            boxes: str | None = None, scores: str | None = None, labels: str | None = None,
            count: str | None = None, score_threshold: float | None = None,
            box_format: str = "xyxy", nms_iou: float = NMS_IOU, max_det: int = MAX_DET,
            activation: str = "auto", background: int | None = None) -> float:
    """mAP of the candidate's detections against the reference's, at IoU >= ``iou``.

    AP (:func:`average_precision`) is computed per label over all images pooled, then averaged
    over every label present in the reference or the candidate; a label only the candidate
    produces gets AP 0 (a hallucinated class lowers agreement). Both empty: 1.0.

    Args:
        reference: Reference outputs (name -> array).
        candidate: Candidate outputs (name -> array).
        iou: Minimum IoU of a match (default 0.5, "mAP@0.5").
        head ... background: As :func:`box_match`.

    Returns:
        mAP in [0, 1].

    Raises:
        MetricError: As :func:`extract_detections`.
    """
    ref, cand = _both(reference, candidate, dict(
        head=head, output=output, boxes=boxes, scores=scores, labels=labels, count=count,
        score_threshold=score_threshold, box_format=box_format, nms_iou=nms_iou,
        max_det=max_det, activation=activation, background=background))
    details = [match_image(r, c, iou, i) for i, (r, c) in enumerate(zip(ref, cand, strict=True))]
    classes = sorted(set(np.concatenate([d.labels for d in ref + cand]).tolist()))
    if not classes:
        return 1.0
    aps = []
    for label in classes:
        found: list[np.ndarray] = []
        hits: list[np.ndarray] = []
        n_pos = 0
        for r, c, d in zip(ref, cand, details, strict=True):
            n_pos += int(np.count_nonzero(r.labels == label))
            tp = np.zeros(len(c.scores), dtype=bool)
            tp[[m[0] for m in d.matches]] = True
            mine = c.labels == label
            found.append(c.scores[mine])
            hits.append(tp[mine])
        aps.append(average_precision(np.concatenate(found), np.concatenate(hits), n_pos))
    return float(np.mean(aps))
