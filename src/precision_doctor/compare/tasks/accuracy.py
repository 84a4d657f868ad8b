"""Task accuracy against labels, side by side for several runs (FP32, low precision, fixed).

Detection (COCO JSON labels): COCO mAP@[.5:.95] and mAP@0.5 by pycocotools over every labelled
sample (``compare.tasks.coco``), the head read with the task metric's options when the metric
is a box metric (``head=``, ``boxes=`` ...) and a score threshold of 0.001 (ultralytics
``val``). Classification (CSV labels): top-1 accuracy, the share of labelled samples whose
argmax class is the label.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from precision_doctor.compare.tasks.coco import EVAL_SCORE_THRESHOLD, coco_map
from precision_doctor.compare.tasks.detection import extract_detections
from precision_doctor.compare.tasks.labels import DETECTION, ImageLabels, predicted_class

Outputs = Mapping[str, Sequence[np.ndarray]]
HEAD_OPTIONS = ("head", "boxes", "scores", "labels", "count", "box_format", "nms_iou",
                "max_det", "activation", "background")


def task_accuracy(runs: Mapping[str, Outputs], contexts: Sequence[Mapping[str, Any]],
                  options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Accuracy of each run against the samples' labels (``ground_truth`` in ``contexts``).

    Args:
        runs: Run name (``fp32``, ``fp16``, ``fixed``) -> output name -> one array per sample.
        contexts: Per-sample context (``ground_truth``, ``source_size``, ``input_size``).
        options: The task metric's options; those naming the head (``head``, ``boxes``...)
            or the class output (``output``, ``axis``) are used.

    Returns:
        ``{"kind", "metric", "samples", "runs": {run: {...}}}``: detection runs hold
        ``map``, ``map50`` (fractions), ``objects``, ``detections``; classification runs
        ``accuracy``. ``{}`` when no sample has labels.

    Raises:
        MetricError: pycocotools missing, or the outputs cannot be read as the labels' task.
    """
    idx = [i for i, c in enumerate(contexts) if c.get("ground_truth") is not None]
    if not idx:
        return {}
    truths: list[ImageLabels] = [contexts[i]["ground_truth"] for i in idx]
    opts = dict(options or {})
    out: dict[str, Any] = {"samples": len(idx), "runs": {}}
    if truths[0].kind == DETECTION:
        head = {k: v for k, v in opts.items() if k in HEAD_OPTIONS}
        if opts.get("output") is not None and "boxes" not in head:
            head["boxes"] = opts["output"]
        sizes = [(contexts[i].get("source_size"), contexts[i].get("input_size"),
                  contexts[i].get("input_box")) for i in idx]
        out.update(kind="detection", metric="COCO mAP@[.5:.95] (pycocotools)")
        for name, outputs in runs.items():
            dets = [extract_detections({k: v[i] for k, v in outputs.items()},
                                       score_threshold=EVAL_SCORE_THRESHOLD, **head)[0]
                    for i in idx]
            out["runs"][name] = coco_map(dets, truths, sizes)
        return out
    output, axis = opts.get("output"), int(opts.get("axis", -1))
    out.update(kind="classification", metric="top-1 accuracy")
    for name, outputs in runs.items():
        right = sum(predicted_class({k: v[i] for k, v in outputs.items()}, output, axis)
                    == t.class_id for i, t in zip(idx, truths))
        out["runs"][name] = {"accuracy": right / len(idx), "correct": right}
    return out


def accuracy_line(accuracy: Mapping[str, Any]) -> str:
    """One line, e.g. ``COCO mAP@[.5:.95] (pycocotools) on 6 images: fp32 70.7 -> fp16 66.1``
    (mAP and accuracy in points, i.e. percent)."""
    if not accuracy:
        return ""
    key = "map" if accuracy.get("kind") == "detection" else "accuracy"
    parts = []
    for name, r in accuracy.get("runs", {}).items():
        value = r.get(key)
        text = "n/a" if value is None or value != value else f"{100 * value:.1f}"
        extra = f" (mAP@0.5 {100 * r['map50']:.1f})" if key == "map" and \
            r.get("map50") == r.get("map50") else ""
        parts.append(f"{name} {text}{extra}")
    return (f"{accuracy.get('metric')} on {accuracy.get('samples')} labelled samples: "
            + " -> ".join(parts))


__all__ = ["accuracy_line", "task_accuracy"]
