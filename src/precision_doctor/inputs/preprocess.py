"""``PreprocessSpec``: how an image file becomes a model input tensor, as one explicit value.

A wrong preprocessing (channel order, scale, mean/std, layout, resize) is one of the root causes
the tool must be able to name, so the spec is explicit data: a frozen dataclass with a JSON
round-trip and a one-line text form that parses back (``str(spec)``).

The pipeline (applied by ``precision_doctor.inputs.images``), for an 8-bit RGB image ``x``:

1. resize (``resize`` mode, ``interpolation``), then optional center ``crop``;
2. channel ``order`` (``rgb`` as decoded, or ``bgr`` as OpenCV loads);
3. ``y = (x * scale - mean[c]) / std[c]``, computed in float64 and cast to ``dtype``; ``mean`` and
   ``std`` index the channels of the *output* order (PaddleOCR's ``NormalizeImage`` convention:
   its ImageNet mean is applied to a BGR array as written);
4. ``height`` mode only: pad on the right with ``pad_value`` (in the output space, after step 3);
5. ``layout`` ``nchw`` or ``nhwc``, with a leading batch dim of 1.

Text form: a preset name (``imagenet``), ``key=value`` pairs separated by commas
(``size=224x224,layout=nhwc,order=bgr,scale=1/255,mean=0.485/0.456/0.406,std=...``), or
``preset:key=value,...`` (overrides on a preset). ``scale`` accepts a fraction (``1/255``);
``mean``/``std`` take 1 or 3 values separated by ``/``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from precision_doctor.errors import InputError

RESIZE_MODES = ("none", "fixed", "short-side", "max-side", "min-side", "height", "letterbox")
# Pillow's Image.resize filters (antialiased when shrinking), plus ``cv2-linear``: bilinear
# without antialiasing, half-pixel centers, i.e. OpenCV ``cv2.resize`` INTER_LINEAR semantics
# (done with Pillow's affine transform; measured within 1 LSB of OpenCV 5.0 on up- and downscales).
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming", "cv2-linear")
LAYOUTS = ("nchw", "nhwc")
ORDERS = ("rgb", "bgr")
DTYPES = ("float32", "float16", "float64", "uint8")

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_HALF = (0.5, 0.5, 0.5)
_BY_255 = 1.0 / 255.0


@dataclass(frozen=True)
class PreprocessSpec:
    """Image -> tensor preprocessing (see the module docstring for the order of the steps).

    Attributes:
        resize: ``none`` (keep size); ``fixed`` (to ``size`` = (H, W), aspect not kept);
            ``short-side`` (short side = ``side``, long side ``int(side * long / short)``,
            torchvision ``Resize(int)``); ``max-side`` / ``min-side`` (PaddleOCR
            ``DetResizeForTest`` ``limit_type`` max/min: scale so the long side is <= ``side``
            / the short side >= ``side``, never the other way, then round each side to the
            nearest multiple of ``multiple``, at least ``multiple``); ``height`` (PaddleOCR
            ``resize_norm_img``: height = ``side``, width = ceil(side * w / h) capped at the
            canvas width, canvas = max(``pad_width``, int(side * w / h)) capped at
            ``max_width``, rounded up to ``multiple``; padded on the right with ``pad_value``);
            ``letterbox`` (ultralytics ``LetterBox``, how YOLO/RT-DETR exports are fed: scale
            by min(H/h, W/w) keeping the aspect ratio, sides ``round(side * r)``, then pad to
            ``size`` centred with gray 114 pixels, before channel order and normalization).
        size: (H, W) for ``fixed``.
        side: Pixels for the ``short-side``/``max-side``/``min-side``/``height`` modes.
        multiple: Sides (``max-side``/``min-side``) or canvas width (``height``) multiple.
        max_width: ``height`` mode: cap on the canvas and resized width (None = no cap).
        pad_width: ``height`` mode: minimum canvas width (None = no padding).
        crop: (H, W) center crop after resizing (torchvision ``CenterCrop`` offsets).
        interpolation: One of ``INTERPOLATIONS``.
        layout: ``nchw`` or ``nhwc``.
        order: ``rgb`` or ``bgr`` channel order of the tensor.
        scale: Multiplies the 0-255 pixel values first (e.g. 1/255).
        mean: Per output channel (1 value broadcasts), subtracted after scaling.
        std: Per output channel (1 value broadcasts), divides after subtracting the mean.
        dtype: Tensor dtype; ``uint8`` rounds and clips to 0..255.
        exif: Apply the EXIF orientation tag (``ImageOps.exif_transpose``) as ``cv2.imread``
            does; False (default) keeps the stored pixel order as ``PIL.Image.open`` does
            (torchvision, RapidOCR).
        pad_value: Value of padded pixels in the output (normalized) space.
    """

    resize: str = "none"
    size: tuple[int, int] | None = None
    side: int | None = None
    multiple: int = 1
    max_width: int | None = None
    pad_width: int | None = None
    crop: tuple[int, int] | None = None
    interpolation: str = "bilinear"
    layout: str = "nchw"
    order: str = "rgb"
    scale: float = 1.0
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    dtype: str = "float32"
    exif: bool = False
    pad_value: float = 0.0

    def __post_init__(self) -> None:
        _check_choice("resize", self.resize, RESIZE_MODES)
        _check_choice("interpolation", self.interpolation, INTERPOLATIONS)
        _check_choice("layout", self.layout, LAYOUTS)
        _check_choice("order", self.order, ORDERS)
        _check_choice("dtype", self.dtype, DTYPES)
        if self.resize in ("fixed", "letterbox") and self.size is None:
            raise InputError(f"resize={self.resize} needs size=HxW (e.g. size=640x640)")
        if self.resize in ("short-side", "max-side", "min-side", "height") and not self.side:
            raise InputError(f"resize={self.resize} needs a side length, e.g. {self.resize}=736")
        if self.size is not None and self.resize not in ("fixed", "letterbox"):
            raise InputError(f"size applies to resize=fixed or letterbox only (resize is "
                             f"{self.resize})")
        if self.side is not None and self.resize in ("none", "fixed", "letterbox"):
            raise InputError(f"side={self.side} needs a resize mode that uses it: "
                             "short-side, max-side, min-side or height")
        if self.crop is not None and self.resize in ("height", "letterbox"):
            raise InputError(f"crop does not combine with resize={self.resize} (it pads "
                             "instead)")
        for name in ("size", "crop"):
            dims = getattr(self, name)
            if dims is not None and (len(dims) != 2 or min(dims) <= 0):
                raise InputError(f"{name} must be two positive ints HxW, got {dims}")
        if self.multiple < 1:
            raise InputError(f"multiple must be >= 1, got {self.multiple}")
        for name in ("mean", "std"):
            if len(getattr(self, name)) not in (1, 3):
                raise InputError(f"{name} needs 1 or 3 values, got {getattr(self, name)}")
        if any(s == 0 for s in self.std):
            raise InputError(f"std must not contain 0, got {self.std}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (tuples as lists); ``from_dict`` reads it back."""
        out = dataclasses.asdict(self)
        for key, value in out.items():
            if isinstance(value, tuple):
                out[key] = list(value)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PreprocessSpec:
        """Inverse of ``to_dict``; unknown keys raise ``InputError``."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"unknown preprocessing keys {unknown}; known: {sorted(known)}")
        values = dict(data)
        for key in ("size", "crop", "mean", "std"):
            if values.get(key) is not None:
                values[key] = tuple(values[key])
        return cls(**values)

    def __str__(self) -> str:
        """The ``key=value,...`` text form; ``parse_preprocess(str(spec)) == spec``."""
        default = PreprocessSpec()
        parts = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value != getattr(default, field.name) or field.name == "resize":
                parts.append(f"{field.name.replace('_', '-')}={_format_value(value)}")
        return ",".join(parts)


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InputError(f"{name}={value!r} is not one of {', '.join(choices)}")


def _format_value(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, tuple):
        sep = "x" if all(isinstance(v, int) for v in value) else "/"
        return sep.join(repr(v) if isinstance(v, float) else str(v) for v in value)
    if isinstance(value, float):
        return repr(value)
    return "none" if value is None else str(value)


PRESETS: dict[str, PreprocessSpec] = {
    # Raw pixels: RGB, NCHW, float32 0..255, no resize.
    "none": PreprocessSpec(),
    # torchvision's standard ImageNet evaluation (references/classification/presets.py
    # ClassificationPresetEval: Resize(256) bilinear + CenterCrop(224), ToTensor, Normalize).
    "imagenet": PreprocessSpec(resize="short-side", side=256, crop=(224, 224),
                               interpolation="bilinear", scale=_BY_255,
                               mean=IMAGENET_MEAN, std=IMAGENET_STD),
    # RapidOCR 1.4.4 (source of shared/models/ppocrv4): config.yaml Det limit_side_len 736,
    # limit_type min, mean = std = 0.5; DetPreProcess rounds to multiples of 32; image loaded
    # with PIL (no EXIF transpose) then RGB->BGR; cv2.resize INTER_LINEAR.
    "ppocr-det": PreprocessSpec(resize="min-side", side=736, multiple=32,
                                interpolation="cv2-linear", order="bgr", scale=_BY_255,
                                mean=_HALF, std=_HALF),
    # PaddleOCR tools/infer/predict_det.py defaults: det_limit_side_len 960, det_limit_type max,
    # NormalizeImage ImageNet mean/std applied to the BGR array from cv2.imread (EXIF applied).
    "paddleocr-det": PreprocessSpec(resize="max-side", side=960, multiple=32,
                                    interpolation="cv2-linear", order="bgr", scale=_BY_255,
                                    mean=IMAGENET_MEAN, std=IMAGENET_STD, exif=True),
    # PaddleOCR/RapidOCR rec resize_norm_img, rec_image_shape 3x48x320, one image per batch:
    # height 48, canvas width max(320, int(48 w / h)), (x/255 - 0.5)/0.5, zero padding right.
    "ppocr-rec": PreprocessSpec(resize="height", side=48, pad_width=320,
                                interpolation="cv2-linear", order="bgr", scale=_BY_255,
                                mean=_HALF, std=_HALF),
    # PaddleOCR/RapidOCR cls resize_norm_img, cls_image_shape 3x48x192 (width capped at 192).
    "ppocr-cls": PreprocessSpec(resize="height", side=48, pad_width=192, max_width=192,
                                interpolation="cv2-linear", order="bgr", scale=_BY_255,
                                mean=_HALF, std=_HALF),
    # ultralytics YOLO / RT-DETR predict: LetterBox to imgsz 640 (cv2.resize INTER_LINEAR,
    # gray 114 padding), RGB, /255 (ultralytics/engine/predictor.py preprocess).
    "ultralytics": PreprocessSpec(resize="letterbox", size=(640, 640),
                                  interpolation="cv2-linear", scale=_BY_255),
}

_ALIASES = {"interp": "interpolation", "limit-side": "max-side", "channels": "order",
            "channel-order": "order", "max-w": "max-width", "pad-w": "pad-width"}
_SIDE_KEYS = ("short-side", "max-side", "min-side", "height")


def _parse_int(key: str, text: str) -> int:
    try:
        return int(text)
    except ValueError as exc:
        raise InputError(f"{key}={text!r} is not an integer") from exc


def _parse_float(key: str, text: str) -> float:
    try:
        return float(Fraction(text)) if "/" in text else float(text)
    except (ValueError, ZeroDivisionError) as exc:
        raise InputError(f"{key}={text!r} is not a number (a fraction like 1/255 is fine)") from exc


def _parse_hw(key: str, text: str) -> tuple[int, int] | None:
    if text.lower() == "none":
        return None
    parts = text.lower().replace("*", "x").split("x")
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2:
        raise InputError(f"{key}={text!r}: expected HxW, e.g. 224x224")
    return _parse_int(key, parts[0]), _parse_int(key, parts[1])


def _parse_floats(key: str, text: str) -> tuple[float, ...]:
    return tuple(_parse_float(key, t) for t in text.replace(":", "/").split("/") if t)


def _parse_bool(key: str, text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise InputError(f"{key}={text!r}: expected 0/1 or true/false")


def _apply_override(values: dict[str, Any], key: str, text: str) -> None:
    key = key.strip().lower().replace("_", "-")
    key = _ALIASES.get(key, key)
    text = text.strip()
    if key in _SIDE_KEYS:
        values["resize"], values["side"] = key, _parse_int(key, text)
    elif key == "resize":
        values["resize"] = _ALIASES.get(text.lower(), text.lower())
        if values["resize"] in ("none", "fixed", "letterbox"):
            values["side"] = None
        if values["resize"] not in ("fixed", "letterbox"):
            values["size"] = None
    elif key in ("size", "crop"):
        values[key] = _parse_hw(key, text)
        if key == "size" and values[key] is not None:  # a size keeps letterbox, else fixed
            values["side"] = None
            if values.get("resize") != "letterbox":
                values["resize"] = "fixed"
    elif key in ("side", "multiple", "max-width", "pad-width"):
        values[key.replace("-", "_")] = None if text.lower() == "none" else _parse_int(key, text)
    elif key in ("scale", "pad-value"):
        values[key.replace("-", "_")] = _parse_float(key, text)
    elif key in ("mean", "std"):
        values[key] = _parse_floats(key, text)
    elif key == "exif":
        values["exif"] = _parse_bool(key, text)
    elif key in ("interpolation", "layout", "order", "dtype"):
        values[key] = text.lower()
    else:
        raise InputError(
            f"unknown preprocessing key {key!r}; known: resize, size, side, short-side, "
            "max-side, min-side, height, multiple, max-width, pad-width, crop, interpolation, "
            "layout, order, scale, mean, std, dtype, exif, pad-value")


def parse_preprocess(text: str | PreprocessSpec | Mapping[str, Any] | None) -> PreprocessSpec:
    """Parse a preset name, ``key=value,...`` overrides, or ``preset:key=value,...``.

    Args:
        text: E.g. ``"imagenet"``, ``"size=224x224,layout=nhwc,order=bgr,scale=1/255"``,
            ``"ppocr-det:max-side=960"``; a ``PreprocessSpec`` or its ``to_dict()`` form is
            returned as a spec; None means the ``none`` preset.

    Returns:
        The spec. Overrides start from the preset (or from ``none`` when no preset is named).

    Raises:
        InputError: Unknown preset or key, malformed value, or an inconsistent spec; the
            message lists the valid choices.
    """
    if text is None:
        return PRESETS["none"]
    if isinstance(text, PreprocessSpec):
        return text
    if isinstance(text, Mapping):
        return PreprocessSpec.from_dict(text)
    source = text.strip()
    preset_name, overrides = "none", source
    head, sep, tail = source.partition(":")
    if sep and "=" not in head:
        preset_name, overrides = head.strip().lower(), tail
    elif "=" not in source:
        preset_name, overrides = source.lower(), ""
    if preset_name not in PRESETS:
        raise InputError(f"unknown preprocessing preset {preset_name!r}; presets: "
                         f"{', '.join(PRESETS)} (or key=value,... overrides)")
    values = dataclasses.asdict(PRESETS[preset_name])
    for item in filter(None, (p.strip() for p in overrides.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise InputError(f"preprocessing item {item!r} is not key=value (in {text!r})")
        _apply_override(values, key, value)
    return PreprocessSpec.from_dict(values)
