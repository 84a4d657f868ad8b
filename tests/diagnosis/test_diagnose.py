import json
import math

import pytest
from onnx import TensorProto, helper
from tiny_models import conv_bn, make_model, random_samples, transformer_block

from precision_doctor.compare.tolerance import Tolerance
from precision_doctor.diagnosis.diagnose import diagnose
from precision_doctor.diagnosis.report import DiagnosisReport
from precision_doctor.errors import ReferenceError_
from precision_doctor.formats import Precision
from precision_doctor.layerwise.candidates import emulated
from precision_doctor.precision.plan import PrecisionPlan


def _diagnose(model, samples, target=Precision.FP16, **kw):
    return diagnose(model, samples, target, emulated(PrecisionPlan(target)), **kw)


def test_layernorm_overflow_is_found_at_the_pow_where_inf_is_born():
    """Field reports 1/2: a ~1000 activation before a decomposed LayerNorm (opset 13)."""
    model = transformer_block(hot_value=1000.0, opset=13)
    report = _diagnose(model, random_samples((1, 8, 16)))
    assert report.verdict == "fail"
    assert report.layerwise.nan_birth == "d2"
    top = report.findings[0]
    assert top.kind == "activation-overflow"
    assert top.node == "ln/pow"
    assert "born here" in top.summary
    assert top.impact == pytest.approx(1.0, abs=0.05)  # keeping the Pow in FP32 fixes it
    pow_rec = report.layerwise.record("d2")
    assert pow_rec.overflow > 0 and pow_rec.headroom_bits < 0
    assert any(h.kind == "decomposed-layernorm" and "ln/pow" in h.nodes for h in report.hazards)


def test_small_activations_pass_fp16_and_report_round_trips():
    model = transformer_block(hot_value=1.0)
    report = _diagnose(model, random_samples((1, 8, 16)))
    assert report.verdict == "pass", [o.reason for o in report.outputs]
    assert report.layerwise.first_divergence is None
    data = json.loads(json.dumps(report.to_dict()))
    assert DiagnosisReport.from_dict(data).to_dict() == report.to_dict()
    assert data["schema"] == "precision-doctor/diagnosis" and data["schema_version"] == 3
    assert data["assessment"]["kind"] == "within-tolerance"


def test_batchnorm_variance_out_of_range_is_named():
    report = _diagnose(conv_bn(), random_samples((1, 3, 8, 8)))
    assert report.verdict == "fail"
    kinds = {(f.kind, f.node, f.tensor) for f in report.findings}
    assert ("parameter-out-of-range", "bn", "v") in kinds
    bn = next(f for f in report.findings if f.kind == "parameter-out-of-range")
    assert bn.evidence["max_abs"] > 65504
    assert bn.impact == pytest.approx(1.0, abs=0.05)


def test_layerwise_chunking_does_not_change_results():
    model = transformer_block(hot_value=300.0)
    samples = random_samples((1, 8, 16))
    whole = _diagnose(model, samples, noise=False, measure_impact=False)
    chunked = _diagnose(model, samples, noise=False, measure_impact=False, budget_bytes=1024)
    assert chunked.layerwise.chunks > whole.layerwise.chunks
    # marking other outputs may change ORT's fusions: equal up to float32 rounding
    for a, b in zip(chunked.layerwise.records, whole.layerwise.records):
        assert (a.tensor, a.numel, a.overflow) == (b.tensor, b.numel, b.overflow)
        assert a.rel_l2 == pytest.approx(b.rel_l2, rel=1e-4, abs=1e-6)
        assert a.ref_max_abs == pytest.approx(b.ref_max_abs, rel=1e-5)
    assert len(chunked.layerwise.records) == len(whole.layerwise.records)


def test_reference_nan_is_a_clear_error():
    nodes = [helper.make_node("Log", ["x"], ["y"], name="log")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    samples = random_samples((4,), count=1)  # negative values -> log = NaN in FP32
    with pytest.raises(ReferenceError_, match="NaN/Inf in output 'y'"):
        _diagnose(model, samples)


def test_tolerance_and_noise_floor_in_verdict():
    model = transformer_block(hot_value=20.0)
    samples = random_samples((1, 8, 16))
    strict = _diagnose(model, samples, tolerances=Tolerance(rel_l2=1e-9), layerwise=False)
    out = strict.outputs[0]
    assert out.noise_floor is not None and out.noise_floor >= 0
    assert not out.passed or "noise floor" in out.reason
    loose = _diagnose(model, samples, tolerances=Tolerance(rel_l2=0.5), layerwise=False)
    assert loose.verdict == "pass"
    assert math.isfinite(loose.outputs[0].metrics.snr_db)


def test_fp32_engine_mismatch_is_localized_and_blamed_on_tf32():
    """Field report 3: an "FP32" engine with TF32 left on differs from ONNX Runtime CPU."""
    from dataclasses import replace

    model = transformer_block(hot_value=30.0)
    tf32_engine = replace(emulated(PrecisionPlan(Precision.TF32)), name="engine-fp32", plan=None,
                          tf32=True)
    report = diagnose(model, random_samples((1, 8, 16)), Precision.FP32, tf32_engine,
                      noise=False)
    assert report.verdict == "fail"
    mismatch = [f for f in report.findings if f.kind == "reference-mismatch"]
    assert mismatch and mismatch[0].node == "fc1/matmul"
    assert mismatch[0].evidence["cause"] == "tf32"


def test_fused_emulation_models_an_engine_that_folds_batchnorm():
    from precision_doctor.layerwise.candidates import emulated_fused

    model = conv_bn()
    plan = PrecisionPlan(Precision.FP16)
    fused = diagnose(model, random_samples((1, 3, 8, 8)), Precision.FP16,
                     emulated_fused(model, plan), noise=False)
    assert fused.verdict == "pass"  # folded: the variance 9.8e7 never exists in FP16
    assert fused.candidate == "emulate-fused-fp16"


def test_measure_impact_false_runs_no_extra_evaluation():
    """The fix review diagnoses the written model with measure_impact=False: findings keep no
    measured impact, no attribution runs, and only hard events can make a defect."""
    report = _diagnose(conv_bn(), random_samples((1, 3, 8, 8)), noise=False,
                       measure_impact=False)
    assert report.verdict == "fail" and report.findings
    assert all(f.impact is None for f in report.findings)
    assert report.explained_share is None and report.attribution is None
    assert "findings" in report.timings_s and "attribution" not in report.timings_s
