"""saturate-constants: a -FLT_MAX mask constant is clamped to the format's range; nothing else."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from mask_models import FLT_MIN, arithmetic_constant, attention, feeds
from onnx import numpy_helper

from precision_doctor.formats import FORMATS, Precision
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.precision.rewrites import apply_rewrites
from precision_doctor.runners.emulator import EmulatorRunner

RULE = ["saturate-constants"]


def _fill(model) -> float:
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return float(next(v for k, v in inits.items() if k.startswith("fill")))


def _fp32(model, f):
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, f)[0]


def _fp16(model, f):
    with EmulatorRunner(model, PrecisionPlan(Precision.FP16)) as runner:
        return runner.run(f)["y"]


@pytest.mark.parametrize("variant", ["mul", "where"])
@pytest.mark.parametrize("target", [Precision.FP16, Precision.BF16])
def test_mask_constant_clamped_to_the_format_max(variant, target):
    model, report = apply_rewrites(attention(variant), RULE, target=target)
    (record,) = report.applied("saturate-constants")
    assert _fill(model) == pytest.approx(-FORMATS[target].max, rel=1e-7)
    assert record.details["value"] == FLT_MIN and record.details["target"] == target.value
    assert "only masks" in record.reason


@pytest.mark.parametrize("variant,masked_row", [("mul", False), ("where", True)])
def test_fp16_nan_cured_and_fp32_unchanged(variant, masked_row):
    """-FLT_MAX is -inf in FP16 (0 x -inf = NaN; an all -inf row's softmax is NaN); -65504 is
    finite, and in FP32 exp(-65504 - max) underflows to 0 like exp(-FLT_MAX - max)."""
    model = attention(variant)
    f = feeds(variant, masked_row=masked_row)
    assert np.isnan(_fp16(model, f)).any()
    saturated, _ = apply_rewrites(model, RULE, target=Precision.FP16)
    assert np.array_equal(_fp32(model, f), _fp32(saturated, f))
    out = _fp16(saturated, f)
    ref = _fp32(model, f)
    assert np.isfinite(out).all()
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-2


def test_no_target_no_change():
    model, report = apply_rewrites(attention("mul"), RULE)
    assert not report.changed and report.records == ()
    assert _fill(model) == FLT_MIN


def test_constant_feeding_arithmetic_is_left_alone():
    model, report = apply_rewrites(arithmetic_constant(), RULE, target=Precision.FP16)
    (record,) = report.skipped("saturate-constants")
    assert "MatMul 'mm'" in record.reason and "does not only mask" in record.reason
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert float(inits["big"]) == 1e5


def test_constant_in_range_is_not_a_candidate():
    # BF16 holds 1e5: nothing to clamp, no record
    _, report = apply_rewrites(arithmetic_constant(), RULE, target=Precision.BF16)
    assert report.records == ()


@pytest.mark.parametrize("attr", ["value", "value_float"])
def test_constant_node_mask(attr):
    """Exporters also write the fill as a Constant node (a tensor or ``value_float``)."""
    from onnx import helper

    from precision_doctor.precision.constants import clamp_constants

    model = attention("mul")
    fill = next(t for t in model.graph.initializer if t.name == "fill")
    model.graph.initializer.remove(fill)
    value = (helper.make_attribute("value", numpy_helper.from_array(np.float32(FLT_MIN)))
             if attr == "value" else helper.make_attribute("value_float", FLT_MIN))
    node = helper.make_node("Constant", [], ["fill"], name="fill_const")
    node.attribute.append(value)
    model.graph.node.insert(0, node)
    saturated, report = apply_rewrites(model, RULE, target=Precision.FP16)
    assert report.applied("saturate-constants")
    assert _fill(saturated) == -65504.0
    assert "fill_const" not in {n.name for n in saturated.graph.node}
    clamped, names = clamp_constants(model, Precision.FP16)
    assert names == ("fill",)
    f = feeds("mul")
    assert np.array_equal(_fp32(clamped, f), _fp32(saturated, f))
