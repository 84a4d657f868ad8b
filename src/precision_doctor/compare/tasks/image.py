"""Image agreement for image-to-image models (restoration, super-resolution, depth, flow) and
for probability maps (segmentation, text detection).

* PSNR in dB: ``10 * log10(L**2 / MSE)``, MSE pooled over every element of the output
  (as ``skimage.metrics.peak_signal_noise_ratio``).
* SSIM: Wang, Bovik, Sheikh and Simoncelli, "Image Quality Assessment: From Error Visibility to
  Structural Similarity", IEEE TIP 13(4), 2004, eq. (13), with the authors' reference settings
  (``ssim_index.m``): 11x11 Gaussian window, sigma 1.5, K1 = 0.01, K2 = 0.03, "valid" filtering,
  population (not sample) statistics, the mean of the SSIM map. Each 2-D plane (one channel of
  one image) is scored and the planes are averaged. No automatic downsampling.
* Binary-mask IoU (segmentation, text detection): both maps binarized at ``threshold``.
  PP-OCR's detector outputs a ``[N, 1, H, W]`` probability map that PaddleOCR's
  ``DBPostProcess`` binarizes with ``pred > thresh``, ``thresh = 0.3`` (PaddleOCR
  ``ppocr/postprocess/db_postprocess.py``); use ``mask-iou:threshold=0.3`` for it.

``L`` (``data_range``) defaults to the reference's ``max - min``; set it to the nominal range
(1.0, 255) when you know it, so that PSNR/SSIM match published numbers.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from precision_doctor.compare.tasks.io import select_pair
from precision_doctor.errors import MetricError

SSIM_WINDOW = 11
SSIM_SIGMA = 1.5
SSIM_K1 = 0.01
SSIM_K2 = 0.03
LAYOUTS = ("nchw", "nhwc")


def _data_range(ref: np.ndarray, data_range: float | None) -> float:
    if data_range is not None:
        if not data_range > 0:
            raise MetricError(f"data_range must be > 0, got {data_range}")
        return float(data_range)
    span = float(np.max(ref) - np.min(ref)) if ref.size else 0.0
    if not span > 0:
        raise MetricError("the reference image is constant (or empty), so its range cannot be "
                          "the PSNR/SSIM data range; pass data_range=1.0 (or 255)")
    return span


def _planes(arr: np.ndarray, layout: str) -> np.ndarray:
    """``[S, P, H, W]``: samples, 2-D planes per sample, height, width."""
    if layout not in LAYOUTS:
        raise MetricError(f"layout={layout!r} is not one of {', '.join(LAYOUTS)}")
    if layout == "nhwc":
        if arr.ndim < 3:
            raise MetricError(f"layout=nhwc needs [H, W, C] or [N, H, W, C], got {arr.shape}")
        arr = np.moveaxis(arr, -1, -3)
    if arr.ndim < 2:
        raise MetricError(f"image metrics need at least a 2-D output, got shape {arr.shape}")
    if arr.ndim == 2 or (layout == "nhwc" and arr.ndim == 3):
        arr = arr[None]
    return arr.reshape(arr.shape[0], -1, arr.shape[-2], arr.shape[-1])


def psnr_per_sample(reference_image: np.ndarray, candidate_image: np.ndarray,
                    data_range: float | None = None, layout: str = "nchw") -> np.ndarray:
    """PSNR in dB of each sample (axis 0; a single image is one sample).

    Formula: ``10 * log10(L**2 / mean((ref - cand)**2))``; ``inf`` for identical samples and
    ``-inf`` for a candidate sample containing NaN or Inf.

    Args:
        reference_image: Float image(s) ``[N, C, H, W]`` / ``[N, H, W, C]`` / ``[H, W]`` ...
        candidate_image: Same shape.
        data_range: ``L``; default the reference's ``max - min`` over all samples.
        layout: ``nchw`` (default) or ``nhwc``; decides what a sample is.

    Returns:
        ``[N]`` float64 dB.

    Raises:
        MetricError: Constant reference without ``data_range``, or bad layout.
    """
    ref = np.asarray(reference_image, dtype=np.float64)
    cand = np.asarray(candidate_image, dtype=np.float64)
    peak = _data_range(ref, data_range)
    r, c = _planes(ref, layout), _planes(cand, layout)
    mse = np.mean((r - c) ** 2, axis=(1, 2, 3))
    with np.errstate(divide="ignore"):
        out = 10.0 * np.log10(peak**2 / mse)
    return np.where(np.isfinite(c).all(axis=(1, 2, 3)), out, -np.inf)


def psnr(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray], *,
         output: str | None = None, data_range: float | None = None) -> float:
    """PSNR in dB over the whole output (MSE pooled over every element).

    Args:
        reference: Reference outputs (name -> array).
        candidate: Candidate outputs.
        output: The image output (default: first output).
        data_range: ``L``; default the reference's ``max - min``.

    Returns:
        dB; ``inf`` when identical, ``-inf`` when the candidate has NaN/Inf. Higher is better.

    Raises:
        MetricError: Missing output, shape mismatch, constant reference without ``data_range``.
    """
    ref, cand = select_pair(reference, candidate, output, role="image")
    ref = ref.astype(np.float64)
    cand = cand.astype(np.float64)
    peak = _data_range(ref, data_range)
    if not np.isfinite(cand).all():
        return -np.inf
    mse = float(np.mean((ref - cand) ** 2))
    return np.inf if mse == 0 else float(10.0 * np.log10(peak**2 / mse))


def gaussian_window(size: int = SSIM_WINDOW, sigma: float = SSIM_SIGMA) -> np.ndarray:
    """Normalized 1-D Gaussian (the 2-D SSIM window is its outer product), ``[size]`` float64."""
    x = np.arange(size, dtype=np.float64) - (size - 1) / 2
    g = np.exp(-(x**2) / (2 * sigma**2))
    return g / g.sum()


def _filter_valid(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Separable 'valid' correlation of the last two axes with ``outer(g, g)`` (shifted sums,
    so memory stays at a few copies of ``x``)."""
    k = len(g)
    w = x.shape[-1] - k + 1
    rows = sum(g[i] * x[..., i:i + w] for i in range(k))
    h = x.shape[-2] - k + 1
    return sum(g[i] * rows[..., i:i + h, :] for i in range(k))


def ssim_per_sample(reference_image: np.ndarray, candidate_image: np.ndarray,
                    data_range: float | None = None, layout: str = "nchw") -> np.ndarray:
    """Mean SSIM of each sample (mean over its 2-D planes of the mean SSIM map).

    Formula (Wang et al. 2004, eq. 13), with Gaussian-weighted local statistics ``mu``,
    ``sigma**2``, ``sigma_xy`` over the 11x11 window::

        SSIM = (2 mu_x mu_y + C1) (2 sigma_xy + C2)
               / ((mu_x^2 + mu_y^2 + C1) (sigma_x^2 + sigma_y^2 + C2)),
        C1 = (K1 L)^2,  C2 = (K2 L)^2

    A candidate sample containing NaN or Inf scores 0.0 (no structural similarity).

    Args:
        reference_image: Float image(s), as :func:`psnr_per_sample`; height and width >= 11.
        candidate_image: Same shape.
        data_range: ``L``; default the reference's ``max - min`` over all samples.
        layout: ``nchw`` (default) or ``nhwc``.

    Returns:
        ``[N]`` float64 in [-1, 1].

    Raises:
        MetricError: Image smaller than the window, constant reference without ``data_range``,
            or bad layout.
    """
    ref = np.asarray(reference_image, dtype=np.float64)
    cand = np.asarray(candidate_image, dtype=np.float64)
    peak = _data_range(ref, data_range)
    x, y = _planes(ref, layout), _planes(cand, layout)
    if min(x.shape[-2:]) < SSIM_WINDOW:
        raise MetricError(f"SSIM needs images of at least {SSIM_WINDOW}x{SSIM_WINDOW} pixels, "
                          f"got {x.shape[-2]}x{x.shape[-1]}; use psnr instead")
    finite = np.isfinite(y).all(axis=(1, 2, 3))
    y = np.where(np.isfinite(y), y, 0.0)
    g = gaussian_window()
    c1, c2 = (SSIM_K1 * peak) ** 2, (SSIM_K2 * peak) ** 2
    mu_x, mu_y = _filter_valid(x, g), _filter_valid(y, g)
    var_x = _filter_valid(x * x, g) - mu_x**2
    var_y = _filter_valid(y * y, g) - mu_y**2
    cov = _filter_valid(x * y, g) - mu_x * mu_y
    ssim_map = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / (
        (mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2))
    return np.where(finite, ssim_map.mean(axis=(1, 2, 3)), 0.0)


def ssim(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray], *,
         output: str | None = None, data_range: float | None = None,
         layout: str = "nchw") -> float:
    """Mean SSIM over samples (see :func:`ssim_per_sample`).

    Args:
        reference: Reference outputs (name -> array).
        candidate: Candidate outputs.
        output: The image output (default: first output).
        data_range: ``L``; default the reference's ``max - min``.
        layout: ``nchw`` (default) or ``nhwc``.

    Returns:
        SSIM in [-1, 1]; 1.0 when identical.

    Raises:
        MetricError: As :func:`ssim_per_sample`, missing output or shape mismatch.
    """
    ref, cand = select_pair(reference, candidate, output, role="image")
    return float(np.mean(ssim_per_sample(ref, cand, data_range, layout)))


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
