"""Detection accuracy against COCO labels, computed by pycocotools (``COCOeval``).

Detections are read from the head as exported (``compare.tasks.heads``) and mapped back to
source-image pixels before they meet the labels: normalized boxes are first scaled to the input
tensor's pixels (``input_size``), then ``x_src = (x - left) * w_src / width`` (and so for y)
with ``input_box = (top, left, height, width)``, where the resized image lies in the tensor:
this undoes the ``resize=fixed`` stretch (``cv2.dnn.blobFromImage``), the ``letterbox``
padding of ultralytics exports and a center crop. Array inputs carry no sizes: their boxes are
taken as already in the labels' pixels.

``coco-map-drop`` (per sample, lower is better): COCO mAP@[.5:.95] of the reference's
detections on that image minus the candidate's, both against the labels (``--threshold 0.001``:
at most 0.1 point of mAP lost on any image). :func:`coco_accuracy` gives the dataset numbers
(mAP@[.5:.95] and mAP@0.5 over all labelled samples) for the FP32 / low precision / fixed
comparison. The score threshold defaults to 0.001 (ultralytics ``val``'s ``conf``: low-score
detections raise recall at no precision cost in AP).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from precision_doctor.compare.tasks.detection import extract_detections
from precision_doctor.compare.tasks.heads import MAX_DET, NMS_IOU, ImageDetections
from precision_doctor.compare.tasks.labels import ImageLabels
from precision_doctor.errors import MetricError

EVAL_SCORE_THRESHOLD = 0.001  # ultralytics val's conf
INSTALL_HINT = "pip install 'precision-doctor[detect]' (pycocotools)"


def _cocotools() -> tuple[Any, Any]:
    try:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
    except ImportError:
        raise MetricError(f"COCO mAP needs pycocotools: {INSTALL_HINT}") from None
    return COCO, COCOeval


def to_source(det: ImageDetections, source_size: Sequence[int] | None,
              input_size: Sequence[int] | None,
              input_box: Sequence[int] | None = None) -> np.ndarray:
    """``[K, 4]`` xyxy boxes in source-image pixels (rules: module docstring)."""
    boxes = np.asarray(det.boxes, np.float64).reshape(-1, 4)
    if source_size is None:
        return boxes
    sh, sw = float(source_size[0]), float(source_size[1])
    if det.normalized:
        if input_size is None:
            return boxes * [sw, sh, sw, sh]
        boxes = boxes * [input_size[1], input_size[0], input_size[1], input_size[0]]
    if input_box is None:
        if input_size is None:
            return boxes
        input_box = (0, 0, int(input_size[0]), int(input_size[1]))
    top, left, bh, bw = (float(v) for v in input_box)
    return (boxes - [left, top, left, top]) * [sw / bw, sh / bh, sw / bw, sh / bh]


def coco_map(detections: Sequence[ImageDetections], truths: Sequence[ImageLabels],
             sizes: Sequence[tuple[Any, ...]]) -> dict[str, float]:
    """COCO box mAP of detections against labels, by pycocotools.

    Args:
        detections: One per image.
        truths: The labels of the same images.
        sizes: ``(source_size, input_size[, input_box])`` per image (context values or
            None).

    Returns:
        ``{"map": mAP@[.5:.95], "map50": mAP@0.5, "images", "objects", "detections"}``; the
        mAPs are NaN when no image has a labelled object (COCOeval's -1).

    Raises:
        MetricError: pycocotools is missing.
    """
    coco_cls, eval_cls = _cocotools()
    images: list[dict[str, Any]] = []
    anns: list[dict[str, Any]] = []
    dets: list[dict[str, Any]] = []
    cats: set[int] = set()
    for i, (det, gt, size) in enumerate(zip(detections, truths, sizes), 1):
        src, inp, box = (*size, None)[:3]
        h, w = (src if src is not None else (gt.height or 1, gt.width or 1))
        images.append({"id": i, "width": int(w), "height": int(h), "file_name": gt.name})
        for (x, y, bw, bh), c, crowd in zip(gt.boxes, gt.categories,
                                            gt.crowd or (0,) * len(gt.boxes)):
            anns.append({"id": len(anns) + 1, "image_id": i, "category_id": int(c),
                         "bbox": [x, y, bw, bh], "area": float(bw * bh), "iscrowd": crowd})
            cats.add(int(c))
        for (x1, y1, x2, y2), s, c in zip(to_source(det, src, inp, box), det.scores,
                                          det.labels):
            dets.append({"image_id": i, "category_id": int(c), "score": float(s),
                         "bbox": [float(x1), float(y1), float(x2 - x1), float(y2 - y1)]})
            cats.add(int(c))
    summary = {"images": len(images), "objects": len(anns), "detections": len(dets)}
    if not anns:
        return {"map": float("nan"), "map50": float("nan"), **summary}
    if not dets:
        return {"map": 0.0, "map50": 0.0, **summary}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
        gt_api = coco_cls()
        gt_api.dataset = {"images": images, "annotations": anns,
                          "categories": [{"id": c, "name": str(c)} for c in sorted(cats)]}
        gt_api.createIndex()
        evaluator = eval_cls(gt_api, gt_api.loadRes(dets), "bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    stats = [float(v) for v in evaluator.stats[:2]]
    return {"map": stats[0] if stats[0] >= 0 else float("nan"),
            "map50": stats[1] if stats[1] >= 0 else float("nan"), **summary}


def coco_map_drop(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray], *,
                  head: str = "auto", output: str | None = None, boxes: str | None = None,
                  scores: str | None = None, labels: str | None = None,
                  count: str | None = None, score_threshold: float = EVAL_SCORE_THRESHOLD,
                  box_format: str = "xyxy", nms_iou: float = NMS_IOU, max_det: int = MAX_DET,
                  activation: str = "auto", background: int | None = None,
                  ground_truth: ImageLabels | None = None,
                  source_size: tuple[int, int] | None = None,
                  input_size: tuple[int, int] | None = None,
                  input_box: tuple[int, int, int, int] | None = None) -> float:
    """COCO mAP@[.5:.95] lost on one image: reference's minus candidate's, both against the
    labels (lower is better; negative when the candidate does better).

    Args:
        reference / candidate: Outputs (name -> array) of one sample (batch 1).
        head ... background: How to read the detection head (``box-map``'s options; ``output``
            is the same as ``boxes``).
        ground_truth: The image's labels (per-sample context from ``--labels``).
        source_size / input_size / input_box: The image's size before and after
            preprocessing and where it lies in the input (context).

    Returns:
        The drop in mAP points / 100 (0.001 = 0.1 point); 0.0 when the image has no labelled
        object and neither run detects anything there.

    Raises:
        MetricError: No labels for the sample, pycocotools missing, or the head cannot be read.
    """
    if ground_truth is None or ground_truth.kind != "detection":
        raise MetricError("coco-map-drop needs COCO labels per image: --labels FILE.json "
                          "(API: labels=...) whose images[].file_name are the input files")
    options: dict[str, Any] = dict(
        head=head, boxes=boxes if boxes is not None else output, scores=scores,
                   labels=labels, count=count, score_threshold=score_threshold,
                   box_format=box_format, nms_iou=nms_iou, max_det=max_det,
                   activation=activation, background=background)
    ref = extract_detections(reference, **options)
    cand = extract_detections(candidate, **options)
    if len(ref) != 1 or len(cand) != 1:
        raise MetricError(f"coco-map-drop scores one image per sample; the outputs hold "
                          f"{len(ref)} images")
    size = [(source_size, input_size, input_box)]
    a = coco_map(ref, [ground_truth], size)["map"]
    b = coco_map(cand, [ground_truth], size)["map"]
    if np.isnan(a) and np.isnan(b):
        return 0.0
    return float(np.nan_to_num(a, nan=0.0) - np.nan_to_num(b, nan=0.0))


__all__ = ["EVAL_SCORE_THRESHOLD", "coco_map", "coco_map_drop", "to_source"]
