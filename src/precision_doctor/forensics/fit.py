"""Estimators: per-channel affine map with a channel-permutation search, and image shift.

Affine: for a channel permutation p, each B channel c is fitted as ``B_c = s_c * A_p(c) + t_c``
by ordinary least squares (closed form: s = cov(a, b) / var(a), t = mean(b) - s mean(a)). Every
permutation of up to 4 channels is tried (6 for RGB); the one with the smallest residual wins,
identity on ties (a gray image cannot show its channel order).

Shift: phase correlation (Kuglin & Hines 1975, "The phase correlation image alignment method"):
the inverse FFT of the normalized cross-power spectrum peaks at the translation; a parabola
through the peak and its neighbours gives the sub-pixel part. A Hann window suppresses the
wrap-around edges of non-periodic images.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import permutations

import numpy as np

# Residuals within this factor of the identity fit count as a tie (identity kept).
PERMUTATION_TIE = 1.02


@dataclass(frozen=True)
class AffineFit:
    """``B_c = scale[c] * A_perm[c] + offset[c]`` over the compared pixels.

    Attributes:
        perm: B channel c comes from A channel ``perm[c]``.
        scale: Per B channel.
        offset: Per B channel.
        rel_std: sqrt(sum residual^2 / sum (B - mean_c B)^2): 0 = exact, 1 = no better than a
            per-channel constant.
        rel_l2: ||fit(A) - B|| / ||B||.
        identity_rel_std: ``rel_std`` of the best fit with the identity permutation.
        runner_up_rel_std: ``rel_std`` of the best permutation other than ``perm``.
    """

    perm: tuple[int, ...]
    scale: tuple[float, ...]
    offset: tuple[float, ...]
    rel_std: float
    rel_l2: float
    identity_rel_std: float
    runner_up_rel_std: float

    def apply(self, a: np.ndarray) -> np.ndarray:
        """Map a (C, H, W) array of A into B's channel order and units."""
        s = np.asarray(self.scale)[:, None, None]
        t = np.asarray(self.offset)[:, None, None]
        return a[list(self.perm)] * s + t


def _fit_channel(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(s, t, residual sum of squares) of y ~ s x + t."""
    mx, my = x.mean(), y.mean()
    dx = x - mx
    var = float(np.dot(dx, dx))
    s = float(np.dot(dx, y - my)) / var if var > 0 else 1.0
    t = float(my - s * mx)
    r = y - (s * x + t)
    return s, t, float(np.dot(r, r))


def fit_affine(a: np.ndarray, b: np.ndarray, mask: np.ndarray | None = None) -> AffineFit:
    """Best per-channel affine map from A to B over every channel permutation.

    Args:
        a: (C, H, W) float64.
        b: (C, H, W) float64, same shape.
        mask: (H, W) bool: pixels to use (None = all).

    Returns:
        The ``AffineFit`` of the best permutation.
    """
    channels = a.shape[0]
    xs = [plane[mask] if mask is not None else plane.ravel() for plane in a]
    ys = [plane[mask] if mask is not None else plane.ravel() for plane in b]
    total = sum(float(np.sum((y - y.mean()) ** 2)) for y in ys) or 1.0
    norm_b = sum(float(np.dot(y, y)) for y in ys) or 1.0
    cache = {(c, j): _fit_channel(xs[j], ys[c]) for c in range(channels)
             for j in range(channels)}
    perms = list(permutations(range(channels))) if channels <= 4 else [tuple(range(channels))]
    scored = sorted(((sum(cache[c, p[c]][2] for c in range(channels)), i, p)
                     for i, p in enumerate(perms)))
    identity = tuple(range(channels))
    identity_ss = sum(cache[c, c][2] for c in range(channels))
    best_ss, _, best = scored[0]
    if identity_ss <= best_ss * PERMUTATION_TIE + 1e-12 * total:
        best_ss, best = identity_ss, identity
    others = [ss for ss, _, p in scored if p != best]
    runner_up = others[0] if others else best_ss
    return AffineFit(
        perm=best, scale=tuple(cache[c, best[c]][0] for c in range(channels)),
        offset=tuple(cache[c, best[c]][1] for c in range(channels)),
        rel_std=float(np.sqrt(best_ss / total)), rel_l2=float(np.sqrt(best_ss / norm_b)),
        identity_rel_std=float(np.sqrt(identity_ss / total)),
        runner_up_rel_std=float(np.sqrt(runner_up / total)))


@dataclass(frozen=True)
class Shift:
    """Translation between two images: ``B[y, x] ~ A[y + dy, x + dx]``.

    Attributes:
        dy / dx: Sub-pixel estimate in pixels.
        peak: Height of the phase-correlation peak (1 = pure translation, ~0 = unrelated).
        ratio: Peak over the highest value outside its 3x3 neighbourhood.
    """

    dy: float
    dx: float
    peak: float
    ratio: float

    @property
    def integer(self) -> tuple[int, int]:
        return round(self.dy), round(self.dx)


def _standardize(plane: np.ndarray) -> np.ndarray:
    x = plane - plane.mean()
    sd = x.std()
    return x / sd if sd > 0 else x


def _subpixel(left: float, center: float, right: float) -> float:
    denom = left - 2.0 * center + right
    return 0.0 if denom == 0 else float(np.clip(0.5 * (left - right) / denom, -0.5, 0.5))


def estimate_shift(a: np.ndarray, b: np.ndarray) -> Shift:
    """Phase-correlation estimate of the translation between two same-size 2-D images.

    Args:
        a: (H, W) image A (any units: each image is standardized).
        b: (H, W) image B.

    Returns:
        ``Shift`` with ``B[y, x] ~ A[y + dy, x + dx]``; (0, 0) with peak 0 for flat images.
    """
    h, w = a.shape
    window = np.outer(np.hanning(h) if h > 2 else np.ones(h),
                      np.hanning(w) if w > 2 else np.ones(w))
    fa = np.fft.fft2(_standardize(a) * window)
    fb = np.fft.fft2(_standardize(b) * window)
    cross = fb * np.conj(fa)
    magnitude = np.abs(cross)
    if not np.any(magnitude > 0):
        return Shift(0.0, 0.0, 0.0, 1.0)
    cross = np.where(magnitude > 1e-12 * magnitude.max(), cross / np.maximum(magnitude, 1e-300),
                     0.0)
    corr = np.real(np.fft.ifft2(cross))
    py, px = np.unravel_index(int(np.argmax(corr)), corr.shape)
    peak = float(corr[py, px])
    rest = corr.copy()
    for oy in (-1, 0, 1):
        for ox in (-1, 0, 1):
            rest[(py + oy) % h, (px + ox) % w] = -np.inf
    second = float(rest.max()) if np.isfinite(rest).any() else 0.0
    sy = _subpixel(corr[(py - 1) % h, px], peak, corr[(py + 1) % h, px]) if h > 2 else 0.0
    sx = _subpixel(corr[py, (px - 1) % w], peak, corr[py, (px + 1) % w]) if w > 2 else 0.0
    # corr peaks at -d for B(x) = A(x + d); wrap to [-N/2, N/2).
    dy = -(((py + h // 2) % h) - h // 2 + sy)
    dx = -(((px + w // 2) % w) - w // 2 + sx)
    return Shift(float(dy) + 0.0, float(dx) + 0.0, peak,
                 peak / second if second > 0 else float("inf"))


def overlap(a: np.ndarray, b: np.ndarray, dy: int, dx: int) -> tuple[np.ndarray, np.ndarray]:
    """The regions of (C, H, W) arrays A and B that ``B[y, x] = A[y + dy, x + dx]`` pairs."""
    _, h, w = a.shape
    ya, yb = (dy, 0) if dy >= 0 else (0, -dy)
    xa, xb = (dx, 0) if dx >= 0 else (0, -dx)
    hh, ww = h - abs(dy), w - abs(dx)
    return a[:, ya:ya + hh, xa:xa + ww], b[:, yb:yb + hh, xb:xb + ww]


def pointwise_rel_std(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    """Residual left when B is *any* function of A per channel (binned conditional mean).

    A non-linear tone curve (gamma, a colour-space round trip) is a per-value map: it leaves
    almost nothing here, while a spatial difference (resampling, shift) leaves about as much as
    the affine fit does. Bins: uniform over A's range, at most 256 and at least 20 pixels each
    on average (fewer bins for small images, so the bins cannot memorize the pixels).

    Args:
        a: (C, H, W) A (mapped to B's channel order).
        b: (C, H, W) B.
        mask: (H, W) bool: pixels to use.

    Returns:
        sqrt(sum residual^2 / sum (B - mean_c B)^2), as ``AffineFit.rel_std``.
    """
    residual = total = 0.0
    for x, y in zip(a[:, mask], b[:, mask]):
        bins = int(np.clip(x.size // 20, 1, 256))
        lo, hi = float(x.min()), float(x.max())
        index = np.zeros(x.size, np.int64) if hi <= lo else np.minimum(
            ((x - lo) / (hi - lo) * bins).astype(np.int64), bins - 1)
        counts = np.bincount(index, minlength=bins)
        means = np.bincount(index, weights=y, minlength=bins) / np.maximum(counts, 1)
        r = y - means[index]
        residual += float(np.dot(r, r))
        total += float(np.sum((y - y.mean()) ** 2))
    return float(np.sqrt(residual / total)) if total > 0 else 0.0
