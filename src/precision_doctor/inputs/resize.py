"""Output sizes of the resize modes of ``PreprocessSpec``: pure functions of (h, w) and the spec.

Each formula reproduces the pipeline it is named after, including its integer rounding, so that
the tensors we feed match the ones the deployed pipeline feeds (a preprocessing mismatch is a
root cause we must not introduce ourselves).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from precision_doctor.errors import InputError
from precision_doctor.inputs.preprocess import PreprocessSpec


@dataclass(frozen=True)
class ResizePlan:
    """Where the pixels go.

    Attributes:
        resized: (H, W) the image is resized to (before crop/pad).
        crop: (top, left, H, W) center crop window, or None.
        canvas: (H, W) of the output after padding (``height``, ``letterbox``), or None.
        offset: (top, left) of the resized image on the canvas (``letterbox``).
    """

    resized: tuple[int, int]
    crop: tuple[int, int, int, int] | None = None
    canvas: tuple[int, int] | None = None
    offset: tuple[int, int] = (0, 0)

    def image_box(self) -> tuple[int, int, int, int]:
        """(top, left, height, width) of the whole resized image in the tensor's pixels
        (negative top/left when a crop cut it): a point ``(y, x)`` of the tensor is
        ``((y - top) * h / height, (x - left) * w / width)`` in the source image."""
        top, left = self.offset
        if self.crop is not None:
            top, left = top - self.crop[0], left - self.crop[1]
        return top, left, self.resized[0], self.resized[1]

    @property
    def output(self) -> tuple[int, int]:
        """(H, W) of the tensor's spatial dims."""
        if self.canvas is not None:
            return self.canvas
        if self.crop is not None:
            return self.crop[2], self.crop[3]
        return self.resized


def _round_to_multiple(value: int, multiple: int) -> int:
    # PaddleOCR DetResizeForTest.resize_image_type0: max(int(round(v / 32) * 32), 32), with
    # Python's round (half to even), as RapidOCR 1.4.4 DetPreProcess.resize also does.
    return max(int(round(value / multiple) * multiple), multiple)


def limit_side_size(h: int, w: int, side: int, limit_type: str, multiple: int) -> tuple[int, int]:
    """PaddleOCR ``DetResizeForTest`` (``limit_type`` ``max`` or ``min``) output size.

    Args:
        h, w: Image size in pixels.
        side: ``limit_side_len``.
        limit_type: ``max``: shrink so the long side is <= side (never enlarge); ``min``:
            enlarge so the short side is >= side (never shrink).
        multiple: Both sides are rounded to the nearest multiple (32 for DB detectors).

    Returns:
        (H, W) after rounding.
    """
    ratio = 1.0
    if limit_type == "max" and max(h, w) > side:
        ratio = float(side) / (h if h > w else w)
    elif limit_type == "min" and min(h, w) < side:
        ratio = float(side) / (h if h < w else w)
    return (_round_to_multiple(int(h * ratio), multiple),
            _round_to_multiple(int(w * ratio), multiple))


def short_side_size(h: int, w: int, side: int) -> tuple[int, int]:
    """torchvision ``Resize(side)`` size: short side = side, long side truncated.

    Source: torchvision.transforms.functional ``_compute_resized_output_size``.
    """
    if w <= h:
        return int(side * h / w), side
    return side, int(side * w / h)


def height_canvas(h: int, w: int, spec: PreprocessSpec) -> tuple[int, int]:
    """``height`` mode: (resized width, canvas width), PaddleOCR/RapidOCR ``resize_norm_img``.

    With one image per batch RapidOCR uses ``max_wh_ratio = max(W0 / H0, w / h)``, so the canvas
    is ``int(H0 * max_wh_ratio)`` and the image width ``min(ceil(H0 * w / h), canvas)``.
    """
    height = int(spec.side or 0)
    ratio = w / float(h)
    canvas = max(spec.pad_width or 0, int(height * ratio))
    if spec.max_width is not None:
        canvas = min(canvas, spec.max_width)
    canvas = max(canvas, 1)
    if spec.multiple > 1:
        canvas = int(math.ceil(canvas / spec.multiple) * spec.multiple)
    resized_w = min(int(math.ceil(height * ratio)), canvas)
    return max(resized_w, 1), canvas


LETTERBOX_GRAY = 114  # ultralytics LetterBox padding value (0-255 pixels)


def letterbox(h: int, w: int, size: tuple[int, int]) -> ResizePlan:
    """``letterbox`` mode: ultralytics ``LetterBox(auto=False, scaleup=True, center=True)``.

    ``r = min(H / h, W / w)``; the image is resized to ``(round(h r), round(w r))`` and placed
    at ``top = round((H - nh) / 2 - 0.1)``, ``left = round((W - nw) / 2 - 0.1)`` (ultralytics'
    split of an odd padding) on an ``H x W`` canvas of gray ``LETTERBOX_GRAY``.
    """
    height, width = size
    r = min(height / h, width / w)
    nh, nw = int(round(h * r)), int(round(w * r))
    top = int(round((height - nh) / 2 - 0.1))
    left = int(round((width - nw) / 2 - 0.1))
    return ResizePlan(resized=(nh, nw), canvas=(height, width), offset=(top, left))


def plan_resize(h: int, w: int, spec: PreprocessSpec, name: str = "image") -> ResizePlan:
    """Compute where an h x w image goes under ``spec``.

    Args:
        h, w: Decoded image size in pixels.
        spec: The preprocessing spec.
        name: Image name for error messages.

    Returns:
        The ``ResizePlan``.

    Raises:
        InputError: The crop window is larger than the resized image.
    """
    if spec.resize == "fixed":
        assert spec.size is not None
        resized = spec.size
    elif spec.resize == "short-side":
        resized = short_side_size(h, w, int(spec.side or 0))
    elif spec.resize in ("max-side", "min-side"):
        resized = limit_side_size(h, w, int(spec.side or 0), spec.resize[:3], spec.multiple)
    elif spec.resize == "letterbox":
        assert spec.size is not None
        return letterbox(h, w, spec.size)
    elif spec.resize == "height":
        resized_w, canvas_w = height_canvas(h, w, spec)
        resized = (int(spec.side or 0), resized_w)
        return ResizePlan(resized=resized, canvas=(resized[0], canvas_w))
    else:
        resized = (h, w)
    crop = None
    if spec.crop is not None:
        ch, cw = spec.crop
        if ch > resized[0] or cw > resized[1]:
            raise InputError(
                f"{name}: crop {ch}x{cw} is larger than the resized image "
                f"{resized[0]}x{resized[1]}; resize to at least the crop size first",
                file=name)
        # torchvision center_crop: int(round((size - crop) / 2.0)).
        crop = (int(round((resized[0] - ch) / 2.0)), int(round((resized[1] - cw) / 2.0)), ch, cw)
    return ResizePlan(resized=resized, crop=crop)
