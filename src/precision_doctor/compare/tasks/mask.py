"""Binary-mask IoU between a reference and a candidate probability (or logit) map.

Used for segmentation and text detection. PP-OCR's detector outputs a ``[N, 1, H, W]``
probability map that PaddleOCR's ``DBPostProcess`` binarizes with ``pred > thresh``, ``thresh =
0.3`` (PaddleOCR ``ppocr/postprocess/db_postprocess.py``); use ``mask-iou:threshold=0.3`` for it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from precision_doctor.compare.tasks.io import select_pair
from precision_doctor.errors import MetricError


def mask_iou_per_sample(reference_map: np.ndarray, candidate_map: np.ndarray,
                        threshold: float = 0.5) -> np.ndarray:
    """Intersection over union of the two binarized maps, one value per sample (axis 0).

    Formula: ``A = ref > threshold``, ``B = cand > threshold`` (strict, as DBPostProcess),
    ``IoU = |A & B| / |A | B|``; two empty masks have IoU 1.0 (identical behaviour: nothing
    detected in either). A NaN candidate pixel counts as wrong: it is taken as the opposite of the
    reference pixel, so NaNs lower the IoU instead of silently reading as background.

    Args:
        reference_map: Float map, shape ``[N, ...]`` (e.g. ``[N, 1, H, W]``); a 0-d or 1-d array
            is one sample.
        candidate_map: Same shape.
        threshold: Binarization threshold in the map's units (probability for PP-OCR det).

    Returns:
        ``float64`` array of shape ``[N]`` with values in [0, 1].

    Raises:
        MetricError: The maps are empty.
    """
    ref = np.asarray(reference_map)
    cand = np.asarray(candidate_map)
    if ref.size == 0:
        raise MetricError(f"mask IoU got an empty map of shape {ref.shape}")
    if ref.ndim < 2:
        ref, cand = ref.reshape(1, -1), cand.reshape(1, -1)
    a = (ref > threshold).reshape(len(ref), -1)
    b = (cand > threshold).reshape(len(cand), -1)
    if cand.dtype.kind == "f":
        nan = np.isnan(cand).reshape(len(cand), -1)
        b = np.where(nan, ~a, b)
    inter = np.count_nonzero(a & b, axis=1)
    union = np.count_nonzero(a | b, axis=1)
    return np.where(union == 0, 1.0, inter / np.maximum(union, 1)).astype(np.float64)


def mask_iou(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray], *,
             output: str | None = None, threshold: float = 0.5) -> float:
    """Mean over samples of the binary-mask IoU (see :func:`mask_iou_per_sample`).

    Args:
        reference: Reference outputs (name -> array).
        candidate: Candidate outputs (name -> array).
        output: Output holding the map (default: first output).
        threshold: Binarization threshold (default 0.5; PP-OCR det uses 0.3).

    Returns:
        Mean IoU in [0, 1]; 1.0 when every binarized sample is identical.

    Raises:
        MetricError: Missing output, shape mismatch or empty map.
    """
    ref, cand = select_pair(reference, candidate, output, role="mask")
    return float(np.mean(mask_iou_per_sample(ref, cand, threshold)))
