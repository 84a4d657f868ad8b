"""Task metrics of the zoo models that no built-in covers (``fix --metric FILE:function``).

    precision-doctor fix .models/zoo/nudenet/model.onnx --data .models/zoo/nudenet/inputs \\
        --metric benchmarks/zoo_metrics.py:nudenet_match -o /tmp/nudenet_fp16.onnx
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from zoo import nudenet_detections  # noqa: E402

from precision_doctor.compare.tasks.detection import box_match  # noqa: E402


def as_rows(raw: np.ndarray) -> np.ndarray:
    """nudenet's decoded detections of every image of a raw head [N, 22, A] as one
    [N, K, 6] array (x1, y1, x2, y2, score, label), padded with zero-score rows."""
    per_image = []
    for y in np.asarray(raw, np.float32):
        dets = [(x, yy, x + w, yy + h, s, c) for c, s, (x, yy, w, h) in nudenet_detections(y)]
        per_image.append(np.asarray(dets, np.float64).reshape(-1, 6))
    k = max(1, max(len(d) for d in per_image))
    out = np.zeros((len(per_image), k, 6))
    out[..., 5] = -1
    for i, d in enumerate(per_image):
        out[i, :len(d)] = d
    return out


def nudenet_match(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray], *,
                  output: str = "output0", iou: float = 0.5) -> float:
    """F1 of the candidate's nudenet detections against the reference's (same class, IoU >=
    ``iou``), after nudenet 3.4.2's own decoding (score >= 0.2, NMS 0.25/0.45); 1.0 when both
    find nothing."""
    ref, cand = as_rows(reference[output]), as_rows(candidate[output])
    return box_match({"d": ref}, {"d": cand}, boxes="d", iou=iou)


def vad_agreement(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray], *,
                  output: str = "output", threshold: float = 0.5) -> float:
    """Share of windows the candidate puts on the same side of Silero VAD's speech threshold
    (0.5, its default) as the reference; a NaN probability never agrees."""
    ref = np.asarray(reference[output], np.float64).reshape(-1) >= threshold
    cand = np.asarray(candidate[output], np.float64).reshape(-1)
    return float(np.mean(((cand >= threshold) == ref) & ~np.isnan(cand)))
