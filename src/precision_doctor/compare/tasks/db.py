"""Text-box agreement of DB text detectors: decode both probability maps into boxes, compare.

A DB ("Differentiable Binarization", Liao et al., AAAI 2020) detector such as PP-OCR det outputs
a ``[N, 1, H, W]`` text-probability map. The OCR client turns it into boxes with
``DBPostProcess``: binarize at ``thresh``, dilate 2x2, trace contours, take each contour's
minimum-area rectangle, drop it when the mean probability inside is below ``box_thresh``, expand
it by ``unclip_ratio`` (Vatti clipping) and take the rectangle again. Mask IoU cannot see what
matters there: one pixel flipped at a contour's convex-hull corner moves a box edge while the IoU
stays at 0.9999.

This metric runs the client's own post-processing (the ``DBPostProcess`` of
``rapidocr_onnxruntime``, PaddleOCR's code, defaults of RapidOCR 1.4.4 ``config.yaml``: thresh 0.3,
box_thresh 0.5, unclip_ratio 1.6, dilation on) on both maps. When the sample's source image size
is known (image inputs; passed as ``source_size``), boxes are compared as the client returns
them: ``round(box * source_size / map_size)``, integer source pixels. Otherwise they are compared
as floats in map pixels, before that rounding: boxes equal as floats are identical after any
resize back to any source image.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from precision_doctor.compare.tasks.io import select_pair
from precision_doctor.errors import MetricError

_INSTALL_HINT = ("the db-boxes metric runs the OCR client's own DB post-processing; install it "
                 "with pip install \"precision-doctor[demo]\" (rapidocr_onnxruntime, which brings "
                 "opencv-python and pyclipper)")


@functools.cache
def _client_filter() -> Any:
    """RapidOCR's ``TextDetector.filter_tag_det_res`` (order corners, clip, drop boxes <= 3 px),
    or None when the installed client has no such step. Its methods use no instance state, so
    an uninitialised instance (no ONNX session) is enough."""
    try:
        from rapidocr_onnxruntime.ch_ppocr_det.text_detect import TextDetector
    except ImportError:
        return None
    method = getattr(TextDetector, "filter_tag_det_res", None)
    return None if method is None else functools.partial(method, TextDetector.__new__(TextDetector))


@functools.cache
def _db_postprocess(thresh: float, box_thresh: float, unclip_ratio: float, dilation: bool,
                    max_candidates: int) -> Any:
    try:
        from rapidocr_onnxruntime.ch_ppocr_det.utils import DBPostProcess
    except ImportError:
        try:
            from rapidocr.ch_ppocr_det.utils import DBPostProcess  # rapidocr >= 2
        except ImportError as exc:
            raise MetricError(_INSTALL_HINT) from exc
    post = DBPostProcess(thresh=thresh, box_thresh=box_thresh, max_candidates=max_candidates,
                         unclip_ratio=unclip_ratio, score_mode="fast", use_dilation=dilation)
    for method in ("get_mini_boxes", "box_score_fast", "unclip"):
        if not callable(getattr(post, method, None)):
            raise MetricError(f"the installed DBPostProcess has no {method}(); "
                              f"{_INSTALL_HINT} (version 1.4.x)")
    return post


def db_boxes_from_map(prob_map: np.ndarray, *, threshold: float = 0.3, box_thresh: float = 0.5,
                      unclip_ratio: float = 1.6, dilation: bool = True,
                      max_candidates: int = 1000) -> np.ndarray:
    """Text boxes of one DB probability map, as floats in map pixels (before source rounding).

    Mirrors ``DBPostProcess.boxes_from_bitmap`` of RapidOCR 1.4.4 / PaddleOCR step by step,
    calling the client's own ``get_mini_boxes``, ``box_score_fast`` and ``unclip``; only the last
    step (``np.round(box / map_size * source_size)``) is left out.

    Args:
        prob_map: Probability map, ``[H, W]``, ``[1, H, W]`` or ``[1, 1, H, W]``, float.
        threshold: Binarization threshold (``pred > threshold``).
        box_thresh: Minimum mean probability inside a box.
        unclip_ratio: Box expansion ratio.
        dilation: Dilate the binary mask with a 2x2 kernel first (RapidOCR: on).
        max_candidates: At most this many contours are considered.

    Returns:
        ``float32`` array ``[K, 4, 2]`` of box corners (x, y) in the client's corner order, in
        contour order (float32 as in the client, so that its rounding can be reproduced).

    Raises:
        MetricError: The map is not 2-d after dropping leading unit axes, or the post-processing
            library is not installed.
    """
    import cv2  # comes with rapidocr_onnxruntime (opencv-python)

    post = _db_postprocess(float(threshold), float(box_thresh), float(unclip_ratio),
                           bool(dilation), int(max_candidates))
    pred = np.asarray(prob_map, dtype=np.float32)
    while pred.ndim > 2 and pred.shape[0] == 1:
        pred = pred[0]
    if pred.ndim != 2:
        raise MetricError(f"db-boxes needs one [1, 1, H, W] probability map per sample, got "
                          f"shape {np.shape(prob_map)}")
    pred = np.where(np.isnan(pred), np.float32(0.0), pred)  # NaN is no text, not a crash
    bitmap = (pred > threshold).astype(np.uint8)
    if dilation:
        bitmap = np.asarray(cv2.dilate(bitmap, np.ones((2, 2), dtype=np.uint8)), np.uint8)
    contours = cv2.findContours(bitmap * 255, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)[-2]
    boxes = []
    for contour in contours[:max_candidates]:
        points, short_side = post.get_mini_boxes(contour)
        if short_side < post.min_size:
            continue
        if box_thresh > post.box_score_fast(pred, np.asarray(points).reshape(-1, 2)):
            continue
        box, short_side = post.get_mini_boxes(post.unclip(np.asarray(points)).reshape(-1, 1, 2))
        if short_side < post.min_size + 2:
            continue
        boxes.append(np.asarray(box))
    return np.asarray(boxes, dtype=np.float32).reshape(-1, 4, 2)


def boxes_to_source(boxes: np.ndarray, map_size: tuple[int, int],
                    source_size: tuple[int, int]) -> np.ndarray:
    """The client's last step: map pixels to integer source-image pixels.

    ``clip(round(x / map_w * src_w), 0, src_w)`` (and y alike), in float32 as
    ``DBPostProcess.boxes_from_bitmap`` of RapidOCR 1.4.4 / PaddleOCR computes it.

    Args:
        boxes: ``[K, 4, 2]`` float32 boxes from :func:`db_boxes_from_map`.
        map_size: ``(H, W)`` of the probability map.
        source_size: ``(height, width)`` of the source image.

    Returns:
        ``int32`` array ``[K, 4, 2]``; then, as RapidOCR's ``TextDetector`` does before
        recognition, corners ordered clockwise, clipped to the image and boxes of width or
        height <= 3 px dropped (these are never read).
    """
    out = np.array(boxes, dtype=np.float32, copy=True)
    (map_h, map_w), (src_h, src_w) = map_size, (int(source_size[0]), int(source_size[1]))
    out[..., 0] = np.clip(np.round(out[..., 0] / map_w * src_w), 0, src_w)
    out[..., 1] = np.clip(np.round(out[..., 1] / map_h * src_h), 0, src_h)
    out = out.astype(np.int32)
    keep = _client_filter()
    if keep is None or len(out) == 0:
        return out
    return np.asarray(keep(out, (src_h, src_w)), dtype=np.int32).reshape(-1, 4, 2)


def match_boxes(reference: np.ndarray, candidate: np.ndarray, tolerance_px: float = 0.0) -> int:
    """How many reference boxes have a candidate box within ``tolerance_px`` (one-to-one).

    Two boxes match when every corner coordinate differs by at most ``tolerance_px`` (0: equal
    floats). Pairs are taken greedily in order of that largest difference; contour order may
    differ between the two maps, so position, not index, decides.

    Args:
        reference: ``[K, 4, 2]`` boxes.
        candidate: ``[M, 4, 2]`` boxes.
        tolerance_px: Largest corner difference of a match, in map pixels.

    Returns:
        Number of matched pairs (<= min(K, M)).
    """
    if len(reference) == 0 or len(candidate) == 0:
        return 0
    ref = np.asarray(reference, dtype=np.float64)
    cand = np.asarray(candidate, dtype=np.float64)
    diff = np.abs(ref[:, None] - cand[None]).max(axis=(2, 3))  # [K, M]
    pairs = sorted(zip(*np.nonzero(diff <= tolerance_px)), key=lambda ij: (diff[ij], ij))
    used_ref: set[int] = set()
    used_cand: set[int] = set()
    for i, j in pairs:
        if i not in used_ref and j not in used_cand:
            used_ref.add(int(i))
            used_cand.add(int(j))
    return len(used_ref)


def db_boxes(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray], *,
             output: str | None = None, threshold: float = 0.3, box_thresh: float = 0.5,
             unclip_ratio: float = 1.6, dilation: bool = True, max_candidates: int = 1000,
             tolerance_px: float = 0.0, source_size: tuple[int, int] | None = None) -> float:
    """Share of text boxes the candidate reproduces, mean over samples.

    Per sample: ``matched / max(K, M)`` (K reference boxes, M candidate boxes, matched by
    :func:`match_boxes`), so a missing box and an extra box both count; two maps without boxes
    score 1.0. With ``tolerance_px=0`` (default) 1.0 means the OCR client returns the same boxes:
    on that source image when ``source_size`` is known, on any source image otherwise.

    Args:
        reference: Reference outputs (name -> array ``[N, 1, H, W]``).
        candidate: Candidate outputs.
        output: Output holding the map (default: first output).
        threshold, box_thresh, unclip_ratio, dilation, max_candidates: ``DBPostProcess``
            options (defaults: RapidOCR 1.4.4 ``config.yaml``).
        tolerance_px: Largest corner difference that still counts as the same box, in source
            pixels when ``source_size`` is given, else map pixels.
        source_size: ``(height, width)`` of the source image (per-sample context, filled in
            from image samples; not a spec option). The client's rounding to it is applied.

    Returns:
        Mean share in [0, 1].

    Raises:
        MetricError: Missing output, shape mismatch, a map that is not ``[N, 1, H, W]``, or the
            post-processing library is missing (with the install command).
    """
    ref, cand = select_pair(reference, candidate, output, role="probability map")
    if ref.ndim == 2:
        ref, cand = ref[None], cand[None]
    def boxes(prob_map: np.ndarray) -> np.ndarray:
        return db_boxes_from_map(prob_map, threshold=threshold, box_thresh=box_thresh,
                                 unclip_ratio=unclip_ratio, dilation=dilation,
                                 max_candidates=max_candidates)

    shares = []
    for ref_map, cand_map in zip(ref, cand):
        a, b = boxes(ref_map), boxes(cand_map)
        if source_size is not None:
            map_size = tuple(np.shape(ref_map)[-2:])
            a, b = boxes_to_source(a, map_size, source_size), boxes_to_source(b, map_size,
                                                                           source_size)
        total = max(len(a), len(b))
        shares.append(1.0 if total == 0 else match_boxes(a, b, tolerance_px) / total)
    return float(np.mean(shares))
