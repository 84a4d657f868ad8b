"""Each mechanism of the taxonomy on a tiny model: diagnosed with the right name, node and a
measured cure (the FP32 fallback of the named nodes removes the error)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import parser
from tiny_models import IR_VERSION, S

from precision_doctor.diagnosis.causes.hazards import scan_hazards
from precision_doctor.diagnosis.causes.mechanisms import (
    NodeFacts,
    cancellation_condition,
    exponent_condition,
    name_mechanism,
)
from precision_doctor.diagnosis.diagnose import diagnose
from precision_doctor.formats import Precision
from precision_doctor.layerwise.candidates import emulated
from precision_doctor.precision.plan import PrecisionPlan

FP16 = Precision.FP16


def model(text: str, *initializers: onnx.TensorProto) -> onnx.ModelProto:
    """A model from ONNX text; each node is named after its first output."""
    m = parser.parse_model(text)
    m.ir_version = IR_VERSION
    m.graph.initializer.extend(initializers)
    for node in m.graph.node:
        node.name = node.output[0]
    onnx.checker.check_model(m)
    return m


def run(m: onnx.ModelProto, samples, target: Precision = FP16):
    return diagnose(m, samples, target, emulated(PrecisionPlan(target)), noise=False,
                    rewritten=False)


def samples_of(fn, count=3, seed=0):
    rng = np.random.default_rng(seed)
    return [S(f"s{i}", {"x": fn(rng).astype(np.float32)}) for i in range(count)]


def main_finding(report, kind):
    found = [f for f in report.findings if f.kind == kind and f.group == "main"]
    assert found, [(f.kind, f.node, f.group, f.impact) for f in report.findings]
    return found[0]


VARIANCE = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[4, 64] x) => (float[4, 64] y) {
    mean = ReduceMean <axes = [1]> (x)
    sq = Mul (x, x)
    mean_sq = ReduceMean <axes = [1]> (sq)
    mean2 = Mul (mean, mean)
    var = Sub (mean_sq, mean2)
    zero = Constant <value = float {0.0}> ()
    pos = Max (var, zero)
    eps = Constant <value = float {0.001}> ()
    vare = Add (pos, eps)
    std = Sqrt (vare)
    centered = Sub (x, mean)
    y = Div (centered, std)
}
"""


def test_cancellation_in_a_one_pass_variance():
    """var = E[x^2] - E[x]^2 of values around 30: the two terms (~900) cancel to ~1."""
    report = run(model(VARIANCE), samples_of(lambda r: 30 + r.standard_normal((4, 64))))
    a = report.assessment
    assert report.verdict == "fail" and a.kind == "defect", a.summary
    f = main_finding(report, "cancellation")
    assert f.node == "var" and f.evidence["kappa"] > 100
    assert f.impact > 0.9 and "two-pass" in f.remedy
    assert report.explained_share > 0.9


def test_inaccurate_small_divisor():
    """y = 1e-3 / (x * 1e-3): divisors down to 1e-6 are FP16 subnormals with % errors."""
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 256] x) => (float[1, 256] y) {
        k = Constant <value = float {0.001}> ()
        d = Mul (x, k)
        y = Div (k, d)
    }
    """
    report = run(model(text), samples_of(lambda r: 10 ** r.uniform(-3, 0, (1, 256))))
    assert report.assessment.kind == "defect", report.assessment.summary
    f = main_finding(report, "small-divisor")
    assert f.node == "y" and set(f.nodes) == {"d", "y"}  # the divisor is part of the cure
    assert f.evidence["min_abs_divisor"] < 1e-5 and f.impact > 0.9


def test_exponent_amplification_in_a_softmax_of_large_logits():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[8, 32] x) => (float[8, 32] y) {
        t = Constant <value = float {30.0}> ()
        z = Mul (x, t)
        y = Softmax <axis = 1> (z)
    }
    """
    report = run(model(text), samples_of(lambda r: r.uniform(3.0, 3.2, (8, 32))))  # z: 90-96
    f = main_finding(report, "exponent-amplification")
    assert f.op_type == "Softmax" and f.evidence["kappa"] > 45 and f.impact > 0.9
    assert report.assessment.kind == "defect"


def test_saturation_of_a_sigmoid_read_as_one_minus_p():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 512] x) => (float[1, 512] y) {
        p = Sigmoid (x)
        one = Constant <value = float {1.0}> ()
        q = Sub (one, p)
        y = Log (q)
    }
    """
    report = run(model(text), samples_of(lambda r: r.uniform(3.0, 7.0, (1, 512))))
    f = main_finding(report, "saturation")
    assert f.node == "p" and f.evidence["saturated_share"] >= 0.01
    assert "p" in f.nodes and "q" in f.nodes and f.impact > 0.9


def test_tf32_in_a_large_k_matmul_with_cancelling_products():
    rng = np.random.default_rng(0)
    k = 4096
    w = np.where(np.arange(k) % 2 == 0, 1.0, -1.0).reshape(k, 1) * (1 + 1e-3 * rng.random((k, 1)))
    text = f"""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[2, {k}] x, float[{k}, 1] w) => (float[2, 1] y) {{
        y = MatMul (x, w)
    }}
    """
    m = model(text, onnx.numpy_helper.from_array(w.astype(np.float32), "w"))
    report = run(m, samples_of(lambda r: 1 + 1e-2 * r.standard_normal((2, k))),
                 Precision.TF32)
    f = main_finding(report, "tf32")
    assert f.node == "y" and f.evidence["reduced"] == k and f.impact > 0.9
    assert report.assessment.kind == "defect" and "TF32" in f.remedy


def test_an_unnamed_mechanism_is_said_plainly_with_its_measured_cure():
    """sin(100 x): no rule of the taxonomy covers trigonometric argument reduction."""
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 256] x) => (float[1, 256] y) {
        a = Constant <value = float {100.0}> ()
        z = Mul (x, a)
        y = Sin (z)
    }
    """
    report = run(model(text), samples_of(lambda r: r.uniform(0.5, 1.0, (1, 256))))
    f = main_finding(report, "unnamed-mechanism")
    assert f.node == "y" and f.impact > 0.9 and "no rule" in f.summary
    assert report.assessment.kind == "defect"


def test_an_overflow_absorbed_into_a_wrong_value_is_the_defect():
    """sum(x^2) overflows FP16 and 1/sqrt(inf) = 0 where FP32 gives ~1/2000: finite output,
    every value wrong (Magika's LayerNorm in FP16)."""
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 64] x) => (float[1, 64] y) {
        sq = Mul (x, x)
        ss = ReduceSum <keepdims = 1> (sq, axes)
        n = Constant <value = float {0.015625}> ()
        ms = Mul (ss, n)
        std = Sqrt (ms)
        r = Reciprocal (std)
        y = Mul (x, r)
    }
    """
    m = model(text.replace("(sq, axes)", "(sq, ax)").replace(
        "sq = Mul (x, x)", "sq = Mul (x, x)\n        ax = Constant <value = int64[1] {1}> ()"))
    report = run(m, samples_of(lambda r: 40 * r.standard_normal((1, 64))))
    a = report.assessment
    assert a.kind == "defect" and a.evidence["defect_kind"] == "activation-overflow"
    f = main_finding(report, "activation-overflow")
    assert f.node == "ss" and set(f.nodes) == {"ss", "ms"} and f.impact > 0.99
    assert f.evidence["absorbed_by"] == "r" and "finite but wrong" in f.summary


def test_infinite_constants_are_no_hazard():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 8] x) => (float[1, 8] y) {
        lo = Constant <value = float {-inf}> ()
        big = Constant <value = float {1e6}> ()
        c = Max (x, lo)
        y = Add (c, big)
    }
    """
    hazards = scan_hazards(model(text), FP16)
    out = [h for h in hazards if h.kind == "parameter-out-of-range"]
    assert [h.node for h in out] == ["y"]  # 1e6 is out of range; -inf is -inf in FP16 too


def test_random_inputs_are_said_in_the_headline():
    report = run(model(VARIANCE), [S(f"random[{i}]", s.feeds) for i, s in enumerate(
        samples_of(lambda r: 30 + r.standard_normal((4, 64))))])
    assert report.assessment.summary.startswith("On random inputs only")
    assert "real samples" in report.assessment.remedy


def test_rules_on_plain_numbers():
    a = np.array([1000.0, 2000.0])
    assert cancellation_condition("Sub", [a, a - 1]) == pytest.approx(
        np.linalg.norm(2 * a - 1) / np.sqrt(2))
    assert cancellation_condition("ReduceSum", [np.array([[1.0, -1.0, 1e-3]])], (1,)) \
        == pytest.approx(2.001 / 1e-3)
    assert exponent_condition("Pow", None, None, -0.5) == 0.5
    assert exponent_condition("Exp", np.array([10.0]), np.exp([10.0])) == pytest.approx(10.0)
    # a long reduction: the gain fits sqrt(K) u growth, no other rule applies
    facts = NodeFacts("sum", "ReduceSum", gain=20.0, ref_inputs=[np.ones((1, 4096))],
                      ref_output=np.array([[4096.0]]), axes=(1,), reduced=4096,
                      fp32_accumulation=False)
    assert name_mechanism(facts).kind == "long-reduction"
    # the emulator accumulates in FP32: it never names a long reduction
    assert name_mechanism(replace(facts, fp32_accumulation=True)) is None
    # below the amplifying gain nothing is named (ordinary rounding)
    assert name_mechanism(NodeFacts("n", "Sub", gain=1.5, ref_inputs=[a, a - 1])) is None
    assert math.isfinite(cancellation_condition("Add", [a, -a + 1e-3]))
