import math

import numpy as np
import pytest

from precision_doctor.compare.metrics import compute_metrics, relative_l2
from precision_doctor.compare.tolerance import (
    Tolerance,
    check,
    default_tolerance,
    elementwise_pass_share,
)
from precision_doctor.formats import Precision


def test_metrics_definitions():
    r = [np.array([[3.0, 4.0]], np.float32)]
    c = [np.array([[3.0, 4.5]], np.float32)]
    m = compute_metrics(r, c)
    assert m.max_abs == pytest.approx(0.5)
    assert m.rel_l2 == pytest.approx(0.5 / 5.0)
    assert m.snr_db == pytest.approx(10 * math.log10(25 / 0.25))
    assert m.argmax_agreement == 1.0
    assert relative_l2(r, c) == pytest.approx(0.1)


def test_nan_in_candidate_fails_and_variable_shapes_concatenate():
    r = [np.ones((1, 2)), np.ones((1, 3))]
    c = [np.ones((1, 2)), np.array([[1, np.nan, 1]])]
    m = compute_metrics(r, c)
    assert m.nan == 1 and math.isinf(m.rel_l2) and m.numel == 5
    ok, reason = check(m, default_tolerance(Precision.FP16))
    assert not ok and "NaN" in reason


def test_tolerance_parse_and_elementwise_share():
    tol = Tolerance.parse("rel_l2=none,atol=0.1,rtol=0,statistic=p90")
    r = [np.zeros(10)]
    c = [np.array([0.0] * 9 + [1.0])]
    share = elementwise_pass_share(r, c, tol)
    assert share == pytest.approx(0.9)
    assert check(compute_metrics(r, c), tol, share)[0]
    with pytest.raises(ValueError):
        Tolerance.parse("bogus=1")
    assert default_tolerance(Precision.BF16).rel_l2 > default_tolerance(Precision.FP16).rel_l2


def test_one_pass_statistics_equal_the_whole_set_definitions():
    """Per-sample streaming (``compute_metrics``) against the definitions computed over the
    concatenation of all samples, with NaN/Inf in the reference and the candidate, an empty
    sample and samples of different shapes."""
    rng = np.random.default_rng(3)
    r = [rng.standard_normal((2, 5)).astype(np.float32), np.zeros((0, 5), np.float32),
         rng.standard_normal((3, 5)).astype(np.float32)]
    c = [x + np.float32(1e-2) * rng.standard_normal(x.shape).astype(np.float32) for x in r]
    r[0][0, 1], r[2][1, 3] = np.inf, np.nan       # 2 non-finite reference values
    c[0][1, 2], c[2][0, 0] = np.nan, -np.inf      # 1 NaN, 1 Inf in the candidate
    m = compute_metrics(r, c)
    rr = np.concatenate([x.ravel() for x in r]).astype(np.float64)
    cc = np.concatenate([x.ravel() for x in c]).astype(np.float64)
    ok = np.isfinite(rr) & np.isfinite(cc)
    e = np.abs(cc[ok] - rr[ok])
    assert (m.numel, m.ref_nonfinite, m.nan, m.inf) == (25, 2, 1, 1)
    assert math.isinf(m.rel_l2)  # a non-finite candidate fails the relative L2
    assert m.max_abs == pytest.approx(e.max(), rel=1e-12)
    assert m.mean_abs == pytest.approx(e.mean(), rel=1e-12)
    assert m.median_abs == pytest.approx(np.median(e), rel=1e-12)
    assert m.p99_abs == pytest.approx(np.quantile(e, 0.99), rel=1e-12)
    assert m.ref_max_abs == pytest.approx(np.abs(rr[ok]).max(), rel=1e-12)
    d = cc[ok] - rr[ok]
    cos = np.dot(cc[ok], rr[ok]) / math.sqrt(np.dot(cc[ok], cc[ok]) * np.dot(rr[ok], rr[ok]))
    assert m.cosine == pytest.approx(cos, rel=1e-12)
    assert m.snr_db == pytest.approx(10 * math.log10(np.dot(rr[ok], rr[ok]) / np.dot(d, d)),
                                     rel=1e-12)
