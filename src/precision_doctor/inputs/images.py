"""Decode images with Pillow and turn them into model tensors with a ``PreprocessSpec``.

Decoding: ``PIL.Image.open`` + full ``load()`` (so a truncated file fails here, naming the file),
EXIF orientation applied only when ``spec.exif`` is set, then ``convert("RGB")``: grayscale is
replicated to 3 channels, palette images are expanded, and an alpha channel is dropped (the
``torchvision`` ``pil_loader`` behaviour). 16-bit and float images are refused: save them as
.npy with the exact values the model expects.

Resizing: Pillow filters, and ``cv2-linear`` (what PaddleOCR/RapidOCR use) with OpenCV's own
``cv2.resize(INTER_LINEAR)`` when OpenCV is installed (it comes with ``rapidocr_onnxruntime``).
Without OpenCV a Pillow affine transform with the same semantics stands in; OpenCV's 11-bit
fixed-point interpolation rounds differently, so single pixels then differ by one 8-bit level
(1/127.5 after PP-OCR's normalisation), which moves a DB text box by a pixel now and then. A
``CV2FallbackWarning`` says so once.
"""

from __future__ import annotations

import functools
import importlib.util
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from precision_doctor.errors import DataFormatError, InputNameError
from precision_doctor.inputs.feeds import Sample, check_sample, is_dynamic_dim
from precision_doctor.inputs.preprocess import PreprocessSpec, parse_preprocess
from precision_doctor.inputs.resize import LETTERBOX_GRAY, ResizePlan, plan_resize
from precision_doctor.runners.base import TensorMeta

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")

_FILTERS = {
    "nearest": Image.Resampling.NEAREST, "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC, "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX, "hamming": Image.Resampling.HAMMING,
}
_HIGH_DEPTH_MODES = ("I", "F", "I;16", "I;16B", "I;16L", "I;16N")


class SkippedImageWarning(UserWarning):
    """An image was skipped because it does not decode (only with ``skip_bad=True``)."""


def decode_image(path: str | Path, exif: bool = False) -> Image.Image:
    """Read an image file fully and return it as 8-bit RGB.

    Args:
        path: Image file (any format Pillow reads).
        exif: Apply the EXIF orientation tag.

    Returns:
        A loaded ``PIL.Image.Image`` in mode ``RGB``.

    Raises:
        DataFormatError: The file is missing, not an image, truncated/corrupt, or 16-bit/float.
    """
    p = Path(path)
    try:
        with Image.open(p) as opened:
            opened.load()
            image = ImageOps.exif_transpose(opened) if exif else opened.copy()
    except FileNotFoundError as exc:
        raise DataFormatError(f"image not found: {p}", file=str(p)) from exc
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise DataFormatError(
            f"{p}: cannot decode the image ({exc}); the file is corrupt, truncated or not an "
            "image. Remove it or re-export it.", file=str(p)) from exc
    if image.mode in _HIGH_DEPTH_MODES:
        raise DataFormatError(
            f"{p}: {image.mode} images (16-bit or float) are not decoded to 8 bits silently; "
            "save the exact tensor as .npy instead", file=str(p))
    return image if image.mode == "RGB" else image.convert("RGB")


class CV2FallbackWarning(UserWarning):
    """``cv2-linear`` resizing without OpenCV: Pillow stands in, +-1 level on some pixels."""


@functools.lru_cache(maxsize=1)
def _cv2():
    if importlib.util.find_spec("cv2") is None:
        warnings.warn("OpenCV is not installed: cv2-linear resizing uses Pillow, which differs "
                      "from cv2.resize by one 8-bit level on some pixels; pip install "
                      "opencv-python-headless for bit-exact PaddleOCR/RapidOCR inputs",
                      CV2FallbackWarning, stacklevel=3)
        return None
    import cv2

    return cv2


def _resize(image: Image.Image, size_hw: tuple[int, int], interpolation: str) -> Image.Image:
    h, w = size_hw
    if (image.height, image.width) == (h, w):
        return image
    if interpolation == "cv2-linear" and _cv2() is not None:
        pixels = _cv2().resize(np.asarray(image), (w, h), interpolation=_cv2().INTER_LINEAR)
        return Image.fromarray(pixels)
    if interpolation == "cv2-linear":
        # Affine map with half-pixel centers and a 2x2 bilinear kernel, no antialiasing: the
        # semantics of OpenCV cv2.resize(INTER_LINEAR) that PaddleOCR/RapidOCR use.
        coeffs = (image.width / w, 0.0, 0.0, 0.0, image.height / h, 0.0)
        return image.transform((w, h), Image.Transform.AFFINE, coeffs,
                               resample=Image.Resampling.BILINEAR)
    return image.resize((w, h), resample=_FILTERS[interpolation])


def image_to_tensor(image: Image.Image, spec: PreprocessSpec, name: str = "image") -> np.ndarray:
    """Apply ``spec`` to a decoded RGB image.

    Args:
        image: 8-bit RGB image (from ``decode_image``).
        spec: Preprocessing spec.
        name: For error messages.

    Returns:
        Array of shape (1, 3, H, W) for ``nchw`` or (1, H, W, 3) for ``nhwc``, dtype
        ``spec.dtype``; values ``(pixel * scale - mean) / std`` (computed in float64).

    Raises:
        InputError: The crop does not fit the resized image.
    """
    plan: ResizePlan = plan_resize(image.height, image.width, spec, name)
    image = _resize(image, plan.resized, spec.interpolation)
    pixels = np.asarray(image, dtype=np.uint8)
    if plan.crop is not None:
        top, left, ch, cw = plan.crop
        pixels = pixels[top:top + ch, left:left + cw]
    if spec.resize == "letterbox" and plan.canvas is not None:
        board = np.full((*plan.canvas, 3), LETTERBOX_GRAY, np.uint8)
        board[plan.offset[0]:plan.offset[0] + pixels.shape[0],
              plan.offset[1]:plan.offset[1] + pixels.shape[1]] = pixels
        pixels = board
    if spec.order == "bgr":
        pixels = pixels[..., ::-1]
    mean = np.asarray(spec.mean, dtype=np.float64)
    std = np.asarray(spec.std, dtype=np.float64)
    values = (pixels.astype(np.float64) * spec.scale - mean) / std
    if plan.canvas is not None and spec.resize == "height":
        canvas = np.full((plan.canvas[0], plan.canvas[1], 3), spec.pad_value, dtype=np.float64)
        canvas[:, :values.shape[1]] = values
        values = canvas
    if spec.dtype == "uint8":
        tensor = np.clip(np.rint(values), 0, 255).astype(np.uint8)
    else:
        tensor = values.astype(spec.dtype)
    if spec.layout == "nchw":
        tensor = tensor.transpose(2, 0, 1)
    return np.ascontiguousarray(tensor[np.newaxis])


def image_input(inputs: Sequence[TensorMeta]) -> TensorMeta:
    """The model input an image feeds: the only input, or the only rank-4 input.

    Raises:
        InputNameError: The model has several inputs and they are not all fed by one image.
    """
    if len(inputs) == 1:
        return inputs[0]
    candidates = [m for m in inputs if len(m.shape) == 4]
    names = [m.name for m in inputs]
    raise InputNameError(
        f"images can feed a model with a single image input; this model has inputs {names}"
        + (f" ({len(candidates)} of rank 4)" if candidates else "")
        + ". Save complete feeds as .npz (one key per input) or Polygraphy JSON instead.")


def _layout_hint(meta: TensorMeta, spec: PreprocessSpec) -> str:
    shape = tuple(meta.shape)
    if len(shape) != 4:
        return ""
    hints = []
    if spec.layout == "nchw" and not is_dynamic_dim(shape[3]) and int(shape[3]) in (1, 3, 4):
        hints.append("the model looks NHWC: add layout=nhwc")
    if spec.layout == "nhwc" and not is_dynamic_dim(shape[1]) and int(shape[1]) in (1, 3, 4):
        hints.append("the model looks NCHW: use layout=nchw")
    spatial = shape[2:] if spec.layout == "nchw" else shape[1:3]
    if all(not is_dynamic_dim(d) for d in spatial):
        hints.append(f"the model wants {spatial[0]}x{spatial[1]} images: e.g. "
                     f"size={spatial[0]}x{spatial[1]}")
    return (" Hint: " + "; ".join(hints) + ".") if hints else ""


def load_images(paths: Sequence[str | Path], inputs: Sequence[TensorMeta],
                preprocess: PreprocessSpec | str, skip_bad: bool = False
                ) -> tuple[list[Sample], list[str]]:
    """One sample (batch 1) per image file, in the given order.

    Args:
        paths: Image files.
        inputs: Model inputs (one image input; see ``image_input``).
        preprocess: Spec or its text form (see ``parse_preprocess``).
        skip_bad: Skip images that do not decode instead of raising; each skip also emits a
            ``SkippedImageWarning``.

    Returns:
        (samples, skipped): samples named by file name, with ``source_size`` the decoded
        image's (height, width); skipped holds one message per skipped
        file (empty unless ``skip_bad``).

    Raises:
        DataFormatError: An image does not decode (unless ``skip_bad``).
        InputNameError: The model does not have exactly one image input.
        InputShapeError: The tensor does not fit the model input (message hints at layout/size).
    """
    spec = parse_preprocess(preprocess)
    meta = image_input(inputs)
    samples: list[Sample] = []
    skipped: list[str] = []
    for path in paths:
        p = Path(path)
        try:
            image = decode_image(p, exif=spec.exif)
        except DataFormatError as exc:
            if not skip_bad:
                raise
            skipped.append(str(exc))
            warnings.warn(str(exc), SkippedImageWarning, stacklevel=2)
            continue
        tensor = image_to_tensor(image, spec, name=p.name)
        hint = f" (preprocessing: {spec}).{_layout_hint(meta, spec)}"
        spatial = tensor.shape[2:4] if spec.layout == "nchw" else tensor.shape[1:3]
        samples.append(check_sample(
            p.name, {meta.name: tensor}, inputs, str(p), hint,
            source_size=(image.height, image.width), input_size=(int(spatial[0]),
                                                                 int(spatial[1])),
            input_box=plan_resize(image.height, image.width, spec, p.name).image_box()))
    return samples, skipped
