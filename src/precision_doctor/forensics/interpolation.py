"""Tell resampling filters apart when two same-size tensors differ after the value map.

Two statistics of the aligned pair (A already mapped into B's channel order and units):

* *Duplicate lines*: the share of adjacent (non-blank) pixel columns or rows that are exact
  copies. Nearest-neighbour upscaling copies each source column/row f times; smooth filters
  interpolate new ones.
* *Gradient energy ratio* ``E_B / E_A`` with ``E = mean(dx^2) + mean(dy^2)``: a filter that
  averages (bilinear, area, antialiased) lowers it; nearest neighbour and non-antialiased
  downscaling keep aliased detail and raise it.

Thresholds were measured on the PP-OCR crops and pages in ``shared/data/ocr`` with the
``ppocr-rec``/``ppocr-det`` presets (cv2-linear) against ``interpolation=nearest`` and Pillow
``bilinear``: nearest upscales copy 0.15-0.7 of the lines (smooth filters: 0);
differing filters give energy ratios of 1.1-6.8 or 0.55-0.8 (identical filters: 1.000).

When both are equally sharp (e.g. box/area vs bilinear when downscaling), a residual that sits on
the edges of the image still marks a resampling difference; noise or a tone curve would spread
over flat areas as well.
"""

from __future__ import annotations

import numpy as np

from precision_doctor.forensics.result import InputFinding

DUPLICATE_LINES = 0.05    # share of line pairs; identical filters measured 0.0
ENERGY_RATIO = 1.05       # identical filters measured within 1.002
# Residual concentrated on edges: >= 40 % of its energy on the 20 % highest-gradient pixels
# (2x what an edge-independent difference such as noise gives). Measured 0.50-0.90 for
# bicubic/box vs cv2-linear on the PP-OCR crops.
EDGE_FRACTION = 0.2
EDGE_SHARE = 0.4


def duplicate_lines(chw: np.ndarray, mask: np.ndarray) -> float:
    """Share of adjacent columns (or rows, whichever is larger) that are exact copies.

    Only lines with some variation count (a blank margin is equal to its neighbour under any
    filter). Nearest-neighbour upscaling by a factor f copies ~1 - 1/f of the lines.

    Args:
        chw: (C, H, W) values in the tensor's own units (exact equality is unit-free).
        mask: (H, W) bool; its bounding box is examined.
    """
    rows, cols = np.nonzero(mask)
    if rows.size == 0:
        return 0.0
    box = chw[:, rows.min():rows.max() + 1, cols.min():cols.max() + 1]
    shares = []
    for axis in (2, 1):  # columns, then rows
        lines = np.moveaxis(box, axis, 0).reshape(box.shape[axis], -1)
        if lines.shape[0] < 2:
            continue
        varied = np.ptp(lines, axis=1) > 0
        same = np.all(lines[1:] == lines[:-1], axis=1) & varied[1:]
        shares.append(float(same.mean()))
    return max(shares, default=0.0)


def gradient_energy(chw: np.ndarray, mask: np.ndarray) -> float:
    """mean(dx^2) + mean(dy^2) over neighbour pairs inside ``mask``, all channels."""
    mx = mask[:, 1:] & mask[:, :-1]
    my = mask[1:] & mask[:-1]
    dx = np.diff(chw, axis=2)[:, mx]
    dy = np.diff(chw, axis=1)[:, my]
    return float((dx ** 2).mean() if dx.size else 0.0) + float((dy ** 2).mean() if dy.size
                                                              else 0.0)


def interpolation_finding(a_own: np.ndarray, a_mapped: np.ndarray, b: np.ndarray,
                          mask: np.ndarray, residual_rel_std: float) -> InputFinding | None:
    """The interpolation finding for an aligned same-size pair, or None when no filter
    difference shows.

    Args:
        a_own: (C, H, W) A in its own units and channel order (for exact-equality counts).
        a_mapped: (C, H, W) A mapped into B's channel order and units (the fitted affine).
        b: (C, H, W) B.
        mask: (H, W) bool: the compared pixels.
        residual_rel_std: Residual of the affine fit relative to B's standard deviation.

    Returns:
        An ``interpolation`` finding naming the blockier/sharper side, or None (also when the
        residual does not sit on edges: noise or a decoder difference, not resampling).
    """
    lines_a, lines_b = duplicate_lines(a_own, mask), duplicate_lines(b, mask)
    energy_a, energy_b = gradient_energy(a_mapped, mask), gradient_energy(b, mask)
    ratio = energy_b / energy_a if energy_a > 0 else float("inf")
    share = edge_share(a_mapped - b, b, mask)
    evidence = {"duplicate_lines_a": round(lines_a, 4), "duplicate_lines_b": round(lines_b, 4),
                "gradient_energy_ratio_b_over_a": round(ratio, 4),
                "residual_on_edges": round(share, 4),
                "residual_rel_std": round(residual_rel_std, 4)}
    if abs(lines_b - lines_a) > DUPLICATE_LINES:
        blocky, other = ("B", "A") if lines_b > lines_a else ("A", "B")
        return InputFinding(
            "interpolation",
            f"resize interpolation differs: {blocky} is blocky (nearest-neighbour upscaling: "
            f"{max(lines_a, lines_b):.0%} of its pixel rows/columns are exact copies of their "
            f"neighbour); {other} uses a smooth filter (bilinear/bicubic)",
            evidence, confidence=0.9)
    if share < EDGE_SHARE:
        return None
    if ratio > ENERGY_RATIO or ratio < 1 / ENERGY_RATIO:
        sharp, smooth = ("B", "A") if ratio > 1 else ("A", "B")
        factor = ratio if ratio > 1 else 1 / ratio
        confidence = float(min(0.9, 0.5 + abs(np.log(factor))))
        return InputFinding(
            "interpolation",
            f"resize interpolation differs: {sharp} has {factor:.2f}x the gradient energy of "
            f"{smooth} ({sharp}: nearest-neighbour or no antialiasing; {smooth}: a smoother "
            "filter such as bilinear, area or antialiased resize)",
            evidence, confidence=confidence)
    return InputFinding(
        "interpolation",
        f"resampling differs: both are equally sharp but the difference sits on edges "
        f"({share:.0%} of it on the {EDGE_FRACTION:.0%} sharpest pixels): most likely a "
        "different resize kernel or pixel-center convention (align_corners / half-pixel), "
        "or a different image decoder", evidence, confidence=0.5)


def edge_share(residual: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    """Share of the residual energy on the ``EDGE_FRACTION`` pixels of B with the largest
    gradient (``EDGE_FRACTION`` itself when the residual is unrelated to edges).

    Args:
        residual: (C, H, W) mapped A minus B.
        b: (C, H, W) B.
        mask: (H, W) bool: the compared pixels.
    """
    gy, gx = np.gradient(b, axis=(1, 2)) if min(b.shape[1:]) > 1 else (b * 0, b * 0)
    magnitude = np.sqrt((gy ** 2 + gx ** 2).sum(axis=0))[mask]
    energy = (residual ** 2).sum(axis=0)[mask]
    total = float(energy.sum())
    if total == 0 or magnitude.size == 0:
        return 0.0
    cut = np.quantile(magnitude, 1.0 - EDGE_FRACTION)
    return float(energy[magnitude > cut].sum() / total)
