"""PSNR and SSIM against hand computations and a direct (unoptimized) SSIM."""

import math

import numpy as np
import pytest

from precision_doctor.compare.tasks.image import (
    gaussian_window,
    psnr,
    psnr_per_sample,
    ssim,
    ssim_per_sample,
)
from precision_doctor.errors import MetricError


def test_psnr_hand_computed():
    ref = np.array([[0.0, 1.0], [0.0, 1.0]])
    cand = ref + np.array([[0.1, 0.0], [0.0, -0.1]])
    # MSE = 2 * 0.01 / 4 = 0.005, L = 1 -> 10 log10(200)
    assert math.isclose(psnr({"y": ref}, {"y": cand}), 10 * math.log10(200))
    assert math.isclose(psnr({"y": ref}, {"y": cand}, data_range=2.0), 10 * math.log10(800))
    assert psnr({"y": ref}, {"y": ref.copy()}) == math.inf
    bad = cand.copy()
    bad[0, 0] = np.nan
    assert psnr({"y": ref}, {"y": bad}) == -math.inf


def test_psnr_needs_range_for_constant_reference():
    with pytest.raises(MetricError, match="data_range"):
        psnr({"y": np.ones((4, 4))}, {"y": np.zeros((4, 4))})
    assert math.isclose(psnr({"y": np.ones((4, 4))}, {"y": np.zeros((4, 4))}, data_range=1.0), 0.0)


def test_psnr_per_sample_nhwc():
    ref = np.zeros((2, 3, 3, 2))
    ref[0, 0, 0, 0] = 1.0
    cand = ref.copy()
    cand[1] += 0.1
    per = psnr_per_sample(ref, cand, layout="nhwc")
    assert per[0] == math.inf and math.isclose(per[1], 20.0)


def _ssim_direct(x, y, peak):
    """Wang et al. 2004 eq. 13 evaluated window by window (loops)."""
    g = gaussian_window()
    w = np.outer(g, g)
    c1, c2 = (0.01 * peak) ** 2, (0.03 * peak) ** 2
    vals = []
    for i in range(x.shape[0] - 10):
        for j in range(x.shape[1] - 10):
            a, b = x[i:i + 11, j:j + 11], y[i:i + 11, j:j + 11]
            mx, my = (w * a).sum(), (w * b).sum()
            vx, vy = (w * (a - mx) ** 2).sum(), (w * (b - my) ** 2).sum()
            cxy = (w * (a - mx) * (b - my)).sum()
            num = (2 * mx * my + c1) * (2 * cxy + c2)
            vals.append(num / ((mx**2 + my**2 + c1) * (vx + vy + c2)))
    return float(np.mean(vals))


def test_ssim_matches_direct_window_computation():
    rng = np.random.default_rng(0)
    x = rng.random((2, 2, 16, 14))
    y = np.clip(x + rng.normal(0, 0.1, x.shape), 0, 1)
    per = ssim_per_sample(x, y, data_range=1.0)
    expected = [np.mean([_ssim_direct(x[n, c], y[n, c], 1.0) for c in range(2)]) for n in range(2)]
    assert np.allclose(per, expected, rtol=1e-10)
    assert math.isclose(ssim({"y": x}, {"y": y}, data_range=1.0), float(np.mean(expected)))


def test_ssim_identity_window_and_errors():
    g = gaussian_window()
    assert len(g) == 11 and math.isclose(g.sum(), 1.0) and g.argmax() == 5
    x = np.random.default_rng(1).random((12, 12))
    assert math.isclose(ssim({"y": x}, {"y": x.copy()}), 1.0)
    bad = x.copy()
    bad[3, 3] = np.inf
    assert ssim({"y": x}, {"y": bad}) == 0.0
    with pytest.raises(MetricError, match="at least 11x11"):
        ssim({"y": np.ones((8, 8))}, {"y": np.ones((8, 8))}, data_range=1.0)
    with pytest.raises(MetricError, match="layout"):
        ssim({"y": x}, {"y": x}, layout="chw")
