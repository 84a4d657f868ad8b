import json

import ml_dtypes
import numpy as np
import pytest
from tiny_models import conv_bn

from precision_doctor.errors import PlanError
from precision_doctor.formats import FORMATS, Precision, round_to
from precision_doctor.precision.plan import NodeDecision, PrecisionPlan


def test_fp16_limits_and_rounding():
    fp16 = FORMATS[Precision.FP16]
    assert fp16.max == 65504.0
    x = np.array([65504, 65520, 1e-8, 3e-8, 1 + 2**-11], np.float32)
    r = round_to(x, Precision.FP16)
    assert r[0] == 65504 and np.isinf(r[1])  # 65520 rounds up past the max: overflow to inf
    assert r[2] == 0.0  # below half the smallest subnormal (2.98e-8): flushed
    assert r[3] == np.float32(np.float16(3e-8))  # subnormal kept
    assert r[4] == 1.0  # tie rounds to even


def test_bf16_matches_ml_dtypes_and_tf32_keeps_fp32_range():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(10000) * np.exp(rng.uniform(-20, 20, 10000))).astype(np.float32)
    assert np.array_equal(round_to(x, Precision.BF16),
                          x.astype(ml_dtypes.bfloat16).astype(np.float32))
    t = round_to(np.array([1e30, 1 + 2**-11, 1 + 3 * 2**-11], np.float32), Precision.TF32)
    assert t[0] == pytest.approx(1e30, rel=2**-10)
    assert t[1] == 1.0 and t[2] == np.float32(1 + 2**-9)


def test_headroom_bits():
    fp16 = FORMATS[Precision.FP16]
    assert fp16.headroom_bits(65504 / 4) == pytest.approx(2.0)
    assert fp16.headroom_bits(1e5) < 0


def test_plan_json_round_trip_and_validation():
    plan = PrecisionPlan(Precision.FP16).keep_fp32(["bn"], "hazard", "var 9.8e7")
    again = PrecisionPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan
    assert again.precision_of("bn") is Precision.FP32
    assert again.precision_of("conv") is Precision.FP16
    plan.validate(conv_bn())
    bad = plan.with_overrides({"bnn": NodeDecision(Precision.FP32, "user")})
    with pytest.raises(PlanError, match="bnn"):
        bad.validate(conv_bn())


def test_plan_rejects_unknown_precision():
    with pytest.raises(PlanError):
        PrecisionPlan.from_dict({"default": "fp8"})
