"""Bring an input tensor into one canonical form, (C, H, W) float64, and say how.

Layout is read from the shape: after dropping a leading batch dim (rank 4), the axis of size
1, 3 or 4 (gray, RGB, RGBA) is the channel axis; ``CHW`` when it comes first, ``HWC`` when it
comes last. A shape where both or neither end looks like channels is ambiguous; the pair is then
resolved by ``canonicalize_pair`` with the layout that makes the spatial sizes of both tensors
agree (and otherwise the same layout for both, NCHW first: the ONNX convention).

Also here: the trailing constant border that padding pipelines add (PaddleOCR ``resize_norm_img``
pads the right side of a text line with 0), and resampling to a common size (Pillow mode ``F``,
bilinear, antialiased when shrinking: ``PIL.Image.resize`` documentation).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import numpy as np
from PIL import Image

from precision_doctor.errors import InputShapeError

CHANNEL_SIZES = (1, 3, 4)
MIN_PAD = 2  # lines: a single constant last column is as likely a blank margin as padding
_NAMES = {(0, 1, 2): "chw", (2, 0, 1): "hwc"}


@dataclass(frozen=True)
class Canonical:
    """One tensor in canonical form.

    Attributes:
        chw: (C, H, W) float64 values of the first batch entry.
        layout: ``nchw``/``nhwc`` (rank 4), ``chw``/``hwc`` (rank 3), ``hw`` (rank 2) or
            ``flat`` (other ranks, compared as one row).
        axes: Axes of the batch-free array that give ``chw`` (``np.transpose`` order).
        dtype: Original dtype name.
        shape: Original shape.
        batch: Leading batch size (1 when the tensor has no batch dim); only entry 0 is used.
        ambiguous: Both ends of the shape look like channels (or neither): layout was chosen
            by ``canonicalize_pair``.
    """

    chw: np.ndarray
    layout: str
    axes: tuple[int, ...]
    dtype: str
    shape: tuple[int, ...]
    batch: int = 1
    ambiguous: bool = False

    @property
    def channels(self) -> int:
        return int(self.chw.shape[0])

    @property
    def spatial(self) -> tuple[int, int]:
        return int(self.chw.shape[1]), int(self.chw.shape[2])


def _as_float64(arr: np.ndarray, name: str) -> np.ndarray:
    if arr.dtype.kind not in "fiub" and arr.dtype.kind != "V":
        raise InputShapeError(f"{name}: dtype {arr.dtype} is not numeric; forensics compares "
                              "image-like numeric tensors", input=name)
    return np.asarray(arr, dtype=np.float64)


def _layout_options(core: np.ndarray) -> tuple[list[tuple[int, int, int]], bool]:
    """Candidate CHW axis orders of a rank-3 array, best first, and whether it is ambiguous."""
    first, last = core.shape[0] in CHANNEL_SIZES, core.shape[2] in CHANNEL_SIZES
    if first and not last:
        return [(0, 1, 2)], False
    if last and not first:
        return [(2, 0, 1)], False
    return [(0, 1, 2), (2, 0, 1)], True


def _split_batch(arr: np.ndarray) -> tuple[np.ndarray, int, bool]:
    """The first batch entry of a rank-4 array (and the batch size), else the array itself."""
    if arr.ndim == 4:
        return arr[0], int(arr.shape[0]), True
    return arr, 1, False


def canonical_options(arr: np.ndarray, name: str = "tensor") -> list[Canonical]:
    """Every plausible canonical form of ``arr``, most likely first.

    Args:
        arr: Any numeric array: (N, C, H, W), (N, H, W, C), (C, H, W), (H, W, C), (H, W) or
            other ranks (compared flat).
        name: For error messages.

    Returns:
        One ``Canonical`` per candidate layout (two when the layout is ambiguous).

    Raises:
        InputShapeError: Non-numeric dtype or an empty array.
    """
    arr = np.asarray(arr)
    if arr.size == 0:
        raise InputShapeError(f"{name}: the tensor is empty (shape {list(arr.shape)})",
                              input=name)
    values = _as_float64(arr, name)
    core, batch, has_batch = _split_batch(values)
    dtype, shape = str(arr.dtype), tuple(int(d) for d in arr.shape)
    if core.ndim == 2:
        return [Canonical(core[np.newaxis], "hw", (0, 1), dtype, shape, batch)]
    if core.ndim != 3:
        flat = core.reshape(1, 1, -1)
        return [Canonical(flat, "flat", tuple(range(core.ndim)), dtype, shape, batch)]
    options, ambiguous = _layout_options(core)
    prefix = "n" if has_batch else ""
    return [Canonical(np.ascontiguousarray(core.transpose(axes)), prefix + _NAMES[axes], axes,
                      dtype, shape, batch, ambiguous) for axes in options]


def canonicalize_pair(a: np.ndarray, b: np.ndarray) -> tuple[Canonical, Canonical]:
    """Canonical forms of A and B, resolving ambiguous layouts jointly.

    Preference, in order: both layouts unambiguous as read; equal spatial sizes; equal
    channel counts; equal layouts; the first (NCHW) option.

    Raises:
        InputShapeError: As ``canonical_options``.
    """
    options_a, options_b = canonical_options(a, "A"), canonical_options(b, "B")

    def cost(pair: tuple[Canonical, Canonical]) -> tuple[int, int, int, int]:
        ca, cb = pair
        return (int(ca.spatial != cb.spatial), int(ca.channels != cb.channels),
                int(ca.axes != cb.axes), options_a.index(ca) + options_b.index(cb))

    return min(product(options_a, options_b), key=cost)


def reinterpret_memory(arr: np.ndarray, canon: Canonical) -> np.ndarray | None:
    """Read the memory of ``arr`` as the *other* layout, for a buffer reshaped, not transposed.

    A (C, H, W)-shaped tensor whose bytes were written in H, W, C order (``reshape`` instead of
    ``transpose``) looks like noise; reading its flat buffer as (H, W, C) recovers the image.

    Returns:
        (C, H, W) float64 of the reinterpreted first batch entry, or None for non-image
        layouts.
    """
    core, _, _ = _split_batch(np.asarray(arr, dtype=np.float64))
    if core.ndim != 3 or canon.layout in ("hw", "flat"):
        return None
    c, h, w = canon.chw.shape
    flat = np.ascontiguousarray(core).reshape(-1)
    if canon.axes == (0, 1, 2):  # CHW-shaped buffer holding HWC data
        return np.ascontiguousarray(flat.reshape(h, w, c).transpose(2, 0, 1))
    return np.ascontiguousarray(flat.reshape(c, h, w))  # HWC-shaped buffer holding CHW data


@dataclass(frozen=True)
class Padding:
    """A trailing constant border (bottom rows, right columns).

    Attributes:
        content: (H, W) of the region before the border.
        value: Per-channel value of the border (empty tuple when there is none).
    """

    content: tuple[int, int]
    value: tuple[float, ...] = ()

    @property
    def padded(self) -> bool:
        return bool(self.value)


def find_padding(chw: np.ndarray) -> Padding:
    """The trailing constant border of a (C, H, W) tensor, if any.

    The border is the run of right columns, then bottom rows, whose every value equals the
    bottom-right pixel (all channels). A run needs at least ``MIN_PAD`` lines; images smaller
    than 4x4 and constant images have no border (nothing to trim).

    Args:
        chw: (C, H, W) values.

    Returns:
        ``Padding``: the content size and the border value.
    """
    _, h, w = chw.shape
    if h < 4 or w < 4:
        return Padding((h, w))
    corner = chw[:, -1, -1][:, None, None]
    same = np.all(chw == corner, axis=0)  # (H, W)
    cols = np.all(same, axis=0)
    pad_w = int(np.argmin(cols[::-1])) if not cols.all() else w
    rows = np.all(same[:, : w - pad_w], axis=1) if pad_w < w else np.ones(h, bool)
    pad_h = int(np.argmin(rows[::-1])) if not rows.all() else h
    pad_w, pad_h = (pad_w if pad_w >= MIN_PAD else 0), (pad_h if pad_h >= MIN_PAD else 0)
    if pad_w >= w or pad_h >= h or (pad_w == 0 and pad_h == 0):
        return Padding((h, w))
    return Padding((h - pad_h, w - pad_w), tuple(float(v) for v in chw[:, -1, -1]))


def resample(chw: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize every channel of a (C, H, W) array to ``size`` = (H, W) (Pillow bilinear, float).

    Returns:
        (C, size[0], size[1]) float64.
    """
    if chw.shape[1:] == tuple(size):
        return chw
    h, w = size
    planes = [np.asarray(Image.fromarray(plane.astype(np.float32))
                         .resize((w, h), Image.Resampling.BILINEAR), dtype=np.float64)
              for plane in chw]
    return np.stack(planes)
