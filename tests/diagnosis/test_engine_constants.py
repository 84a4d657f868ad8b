"""A -FLT_MAX mask: diagnose says which engines fail it (strongly typed Cast) and which do not
(TensorRT, onnxconverter-common clamp it), measured; fix cures it with 0 FP32 nodes."""

from __future__ import annotations

import pytest
from mask_models import arithmetic_constant, attention, feeds
from tiny_models import conv_bn, random_samples

from precision_doctor.diagnosis.causes.engine_constants import engine_verdicts
from precision_doctor.diagnosis.causes.hazards import scan_hazards
from precision_doctor.diagnosis.diagnose import diagnose
from precision_doctor.formats import Precision
from precision_doctor.inputs.feeds import Sample
from precision_doctor.layerwise.candidates import emulated, reference_factory, run_samples
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.repair.pipeline import fix
from precision_doctor.search.objective import Objective


def _samples(variant: str, masked_row: bool = False) -> list[Sample]:
    return [Sample(f"s{i}", feeds(variant, i, masked_row=masked_row and i == 0))
            for i in range(2)]


@pytest.mark.parametrize("variant", ["mul", "where"])
def test_hazard_names_each_engines_conversion(variant):
    (h,) = [h for h in scan_hazards(attention(variant), Precision.FP16)
            if h.kind == "parameter-out-of-range"]
    assert "strongly typed Cast makes them -inf (this verdict's assumption)" in h.detail
    assert "TensorRT to -65504 and onnxconverter-common to -10000 clamp them" in h.detail
    assert h.evidence["masking_only"] is True and "saturate-constants" in h.detail
    assert h.evidence["clamped_by"] == "tensorrt, onnxconverter-common"
    assert "TensorRT: clamped to -65504 with a warning" in h.evidence["engines"]


def test_batchnorm_variance_is_not_a_mask():
    (h,) = [h for h in scan_hazards(conv_bn(), Precision.FP16)
            if h.kind == "parameter-out-of-range"]
    assert h.evidence["masking_only"] is False and "saturate-constants" not in h.detail


@pytest.mark.parametrize("variant,masked_row", [("mul", False), ("where", True)])
def test_verdict_per_engine_measured(variant, masked_row):
    model, samples = attention(variant), _samples(variant, masked_row)
    plan = PrecisionPlan(Precision.FP16)
    report = diagnose(model, samples, Precision.FP16, emulated(plan), noise=False)
    assert report.assessment.kind == "defect"
    finding = next(f for f in report.findings if f.kind == "parameter-out-of-range")
    assert "saturate-constants" in finding.remedy
    reference = run_samples(reference_factory(model), samples, ["y"])
    out = engine_verdicts(model, samples, plan, reference, {"y": 1e-2}, report.findings,
                          engine="tensorrt")
    judged = next(f for f in out if f.kind == "parameter-out-of-range")
    assert judged.evidence["clamped_passes"] is True
    assert judged.evidence["clamped_error"] < 1e-2
    assert "strongly typed Cast: fail" in judged.evidence["verdicts"]
    assert "TensorRT: pass" in judged.evidence["verdicts"]
    assert judged.evidence["engine_verdict"] == "pass"
    assert "TensorRT's users see no failure" in judged.summary
    strongly = engine_verdicts(model, samples, plan, reference, {"y": 1e-2}, report.findings,
                               engine="strongly-typed")
    assert next(f for f in strongly if f.kind == "parameter-out-of-range"
                ).evidence["engine_verdict"] == "fail (as assumed)"


def test_batchnorm_variance_is_folded_as_tensorrt_builds():
    """conv_bn's 9.8e7 BatchNorm variance: TensorRT folds the BatchNorm into the Conv in FP32
    before converting weights, so it never clamps it: the build passes."""
    model, samples = conv_bn(), random_samples((1, 3, 8, 8))
    plan = PrecisionPlan(Precision.FP16)
    reference = run_samples(reference_factory(model), samples, ["y"])
    report = diagnose(model, samples, Precision.FP16, emulated(plan), noise=False)
    out = engine_verdicts(model, samples, plan, reference, {"y": 1e-2}, report.findings)
    judged = next(f for f in out if f.kind == "parameter-out-of-range")
    assert judged.evidence["clamped_passes"] is True
    assert "BatchNorm folded" in judged.summary
    assert "engine_verdict" not in judged.evidence


def test_clamping_that_does_not_cure_says_so():
    """x * 1e5 feeding a MatMul: clamped to 65504 it still overflows (and is another model)."""
    model = arithmetic_constant()
    samples = random_samples((1, 4), scale=3.0)
    plan = PrecisionPlan(Precision.FP16)
    reference = run_samples(reference_factory(model), samples, ["y"])
    report = diagnose(model, samples, Precision.FP16, emulated(plan), noise=False)
    assert report.verdict == "fail"
    out = engine_verdicts(model, samples, plan, reference, {"y": 1e-2}, report.findings)
    judged = next(f for f in out if f.kind == "parameter-out-of-range")
    assert judged.evidence["clamped_passes"] is False
    assert "fails under TensorRT too" in judged.summary


@pytest.mark.parametrize("variant,masked_row", [("mul", False), ("where", True)])
def test_fix_needs_no_fp32_node(variant, masked_row):
    result = fix(attention(variant), _samples(variant, masked_row), Precision.FP16,
                 Objective())
    assert result.passed and result.search.kept == ()
    assert result.share["fp32_nodes"] == 0 and not result.plan.overrides
    (record,) = [r for r in result.rewrites["records"] if r["rule"] == "saturate-constants"]
    assert record["applied"] and record["details"]["format_max"] == 65504.0
    without = fix(attention(variant), _samples(variant, masked_row), Precision.FP16,
                  Objective(), rewrites=["prescale-attention"])
    assert without.share["fp32_nodes"] >= 1  # the mask node stays FP32 (hazard)


def test_api_diagnose_states_the_engines_verdict():
    import precision_doctor as pd

    model = attention("mul")
    diagnosis = pd.diagnose(model, [feeds("mul", 0), feeds("mul", 1)], target="fp16",
                            engine="ort-cuda")
    finding = next(f for f in diagnosis.findings if f.kind == "parameter-out-of-range")
    assert "TensorRT: pass" in finding.evidence["verdicts"]
    assert "Under --engine ort-cuda: as written" in finding.summary


def test_a_passing_diagnosis_measures_nothing():
    model, samples = attention("where"), _samples("where")  # no fully masked row: no NaN
    plan = PrecisionPlan(Precision.FP16)
    report = diagnose(model, samples, Precision.FP16, emulated(plan), noise=False)
    assert report.verdict == "pass"
    reference = run_samples(reference_factory(model), samples, ["y"])
    out = engine_verdicts(model, samples, plan, reference, {"y": 1e-2}, report.findings,
                          engine="strongly-typed", failing=False)
    judged = next(f for f in out if f.kind == "parameter-out-of-range")
    assert "clamped_error" not in judged.evidence
    assert judged.evidence["engine_verdict"] == "pass (as assumed)"
    assert "TensorRT: not measured (the assumed conversion passes)" in judged.evidence["verdicts"]


def test_fix_notes_the_clamp():
    result = fix(attention("mul"), _samples("mul"), Precision.FP16, Objective())
    assert any(n.startswith("saturate-constants clamped") for n in result.notes)
