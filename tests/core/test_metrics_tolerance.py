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
