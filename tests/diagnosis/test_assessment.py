"""One test per assessment class, on small models built here."""

from dataclasses import replace

import numpy as np
import pytest
from onnx import TensorProto, helper
from rich.console import Console
from tiny_models import S, conv_bn, make_model, random_samples, tensor, transformer_block

from precision_doctor.compare.tolerance import Tolerance
from precision_doctor.diagnosis.assess import assess
from precision_doctor.diagnosis.assessment import (
    AssessmentInputs,
    catastrophic_gain,
    rounding_depth,
)
from precision_doctor.diagnosis.diagnose import diagnose
from precision_doctor.diagnosis.report import DiagnosisReport
from precision_doctor.formats import Precision
from precision_doctor.layerwise.candidates import emulated
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.report.html import render_html
from precision_doctor.report.terminal.diagnosis import render_diagnosis

F = TensorProto.FLOAT
FP16 = Precision.FP16


def _diagnose(model, samples, **kw):
    return diagnose(model, samples, FP16, emulated(PrecisionPlan(FP16)), **kw)


def mlp(depth=12, width=8):
    """MatMul -> Tanh, ``depth`` times: well conditioned, only rounding error."""
    rng = np.random.default_rng(3)
    nodes, inits, x = [], [], "x"
    for i in range(depth):
        inits.append(tensor(f"w{i}", rng.normal(0, 1 / np.sqrt(width), (width, width))))
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
                  helper.make_node("Tanh", [f"m{i}"], [f"t{i}"], name=f"tanh{i}")]
        x = f"t{i}"
    nodes.append(helper.make_node("Identity", [x], ["y"], name="out"))
    return make_model(nodes, [helper.make_tensor_value_info("x", F, [1, 4, width])],
                      [helper.make_tensor_value_info("y", F, [1, 4, width])], inits)


def classifier(classes=4):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["z"], name="fc"),
             helper.make_node("Softmax", ["z"], ["p"], name="softmax", axis=-1)]
    return make_model(nodes, [helper.make_tensor_value_info("x", F, [1, classes])],
                      [helper.make_tensor_value_info("p", F, [1, classes])],
                      [tensor("w", np.eye(classes) * 1.0001)])


def test_within_tolerance():
    report = _diagnose(transformer_block(hot_value=1.0), random_samples((1, 8, 16)))
    a = report.assessment
    assert report.verdict == "pass" and a.kind == "within-tolerance"
    assert a.evidence["worst_rel_l2"] < 1e-2 and "meet their tolerance" in a.summary


def test_rounding_when_a_well_conditioned_model_misses_a_tight_tolerance():
    model = mlp()
    report = _diagnose(model, random_samples((1, 4, 8), count=3),
                       tolerances=Tolerance(rel_l2=1e-4))
    a = report.assessment
    assert report.verdict == "fail" and a.kind == "rounding"
    assert a.evidence["depth"] == rounding_depth(model) == 24  # MatMul and Tanh round
    assert a.evidence["expected_rel_l2"] == pytest.approx(np.sqrt(24) * 2.0 ** -11)
    assert a.evidence["max_local_gain"] < catastrophic_gain(FP16)
    assert not a.nodes and "fix" in a.remedy
    assert not any(f.kind == "activation-overflow" for f in report.findings)


def test_decision_flips_at_a_near_tie_carry_the_error():
    samples = []
    for i in range(40):  # clear decisions: saturated softmax, no FP16 error
        x = np.zeros((1, 4), np.float32)
        x[0, i % 4] = 40.0
        samples.append(S(f"img{i}.png", {"x": x}))
    samples.append(S("tie.png", {"x": np.array([[8.0, 8.0039, 0, 0]], np.float32)}))
    report = _diagnose(classifier(), samples, tolerances=Tolerance(rel_l2=1e-4))
    a = report.assessment
    assert report.verdict == "fail" and a.kind == "decision-flips"
    (flip,) = report.decision_flips
    assert (flip.sample, flip.position, flip.task_changed) == ("tie.png", (0,), True)
    assert flip.fp32_margin < 0.01 and flip.error_share == pytest.approx(1.0)
    assert flip.fp32_noise is not None and flip.fp32_noise < flip.fp32_margin
    assert a.evidence["rel_l2_without_flips"] == pytest.approx(0.0, abs=1e-9)
    assert "--metric top1" in a.remedy
    html = render_html(report)
    assert "Decision flips" in html and "tie.png" in html and "decision-flips" in html


def test_defect_batchnorm_variance_named_once_with_joint_share_and_rewrite():
    report = _diagnose(conv_bn(), random_samples((1, 3, 8, 8)))
    a = report.assessment
    assert a.kind == "defect" and a.nodes == ("bn",)
    assert report.explained_share >= 0.9 and a.explained_share == report.explained_share
    main = [f for f in report.findings if f.group == "main"]
    assert [(f.kind, f.node) for f in main] == [("parameter-out-of-range", "bn")]
    assert sum(f.node == "bn" for f in report.findings) == 1  # strongest cause only
    # the Conv peaks close to the FP16 max without overflowing: a headroom warning
    conv = [f for f in report.findings if f.node == "conv"]
    assert [f.kind for f in conv] == ["headroom"] and conv[0].group == "minor"
    assert report.rewritten["verdict"] == "pass"
    assert report.rewritten["rewrites"] == ["fold-batchnorm (1)"]
    assert "fold-batchnorm" in a.summary and report.largest_jump == "bn"


def test_defect_activation_overflow_at_the_pow_of_a_decomposed_layernorm():
    report = _diagnose(transformer_block(hot_value=1000.0), random_samples((1, 8, 16)))
    a = report.assessment
    assert a.kind == "defect" and report.explained_share >= 0.9
    assert a.evidence["defect_kind"] == "activation-overflow"
    assert a.evidence["defect_node"] == "ln/pow" and "ln/pow" in a.nodes
    assert report.largest_jump == "d2"  # Inf is born at the Pow


def test_defect_without_impact_measurement_from_hard_events():
    """A real engine (no plan): NaN/Inf in the outputs and an overflow are enough."""
    engine = replace(emulated(PrecisionPlan(FP16)), name="engine", plan=None)
    report = diagnose(transformer_block(hot_value=1000.0), random_samples((1, 8, 16)), FP16,
                      engine, noise=False)
    assert report.assessment.kind == "defect" and report.explained_share is None
    assert report.rewritten is None


def test_report_round_trips_and_renders_the_assessment_first(tmp_path):
    report = _diagnose(conv_bn(), random_samples((1, 3, 8, 8)))
    data = report.to_dict()
    assert data["schema_version"] == 3 and data["assessment"]["kind"] == "defect"
    assert data["layerwise"]["largest_jump"] == "bn"
    assert {f["group"] for f in data["findings"]} == {"main", "minor"}
    again = DiagnosisReport.from_dict(data)
    assert again.to_dict() == data and again.assessment == report.assessment
    v1 = {**data, "schema_version": 1}
    for key in ("assessment", "explained_share", "decision_flips", "decisions", "rewritten"):
        v1.pop(key)
    old = DiagnosisReport.from_dict(v1)
    assert old.assessment is None and old.decision_flips == ()
    console = Console(width=80, record=True)
    render_diagnosis(report, console, layers=0)
    text = console.export_text()
    assert text.index("Assessment: defect") < text.index("Outputs")
    assert "…" not in text.split("Outputs")[0]


def test_assess_rules_on_plain_inputs():
    base = AssessmentInputs(False, (("y", 0.04, 0.01, False, 0),), FP16, depth=100,
                            measured=True)
    assert assess(base).kind == "rounding"  # 8.2x the sqrt(100) u expectation
    far = replace(base, outputs=(("y", 0.5, 0.01, False, 0),))
    assert assess(far).kind == "unexplained"  # 102x: not ordinary rounding
    assert assess(far).remedy.startswith("do not loosen") and "fix" in assess(far).remedy
    random = assess(replace(base, synthetic=True))
    assert random.summary.startswith("On random inputs only") and "real samples" in random.remedy
    assert assess(replace(base, passed=True)).kind == "within-tolerance"
    nan = replace(base, outputs=(("y", float("inf"), 0.01, False, 3),), measured=False)
    assert assess(nan).kind == "defect"


def conv_classifier(classes=10):
    """Conv -> BatchNorm (ordinary statistics) -> Relu -> GlobalAveragePool -> Gemm ->
    Softmax: a classifier with nothing out of range."""
    rng = np.random.default_rng(7)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["bn"], name="bn"),
        helper.make_node("Relu", ["bn"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["z"], name="fc", transB=1),
        helper.make_node("Softmax", ["z"], ["p"], name="softmax", axis=-1),
    ]
    inits = [tensor("w", rng.normal(0, 0.3, (8, 3, 3, 3))), tensor("g", np.ones(8)),
             tensor("b", np.zeros(8)), tensor("m", rng.normal(0, 0.1, 8)),
             tensor("v", rng.uniform(0.5, 2, 8)), tensor("fc_w", rng.normal(0, 1, (classes, 8))),
             tensor("fc_b", np.zeros(classes))]
    return make_model(nodes, [helper.make_tensor_value_info("x", F, [1, 3, 16, 16])],
                      [helper.make_tensor_value_info("p", F, [1, classes])], inits)


@pytest.mark.parametrize("tolerance", [None, Tolerance(rel_l2=1e-5)])
def test_classifier_in_range_is_never_a_defect(tolerance):
    report = _diagnose(conv_classifier(), random_samples((1, 3, 16, 16), count=4),
                       tolerances=tolerance)
    assert report.assessment.kind in ("within-tolerance", "rounding", "decision-flips")
    (d,) = report.decisions
    assert d.kind == "class-probabilities" and d.suggested_metric == "top1"
    if tolerance is None:
        assert report.assessment.kind == "within-tolerance"
