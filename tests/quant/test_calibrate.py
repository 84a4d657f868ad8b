"""quant.calibrate: the streaming |x| histogram and the max/percentile/entropy/mse calibrators."""

import bisect
import contextlib
import io
import time
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from precision_doctor.quant.calibrate import (
    CALIBRATORS,
    AbsHistogram,
    _kl_divergences,
    calibrate_all,
    calibrate_amax,
)
from precision_doctor.quant.qformats import QUANT_FORMATS, QuantFormat

RNG = np.random.default_rng(7)
INT8, E4M3, E5M2 = QUANT_FORMATS["int8"], QUANT_FORMATS["fp8"], QUANT_FORMATS["fp8e5m2"]


def _histogram(x: np.ndarray, bins: int = 2048) -> AbsHistogram:
    h = AbsHistogram(bins)
    h.add(x)
    return h


def _gauss_with_outliers(n: int = 200_000) -> np.ndarray:
    """A Gaussian body (max ~4.5) and three outliers at 40, -55 and 70."""
    return np.concatenate([RNG.standard_normal(n), [40.0, -55.0, 70.0]]).astype(np.float32)


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 300), elements=st.floats(width=32)))
def test_max_is_the_largest_finite_abs_and_nonfinite_values_are_ignored(x):
    h = _histogram(x, 128)
    finite = np.abs(x[np.isfinite(x)])
    assert h.nonfinite == x.size - finite.size and h.count == finite.size
    assert int(h.hist.sum()) == h.count
    expected = float(finite.max()) if finite.size else 0.0
    assert h.amax == expected
    assert calibrate_amax(h, "max", INT8) == expected


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["normal", "laplace", "exponential", "uniform"]),
       st.integers(100, 20_000), st.floats(50.0, 100.0), st.integers(0, 2**32 - 1))
def test_percentile_is_within_one_bin_of_the_exact_one(dist, n, percentile, seed):
    x = getattr(np.random.default_rng(seed), dist)(size=n).astype(np.float32)
    h = _histogram(x, 256)
    exact = np.percentile(np.abs(x), percentile, method="inverted_cdf")  # same definition
    assert abs(calibrate_amax(h, "percentile", INT8, percentile) - exact) <= h.width


def test_percentile_default_matches_numpy():
    x = RNG.standard_normal(100_000).astype(np.float32)
    h = _histogram(x)
    got = calibrate_amax(h, "percentile", INT8)
    assert abs(got - np.percentile(np.abs(x), 99.99)) <= h.width
    assert calibrate_amax(h, "percentile", INT8, 100.0) == h.amax


def test_int8_entropy_and_mse_clip_far_outliers_and_keep_uniform_data():
    h = _histogram(_gauss_with_outliers(1_000_000))
    # Entropy clips at the first candidate (128 of 2048 bins = 4.4); MSE where the squared
    # error of clipping 3 outliers at 40..70 meets the rounding error saved on 1e6 values.
    assert 3.5 < calibrate_amax(h, "entropy", INT8) < 0.2 * h.amax
    assert 3.5 < calibrate_amax(h, "mse", INT8) < 0.5 * h.amax
    u = _histogram(RNG.uniform(-2.0, 2.0, 100_000))
    assert calibrate_amax(u, "entropy", INT8) >= 0.99 * u.amax
    assert calibrate_amax(u, "mse", INT8) >= 0.99 * u.amax


@pytest.mark.parametrize("fmt", [E4M3, E5M2])
def test_fp8_mse_keeps_the_range_and_uniform_data_stays_at_max(fmt):
    # FP8's step is relative: clipping gains little precision, so MSE keeps the outliers.
    h = _histogram(_gauss_with_outliers())
    assert calibrate_amax(h, "mse", fmt) > 0.5 * h.amax
    u = _histogram(RNG.uniform(-2.0, 2.0, 100_000))
    for method in ("entropy", "mse"):
        assert calibrate_amax(u, method, fmt) >= 0.9 * u.amax


def test_fp8_kl_curve_is_nearly_flat_where_int8_has_a_clear_minimum():
    h = _histogram(_gauss_with_outliers())
    spread = {}
    for fmt in (INT8, E4M3, E5M2):
        kl = _kl_divergences(h.hist, h.zeros, fmt)[1]
        spread[fmt.name] = kl.max() / kl.min()
    assert spread["int8"] > 50 and spread["fp8"] < 3 and spread["fp8e5m2"] < 3


def _kl_loop(counts: np.ndarray, zeros: int, fmt: QuantFormat) -> np.ndarray:
    """The divergences written as plainly as possible: one candidate at a time, FP8 levels by
    rounding each bin centre exactly (ml_dtypes rounds float64 through float32)."""
    grid = np.arange(256, dtype=np.uint8).view(fmt.dtype).astype(np.float64)
    grid = [Fraction(v) for v in np.unique(grid[np.isfinite(grid) & (grid >= 0)])]

    def fp8_level(u: Fraction) -> int:  # nearest level, ties to the even bit pattern
        k = bisect.bisect_left(grid, u)  # grid[k] >= u; u < qmax as centres lie below T
        if k == 0 or grid[k] - u < u - grid[k - 1]:
            return k
        return k - 1 if u - grid[k - 1] < grid[k] - u or (k - 1) % 2 == 0 else k

    h = counts.astype(np.float64)
    h[0] -= zeros
    out = []
    for i in range(128, h.size + 1):
        p = h[:i].copy()
        outliers = h[i:].sum()
        p[-1] += outliers
        if fmt.is_float:
            level = np.array([fp8_level(Fraction(2 * j + 1) * Fraction(fmt.qmax) / (2 * i))
                              for j in range(i)])
        else:
            level = np.arange(i) * 128 // i
        q = np.zeros(i)
        for g in np.unique(level):
            members = level == g
            nonzero = members & (p > 0)
            if h[:i][members].sum() > 0:
                q[nonzero] = h[:i][members].sum() / nonzero.sum()
        if p[-1] > 0 and q[-1] == 0:
            q[-1] = 1e-4
        if p.sum() == 0 or q.sum() == 0:
            out.append(np.inf)
            continue
        pn, qn = p / p.sum(), q / q.sum()
        used = pn > 0
        out.append(float(np.sum(pn[used] * np.log(pn[used] / qn[used]))))
    return np.array(out)


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([INT8, E4M3, E5M2]), st.integers(128, 170),
       st.floats(0.0, 0.9), st.integers(0, 2**32 - 1))
def test_vectorized_kl_equals_the_plain_loop(fmt, bins, empty_share, seed):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 50, bins) * (rng.random(bins) > empty_share)
    counts[rng.integers(0, bins)] += 1  # never all empty
    zeros = int(rng.integers(0, counts[0] + 1))
    sizes, kl = _kl_divergences(counts, zeros, fmt)
    np.testing.assert_array_equal(sizes, np.arange(128, bins + 1))
    np.testing.assert_allclose(kl, _kl_loop(counts, zeros, fmt), rtol=1e-9, atol=1e-12)


def test_entropy_against_onnxruntime_histogram_collector():
    """ORT's entropy (int8: 2 * n signed bins and 256 quantized bins = our n |x| bins with
    128 levels) agrees where the data leave no room for its differences: uniform data at max,
    and far outliers clipped by both. On a Gaussian body the two land tens of bins apart,
    because the KL curve is flat near its minimum and ORT differs in ways that move it: a
    signed histogram, ``size // 256`` bins per level with the remainder (up to half the slice)
    merged into the last level, Q truncated to integer counts, eps smoothing of every bin,
    and the KL computed in float32 (onnxruntime 1.32 ``calibrate.py``)."""
    collector_module = pytest.importorskip("onnxruntime.quantization.calibrate")

    def ort_entropy(x: np.ndarray, bins: int) -> float:
        collector = collector_module.HistogramCollector(
            method="entropy", symmetric=True, num_bins=bins, num_quantized_bins=256,
            percentile=99.99, scenario="same")
        with contextlib.redirect_stdout(io.StringIO()):  # it prints its progress
            collector.collect({"t": x})
            return float(collector.compute_collection_result()["t"][1])

    uniform = RNG.uniform(-3.0, 3.0, 50_000).astype(np.float32)
    h = _histogram(uniform, 256)
    assert abs(calibrate_amax(h, "entropy", INT8) - ort_entropy(uniform, 512)) <= h.width
    x = _gauss_with_outliers(50_000)  # outliers at 40..70: both clip all three (ORT ~30)
    assert calibrate_amax(_histogram(x, 512), "entropy", INT8) < 40.0
    assert ort_entropy(x, 1024) < 40.0


def test_growing_range_merges_bins_exactly():
    samples = [RNG.standard_normal(20_000).astype(np.float32) * 2.0 ** k for k in range(6)]
    samples.insert(2, np.array([np.nan, np.inf, 0.0], np.float32))
    grown = AbsHistogram(512)
    for s in samples:
        grown.add(s)
    data = np.abs(np.concatenate(samples))
    data = data[np.isfinite(data)]
    assert grown.amax == data.max() and grown.count == data.size and grown.nonfinite == 2
    assert grown.zeros == 1 and grown.edges[-1] >= grown.amax
    # Merging is exact: the counts are those of all the data binned at the final width.
    index = (data.astype(np.float64) / grown.width).astype(int)
    direct = np.bincount(np.minimum(index, 511), minlength=512)
    np.testing.assert_array_equal(grown.hist, direct)
    once = _histogram(data, 512)
    width = max(grown.width, once.width)
    for p in (99.0, 99.99):
        assert abs(calibrate_amax(grown, "percentile", INT8, p)
                   - calibrate_amax(once, "percentile", INT8, p)) <= width
        assert abs(calibrate_amax(grown, "percentile", INT8, p)
                   - np.percentile(data, p, method="inverted_cdf")) <= grown.width


def test_deterministic_and_huge_outlier_is_bounded():
    a, b = AbsHistogram(), AbsHistogram()
    for h in (a, b):
        h.add(np.linspace(-1, 1, 1000))
        h.add(np.array([3e38], np.float32))  # 2**128 times the range: bins still 2048
    np.testing.assert_array_equal(a.hist, b.hist)
    assert a.hist.size == 2048 and a.hist[0] == 1000 and a.amax == float(np.float32(3e38))
    assert calibrate_all(a, INT8) == calibrate_all(b, INT8)


def test_empty_and_all_zero_histograms_give_zero():
    empty = AbsHistogram()
    empty.add(np.array([np.nan, -np.inf]))
    zeros = _histogram(np.zeros(100))
    assert zeros.zeros == 100 and zeros.width == 0.0 and not zeros.edges.any()
    for h in (empty, zeros):
        assert calibrate_all(h, INT8) == dict.fromkeys(CALIBRATORS, 0.0)
    zeros.add(np.array([0.5]))  # the first nonzero value sets the range; zeros stay in bin 0
    assert zeros.hist[0] == 100 and zeros.hist[-1] == 1


def test_errors_name_the_choices():
    h = _histogram(np.ones(10))
    with pytest.raises(ValueError, match="unknown calibrator 'minmax': use one of max, "):
        calibrate_amax(h, "minmax", INT8)
    with pytest.raises(ValueError, match="percentile must be in"):
        calibrate_amax(h, "percentile", INT8, 101.0)
    with pytest.raises(ValueError, match="at least 128 bins"):
        AbsHistogram(64)


def test_every_method_is_fast_on_2048_bins():
    h = _histogram(_gauss_with_outliers())
    for fmt in (INT8, E4M3, E5M2):
        start = time.perf_counter()
        result = calibrate_all(h, fmt)
        assert time.perf_counter() - start < 1.0  # ~30 ms on a laptop core
        assert list(result) == list(CALIBRATORS)
        assert all(0.0 < v <= h.amax for v in result.values())
