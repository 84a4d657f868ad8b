"""Per-tensor activation calibration: the clipping threshold ``amax`` from a histogram of |x|.

Four calibrators, as in TensorRT and NVIDIA's pytorch-quantization (``calib/histogram.py``):

* ``max``: the largest finite |x| seen;
* ``percentile``: the |x| below which the given percentage of the values lie;
* ``entropy``: the threshold minimizing KL(P || Q) between the clipped histogram P and its
  quantized version Q (Migacz, "8-bit Inference with TensorRT", GTC 2017; ported by ONNX Runtime's
  ``HistogramCollector.compute_entropy`` and pytorch-quantization's ``_compute_amax_entropy``);
* ``mse``: the threshold minimizing the histogram-weighted squared error of the exact Q/DQ.

The histogram has a fixed number of bins over [0, R]; when a later sample exceeds R, the bin
width doubles (adjacent bins merge) until it fits. Merging keeps every count in the bin it
belongs to exactly, keeps the bin count (and so the cost of the searches) fixed, and makes the
result depend only on the data and its order. TensorRT's and ORT's collectors append bins of
the old width instead, which an outlier a million times the first range turns into millions of
bins.
"""

from __future__ import annotations

import numpy as np

from precision_doctor.quant.qformats import QuantFormat, fake_quant

CALIBRATORS = ("max", "percentile", "entropy", "mse")

# TensorRT's entropy search starts at 128 bins (as many as int8's quantized levels) and maps the
# bins below a candidate threshold onto 128 levels (Migacz 2017, slide 38; pytorch-quantization's
# ``start_bin=128`` and ``nbins = 1 << (num_bits - 1)``). The MSE search starts there too.
_START_BIN = 128
_INT8_LEVELS = 128
# Q's count where clipped values land in an otherwise empty level (MXNet/ORT smoothing eps).
_EPS = 1e-4
_MSE_ROWS = 256  # candidate thresholds evaluated at once by the MSE search (memory ~ rows x bins)


class AbsHistogram:
    """Streaming histogram of |x| of one tensor over calibration samples.

    Bins are ``[k w, (k + 1) w)``; ``w`` is set by the first sample with a nonzero value (its
    largest |x| / bins, rounded up so that the range lies strictly above it) and doubles when a
    later sample reaches the range. Then every value stays in the bin it would get if all the
    data were binned at the final width. Until a nonzero value arrives, ``w`` is 0 and every
    count is in bin 0.

    Attributes:
        amax: Largest finite |x| seen (0.0 before any).
        count: Number of finite values added.
        zeros: How many of them are exactly zero (they are in bin 0).
        nonfinite: Number of NaN/inf values seen (ignored by the histogram).
    """

    def __init__(self, bins: int = 2048) -> None:
        """Create an empty histogram.

        Args:
            bins: Number of bins, >= 128 (the entropy search needs at least int8's 128 levels).

        Raises:
            ValueError: ``bins`` < 128.
        """
        if bins < _START_BIN:
            raise ValueError(f"AbsHistogram needs at least {_START_BIN} bins, got {bins}")
        self._counts = np.zeros(bins, dtype=np.int64)
        self._width = 0.0
        self.amax = 0.0
        self.count = 0
        self.zeros = 0
        self.nonfinite = 0

    @property
    def hist(self) -> np.ndarray:
        """int64 counts, shape ``(bins,)`` (a copy)."""
        return self._counts.copy()

    @property
    def edges(self) -> np.ndarray:
        """float64 bin edges ``k * w``, shape ``(bins + 1,)``; all zero while ``w`` is 0."""
        return self._width * np.arange(self._counts.size + 1, dtype=np.float64)

    @property
    def width(self) -> float:
        """Bin width ``w`` in the units of x (0.0 until a nonzero value arrives)."""
        return self._width

    def add(self, x: np.ndarray) -> None:
        """Add the values of one sample; non-finite ones are counted in ``nonfinite`` only.

        Args:
            x: Any shape, any real dtype (read as float64).
        """
        a = np.abs(np.asarray(x, dtype=np.float64)).ravel()
        finite = np.isfinite(a)
        self.nonfinite += int(a.size - np.count_nonzero(finite))
        a = a[finite]
        if a.size == 0:
            return
        top = float(a.max())
        self.amax = max(self.amax, top)
        self.count += int(a.size)
        self.zeros += int(a.size - np.count_nonzero(a))
        n = self._counts.size
        if top > 0.0 and self._width == 0.0:
            self._width = top / n
            if self._width * n <= top:  # the range lies strictly above every value
                self._width = float(np.nextafter(self._width, np.inf))
        elif self._width > 0.0 and top >= self._width * n:
            self._grow(top)
        if self._width == 0.0:
            self._counts[0] += a.size
            return
        index = np.minimum((a / self._width).astype(np.int64), n - 1)
        self._counts += np.bincount(index, minlength=n)

    def _grow(self, top: float) -> None:
        """Double the bin width (merging bin pairs) until the range lies above ``top``."""
        n = self._counts.size
        doublings = 0
        while self._width * n <= top:
            self._width *= 2.0
            doublings += 1
        merged = np.zeros_like(self._counts)
        if doublings < 63:
            np.add.at(merged, np.arange(n) >> doublings, self._counts)
        else:
            merged[0] = self._counts.sum()
        self._counts = merged


def calibrate_amax(hist: AbsHistogram, method: str, fmt: QuantFormat,
                   percentile: float = 99.99) -> float:
    """The clipping threshold ``amax`` (units of x) one calibrator picks for a tensor.

    Args:
        hist: The tensor's histogram over the calibration samples.
        method: One of ``CALIBRATORS``:
            ``max``: ``hist.amax``.
            ``percentile``: the |x| below which ``percentile`` % of the values lie, linearly
            interpolated inside the bin where the cumulative count crosses it (TensorRT and
            ORT return that bin's lower edge instead).
            ``entropy``: among thresholds ``edges[i]`` for i = 128..bins, the one with the
            least KL(P || Q) (TensorRT). P: the counts below the threshold, those above added
            to its last bin. Q: the counts below the threshold grouped by quantized level, each
            group's total spread evenly over its bins that are nonzero in P (the last one is,
            once the clipped counts are in it: MXNet's and ORT's mask). INT8 uses TensorRT's
            128 levels of equal width (bin j of i goes to level floor(128 j / i)). FP8 groups
            the bins by the level their centre rounds to (nearest even, exact arithmetic)
            under ``scale_for(edges[i])``, so the format's own steps decide what is lost. FP8
            levels are nearly scale-invariant (a fixed relative step), so within the format's
            dynamic range the FP8 KL curve is nearly flat and its minimum is set by how bins
            align with levels: on a Gaussian with far outliers it lands anywhere between the
            body and max from sample to sample. Prefer ``max`` or ``mse`` for FP8 (NVIDIA
            ModelOpt's ``FP8_DEFAULT_CFG`` calibrates by max).
            Two departures from TensorRT, both for robustness: where the clipped counts land
            in a level holding no counts of its own, Q there is eps = 1e-4 counts instead of
            0 (the eps of MXNet's and ORT's ``smooth_distribution``; with 0, every threshold
            above the bulk of a tensor with a few far outliers has infinite KL and the search
            lands on the outliers); and exact zeros are left out (every threshold keeps them
            exact; after a ReLU they would dominate P; pytorch-quantization copies bin 1 into
            bin 0 instead, which erases a tensor whose bulk lies in bin 0). Ties go to the
            larger threshold.
            ``mse``: among thresholds ``edges[i]`` for i = 128..bins and ``hist.amax``, the
            one with the least ``sum_j count_j * (fake_quant(c_j) - c_j)^2`` over bin centres
            c_j with ``scale_for(threshold)``, clipping included (pytorch-quantization's
            ``_compute_amax_mse``, with edges instead of centres as candidates).
            Every method returns at most ``hist.amax``.
        fmt: The format the tensor is quantized to (used by ``entropy`` and ``mse``).
        percentile: For ``percentile``, in [0, 100].

    Returns:
        The threshold as a Python float; 0.0 for a histogram without a nonzero finite value.

    Raises:
        ValueError: ``method`` is not one of ``CALIBRATORS``, or ``percentile`` is out of range.
    """
    if method not in CALIBRATORS:
        raise ValueError(f"unknown calibrator {method!r}: use one of {', '.join(CALIBRATORS)}")
    if not 0.0 <= percentile <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {percentile}")
    if hist.amax == 0.0:
        return 0.0
    counts, edges = hist.hist, hist.edges
    if method == "max":
        threshold = hist.amax
    elif method == "percentile":
        threshold = _percentile(counts, edges, percentile)
    elif method == "entropy":
        sizes, kl = _kl_divergences(counts, hist.zeros, fmt)
        best = sizes.size - 1 - int(np.argmin(kl[::-1]))  # the last minimum: larger threshold
        threshold = float(edges[sizes[best]])
    else:
        threshold = _mse(counts, edges, hist.amax, fmt)
    return float(min(threshold, hist.amax))


def calibrate_all(hist: AbsHistogram, fmt: QuantFormat,
                  percentile: float = 99.99) -> dict[str, float]:
    """Every calibrator's ``amax`` for one tensor (see ``calibrate_amax``).

    Args:
        hist: The tensor's histogram.
        fmt: Target format.
        percentile: For the ``percentile`` method, in [0, 100].

    Returns:
        ``{method: amax}`` for each method of ``CALIBRATORS``, in that order.

    Raises:
        ValueError: ``percentile`` is out of range.
    """
    return {m: calibrate_amax(hist, m, fmt, percentile) for m in CALIBRATORS}


def _percentile(counts: np.ndarray, edges: np.ndarray, percentile: float) -> float:
    """|x| below which ``percentile`` % of the counts lie, interpolated inside its bin."""
    cumulative = np.cumsum(counts)
    target = percentile / 100.0 * float(cumulative[-1])
    k = min(int(np.searchsorted(cumulative, target, side="left")), counts.size - 1)
    below = float(cumulative[k - 1]) if k > 0 else 0.0
    inside = (target - below) / counts[k] if counts[k] else 0.0
    return float(edges[k] + inside * (edges[k + 1] - edges[k]))


def _level_bounds(fmt: QuantFormat, sizes: np.ndarray) -> np.ndarray:
    """First bin of each quantized level for each candidate: int64 ``(len(sizes), L + 1)``.

    For a candidate of ``i = sizes[r]`` bins, level g holds bins ``[out[r, g], out[r, g + 1])``;
    ``out[r, 0] = 0`` and ``out[r, L] = i``. Levels may be empty (FP8 near zero).
    """
    i = sizes[:, None]
    if not fmt.is_float:  # TensorRT: bin j goes to level floor(128 j / i)
        k = np.arange(1, _INT8_LEVELS, dtype=np.int64)[None, :]
        inner = (k * i + _INT8_LEVELS - 1) // _INT8_LEVELS  # ceil(k i / 128)
    else:
        # Bin j's centre in units of the scale is (2j + 1) qmax / (2 i). It rounds below the
        # midpoint of levels v_l < v_l+1 when (2j + 1) Q < S_l i, all in integers scaled by
        # 2**bits (Q = qmax 2**bits, S_l = (v_l + v_l+1) 2**bits); a tie goes to the level
        # with the even bit pattern, which is level l when l is even.
        grid = np.arange(256, dtype=np.uint8).view(fmt.dtype).astype(np.float64)
        grid = np.unique(grid[np.isfinite(grid) & (grid >= 0)])
        bits = int(round(-np.log2(grid[1])))  # grid[1]: the smallest subnormal
        levels = np.round(np.ldexp(grid, bits)).astype(np.int64)
        q = int(levels[-1])
        r = (levels[:-1] + levels[1:])[None, :] * i
        below = ((r - 1) // q + 1) // 2  # odd n >= 1 with n Q < R
        tie = (r % q == 0) & ((r // q) % 2 == 1)
        even_level = (np.arange(levels.size - 1) % 2 == 0)[None, :]
        inner = np.minimum(below + (tie & even_level), i)
    zeros = np.zeros_like(sizes)[:, None]
    return np.concatenate([zeros, inner, i], axis=1)


def _kl_divergences(counts: np.ndarray, zeros: int,
                    fmt: QuantFormat) -> tuple[np.ndarray, np.ndarray]:
    """KL(P || Q) of every entropy candidate, vectorized with prefix sums.

    Returns ``(sizes, kl)``: int64 bin counts i = 128..bins (threshold ``edges[i]``) and the
    float64 divergences (inf where undefined).

    With P_j and Q_j as in ``calibrate_amax``, N = sum P, M = sum_{j<i} h_j and m_g, z_g the
    count and the number of nonzero bins of level g:
    KL = (sum_j P_j ln P_j - sum_{g != last} m_g ln(m_g / z_g) - (m_last + O) ln q_last) / N
    + ln(M / N), where O is the count above the threshold, q_last = m_last / z_last and z_last
    includes the last bin once O is in it. When the last level holds no counts of its own,
    q_last is eps (and M becomes M + eps).
    """
    h = counts.astype(np.float64)
    h[0] -= zeros
    n = h.size
    sizes = np.arange(_START_BIN, n + 1, dtype=np.int64)
    total = h.sum()
    cum = np.concatenate([[0.0], np.cumsum(h)])
    cum_nonzero = np.concatenate([[0], np.cumsum(h > 0)])
    with np.errstate(divide="ignore", invalid="ignore"):
        h_log_h = np.where(h > 0, h * np.log(h), 0.0)
    cum_hlogh = np.concatenate([[0.0], np.cumsum(h_log_h)])

    bounds = _level_bounds(fmt, sizes)
    mass = cum[bounds[:, 1:]] - cum[bounds[:, :-1]]
    nonzero = cum_nonzero[bounds[:, 1:]] - cum_nonzero[bounds[:, :-1]]
    with np.errstate(divide="ignore", invalid="ignore"):
        level_term = np.where(mass > 0, mass * np.log(mass / np.maximum(nonzero, 1)), 0.0)
    last = np.count_nonzero(bounds[:, 1:-1] <= (sizes - 1)[:, None], axis=1)
    rows = np.arange(sizes.size)
    outliers = total - cum[sizes]
    inside = cum[sizes]
    p_last = h[sizes - 1] + outliers
    mass_last = mass[rows, last]
    # The last bin is nonzero in P once the outliers are in it (MXNet's and ORT's mask).
    nonzero_last = nonzero[rows, last] + ((h[sizes - 1] == 0) & (outliers > 0))
    # A level with clipped counts but none of its own gets Q = eps there (not 0 -> KL = inf).
    empty_last = (outliers > 0) & (mass_last == 0)
    q_last = np.where(empty_last, _EPS, mass_last / np.maximum(nonzero_last, 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        p_log_p = cum_hlogh[sizes - 1] + np.where(p_last > 0, p_last * np.log(p_last), 0.0)
        last_mass = mass_last + outliers  # P's total over the last level
        last_term = np.where(last_mass > 0, last_mass * np.log(q_last), 0.0)
        cross = level_term.sum(axis=1) - level_term[rows, last] + last_term
        kl = (p_log_p - cross) / total + np.log((inside + _EPS * empty_last) / total)
    kl[inside == 0] = np.inf
    return sizes, kl


def _mse(counts: np.ndarray, edges: np.ndarray, amax: float, fmt: QuantFormat) -> float:
    """Threshold with the least histogram-weighted squared Q/DQ error of the bin centres."""
    used = counts > 0  # empty bins add no error
    top = float(np.finfo(np.float32).max)  # the Q/DQ computes in float32
    centres = np.minimum((edges[:-1] + edges[1:]) / 2, top)[used].astype(np.float32)
    weights = counts[used].astype(np.float64)
    candidates = np.minimum(np.append(edges[_START_BIN:], amax), top)
    errors = np.empty(candidates.size)
    for start in range(0, candidates.size, _MSE_ROWS):
        chunk = candidates[start:start + _MSE_ROWS]
        scales = np.atleast_1d(fmt.scale_for(chunk))
        grid = np.broadcast_to(centres, (chunk.size, centres.size))
        diff = fake_quant(grid, scales, fmt, axis=0).astype(np.float64) - centres
        errors[start:start + chunk.size] = np.square(diff) @ weights
    return float(candidates[int(np.argmin(errors))])
