"""Recognize which pixel normalization produced a tensor, from its values alone.

Every image pipeline the tool knows resizes the 8-bit image first and normalizes last
(torchvision ``ToTensor`` + ``Normalize``, PaddleOCR ``NormalizeImage``, OpenCV ``blobFromImage``),
so every value of channel c is ``v = k * d_c + o_c`` with an integer pixel level k in 0..255,
step ``d_c = scale / std_c`` and offset ``o_c = -mean_c / std_c``. A known normalization fits a
tensor when (almost) every value lands on its lattice and inside its range; among those that fit,
the coarsest lattice wins (a finer lattice also fits coarse data), provided its levels span a
plausible range (a 0/255 binary image is also a 0/1 image at another scale).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from precision_doctor.inputs.preprocess import IMAGENET_MEAN, IMAGENET_STD

# Fraction of values that must be on the lattice / in range (tolerates a few padded or
# interpolated-after-normalization values; measured 1.0 on every PP-OCR preset tensor).
LATTICE_MIN_FRACTION = 0.98
RANGE_MIN_FRACTION = 0.999
# Lattice tolerance in pixel levels, plus the dtype's rounding (|v| * eps / d).
LATTICE_TOLERANCE = 0.02
# Among fitting lattices the coarsest wins (a finer one also fits coarse data: (x/255-0.5)/0.5
# values of a bright image are also odd multiples of 1/255), unless it uses fewer than 64 levels
# or half the widest span (a black/white image is on the 0/1 lattice too).
MIN_LEVEL_SPAN = 64.0
_MAX_VALUES = 200_000  # values examined per channel (deterministic stride subsample)


@dataclass(frozen=True)
class Normalization:
    """A named pixel normalization ``y = (x * scale - mean[c]) / std[c]``, x in 0..255.

    Attributes:
        key: Short identifier (``raw``, ``x/255``, ``x/127.5-1``, ``imagenet``, ...).
        name: Human-readable description used in findings.
        scale: Pixel multiplier.
        mean: Per tensor channel (1 value broadcasts).
        std: Per tensor channel (1 value broadcasts).
        plain: No mean/std (raw pixels or a pure scale).
    """

    key: str
    name: str
    scale: float
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    plain: bool = False

    def lattice(self, channels: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(step d_c, offset o_c) per channel, or None when the constants need 3 channels."""
        if channels != 3 and (len(self.mean) == 3 or len(self.std) == 3):
            return None
        mean = np.broadcast_to(np.asarray(self.mean, np.float64), (channels,))
        std = np.broadcast_to(np.asarray(self.std, np.float64), (channels,))
        return self.scale / std, -mean / std


_REV_MEAN, _REV_STD = tuple(reversed(IMAGENET_MEAN)), tuple(reversed(IMAGENET_STD))
# Caffe/Keras "caffe" mode (keras.applications.imagenet_utils.preprocess_input): BGR means.
_CAFFE_BGR = (103.939, 116.779, 123.68)

KNOWN_NORMALIZATIONS: tuple[Normalization, ...] = (
    Normalization("raw", "raw pixels 0..255", 1.0, plain=True),
    Normalization("x/255", "x/255 (0..1)", 1.0 / 255, plain=True),
    Normalization("x/127.5-1", "(x/255 - 0.5)/0.5 (-1..1)", 1.0 / 255, (0.5,), (0.5,)),
    Normalization("imagenet", "ImageNet mean/std (0.485/0.456/0.406 on channels 0/1/2)",
                  1.0 / 255, IMAGENET_MEAN, IMAGENET_STD),
    Normalization("imagenet-reversed",
                  "ImageNet mean/std in reversed channel order (0.406/0.456/0.485)",
                  1.0 / 255, _REV_MEAN, _REV_STD),
    Normalization("(x-127.5)/128", "(x - 127.5)/128", 1.0, (127.5,), (128.0,)),
    Normalization("caffe-bgr", "Caffe mean subtraction 103.9/116.8/123.7 (BGR order)", 1.0,
                  _CAFFE_BGR),
    Normalization("caffe-rgb", "Caffe mean subtraction 123.7/116.8/103.9 (RGB order)", 1.0,
                  tuple(reversed(_CAFFE_BGR))),
)
BY_KEY = {n.key: n for n in KNOWN_NORMALIZATIONS}


def _dtype_eps(dtype: str) -> float:
    try:
        return float(np.finfo(np.dtype(dtype)).eps)
    except (TypeError, ValueError):
        return 0.0 if dtype.startswith(("int", "uint", "bool")) else 2.0 ** -7  # bfloat16 etc.


def _channel_values(chw: np.ndarray, mask: np.ndarray | None) -> list[np.ndarray]:
    out = []
    for plane in chw:
        values = plane[mask] if mask is not None else plane.ravel()
        stride = max(1, values.size // _MAX_VALUES)
        out.append(values[::stride])
    return out


@dataclass(frozen=True)
class Recognition:
    """The normalization recognized for one tensor and the evidence.

    Attributes:
        normalization: The best fitting known normalization, or None.
        lattice_fraction: Share of values on its lattice (worst channel).
        level_span: Widest pixel-level range used by a channel (0..255).
        candidates: Keys of every normalization that fits.
    """

    normalization: Normalization | None
    lattice_fraction: float = 0.0
    level_span: float = 0.0
    candidates: tuple[str, ...] = ()

    def to_evidence(self) -> dict[str, object]:
        return {"normalization": self.normalization.key if self.normalization else None,
                "lattice_fraction": round(self.lattice_fraction, 4),
                "level_span": round(self.level_span, 1), "candidates": list(self.candidates)}


def recognize(chw: np.ndarray, dtype: str, mask: np.ndarray | None = None) -> Recognition:
    """Which known normalization produced this (C, H, W) tensor (see the module docstring).

    Args:
        chw: (C, H, W) values (float64).
        dtype: The tensor's original dtype (its rounding widens the lattice tolerance).
        mask: (H, W) bool: the pixels to examine (e.g. excluding padding); None = all.

    Returns:
        ``Recognition`` (``normalization`` None when nothing fits, e.g. a tensor resized after
        normalization, or an unknown mean/std).
    """
    channels = _channel_values(chw, mask)
    eps = _dtype_eps(dtype)
    fits: list[tuple[float, Normalization, float, float]] = []
    for norm in KNOWN_NORMALIZATIONS:
        lattice = norm.lattice(len(channels))
        if lattice is None:
            continue
        steps, offsets = lattice
        worst_lattice, span, ok = 1.0, 0.0, True
        for values, d, o in zip(channels, steps, offsets):
            if values.size == 0:
                continue
            k = (values - o) / d
            tolerance = LATTICE_TOLERANCE + np.abs(values) * eps / d
            on_lattice = float(np.mean(np.abs(k - np.rint(k)) <= tolerance))
            in_range = float(np.mean((k >= -0.5) & (k <= 255.5)))
            if on_lattice < LATTICE_MIN_FRACTION or in_range < RANGE_MIN_FRACTION:
                ok = False
                break
            worst_lattice = min(worst_lattice, on_lattice)
            span = max(span, float(np.quantile(k, 0.999) - np.quantile(k, 0.001)))
        if ok:
            fits.append((span, norm, worst_lattice, float(np.mean(steps))))
    if not fits:
        return Recognition(None)
    floor = min(MIN_LEVEL_SPAN, 0.5 * max(f[0] for f in fits))
    best = max((f for f in fits if f[0] >= floor), key=lambda f: f[3])  # first of equal steps
    return Recognition(best[1], best[2], best[0], tuple(f[1].key for f in fits))


def match_lattice(steps: np.ndarray, offsets: np.ndarray, rel_tol: float = 0.03
                  ) -> Normalization | None:
    """The known normalization with this per-channel step and offset (within ``rel_tol``).

    Used when one side is recognized and the other's lattice is implied through the fitted
    affine map. Offsets are compared relative to the full range ``255 * d``.
    """
    for norm in KNOWN_NORMALIZATIONS:
        lattice = norm.lattice(len(steps))
        if lattice is None:
            continue
        d, o = lattice
        if (np.all(np.abs(steps - d) <= rel_tol * np.abs(d))
                and np.all(np.abs(offsets - o) <= rel_tol * 255 * np.abs(d))):
            return norm
    return None


def describe_change(a: Normalization, b: Normalization) -> tuple[str, str] | None:
    """(finding kind, summary) for A's normalization vs B's, or None when they are the same.

    ``scale`` when both are plain (raw pixels or a pure scale, e.g. 0..255 vs 0..1), else
    ``normalization`` (mean/std missing on one side, or different constants).
    """
    if a.key == b.key:
        return None
    if a.plain and b.plain:
        ratio = b.scale / a.scale
        factor = f"{ratio:.4g}" if ratio >= 1 else f"1/{1 / ratio:.4g}"
        return "scale", f"value scale differs: A is {a.name}, B is {b.name} (B = A x {factor})"
    if a.plain != b.plain:
        missing = "B" if b.plain else "A"
        summary = f"mean/std normalization missing in {missing}: A uses {a.name}, B uses {b.name}"
        return "normalization", summary
    return "normalization", f"normalization differs: A uses {a.name}, B uses {b.name}"
