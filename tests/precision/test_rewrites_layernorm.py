"""fuse-layernorm on tiny decomposed LayerNorms written in ONNX text."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest

from precision_doctor.precision.rewrites import apply_rewrites

RNG = np.random.default_rng(1)
GAMMA = "<float[4] gamma = {0.5, 1.0, 1.5, 2.0}, float[4] beta = {0.1, -0.2, 0.3, 0.0}>"


def _model(body: str, opset: int = 17, inputs: str = "float[2, 3, 4] x",
           initializers: str = GAMMA) -> onnx.ModelProto:
    text = f"""
    <ir_version: 8, opset_import: ["" : {opset}], producer_name: "unit", doc_string: "tiny LN">
    g ({inputs}) => (float[2, 3, 4] y) {initializers} {{
        {body}
    }}"""
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model)
    return model


def _decomposed(axes: str = "[-1]", square: str = "Pow(d, two)", normalize: str = "Div(d, std)",
                eps: str = "Constant<value = float {1e-5}>()", tail: str = "ng = Mul(n, gamma)\n"
                "y = Add(ng, beta)", reduce_axes_as_input: bool = False) -> str:
    if reduce_axes_as_input:  # opset >= 18
        head = "ax = Constant<value = int64[1] {-1}>()\n        mean = ReduceMean(x, ax)"
        var = "var = ReduceMean(sq, ax)"
    else:
        head = f"mean = ReduceMean<axes = {axes}>(x)"
        var = f"var = ReduceMean<axes = {axes}>(sq)"
    return f"""
        {head}
        d = Sub(x, mean)
        two = Constant<value = float {{2.0}}>()
        sq = {square}
        {var}
        eps = {eps}
        ve = Add(var, eps)
        std = Sqrt(ve)
        n = {normalize}
        {tail}"""


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _assert_fused(model: onnx.ModelProto, **kwargs) -> tuple[onnx.ModelProto, object]:
    out, report = apply_rewrites(model, ["fuse-layernorm"], **kwargs)
    onnx.checker.check_model(out, full_check=True)
    ops = [n.op_type for n in out.graph.node]
    assert ops.count("LayerNormalization") == 1, (ops, report.records)
    assert not {"ReduceMean", "Sqrt", "Sub"} & set(ops)
    assert out.graph.output[0].name == "y" and out.producer_name == "unit"
    x = RNG.normal(size=(2, 3, 4)).astype(np.float32) * 3 + 1
    a, b = _run(model, x), _run(out, x)
    assert np.linalg.norm(b - a) / np.linalg.norm(a) < 1e-6
    return out, report


@pytest.mark.parametrize("opset", [12, 17])
def test_decomposed_layernorm_fused(opset: int) -> None:
    out, report = _assert_fused(_model(_decomposed(), opset=opset))
    assert report.opset_after == 17
    ln = next(n for n in out.graph.node if n.op_type == "LayerNormalization")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in ln.attribute}
    assert attrs["axis"] == -1 and attrs["epsilon"] == pytest.approx(1e-5)
    [record] = report.applied("fuse-layernorm")
    assert record.new_nodes == (ln.name,) and len(record.nodes) >= 9
    assert (len(report.applied("convert-opset")) == 1) == (opset == 12)


@pytest.mark.parametrize("square,normalize", [("Mul(d, d)", "Div(d, std)"),
                                              ("Pow(d, two)", "Mul(d, inv)")])
def test_variants_mul_square_and_reciprocal(square: str, normalize: str) -> None:
    body = _decomposed(square=square, normalize=normalize)
    if "inv" in normalize:
        body = body.replace("n = Mul(d, inv)", "inv = Reciprocal(std)\n        n = Mul(inv, d)")
    _assert_fused(_model(body))


def test_without_gamma_and_beta_uses_ones_and_zeros() -> None:
    out, report = _assert_fused(_model(_decomposed(tail="y = Identity(n)"), initializers=""))
    assert report.applied()[0].details["scale"] == 0
    assert [n.op_type for n in out.graph.node] == ["LayerNormalization", "Identity"]


def test_two_trailing_axes_and_broadcast_gamma() -> None:
    inits = "<float[1, 3, 1] gamma = {1.0, 2.0, 3.0}, float[4] beta = {0.1, -0.2, 0.3, 0.0}>"
    out, _ = _assert_fused(_model(_decomposed(axes="[1, 2]"), initializers=inits))
    ln = next(n for n in out.graph.node if n.op_type == "LayerNormalization")
    assert {a.name: a.i for a in ln.attribute if a.name == "axis"} == {"axis": -2}


def test_opset18_axes_as_input() -> None:
    _assert_fused(_model(_decomposed(reduce_axes_as_input=True), opset=18))


def test_non_trailing_axis_not_fused_with_reason() -> None:
    model = _model(_decomposed(axes="[1]").replace(
        "ng = Mul(n, gamma)", "ng = Mul(n, g3)"), initializers="<float[3, 1] g3 = {1.0, 2.0, 3.0},"
        " float[4] beta = {0.1, -0.2, 0.3, 0.0}>", opset=12)
    out, report = apply_rewrites(model, ["fuse-layernorm"])
    assert not report.applied()
    reasons = [r.reason for r in report.skipped("fuse-layernorm")]
    assert any("not the trailing axes of the rank-3 input" in r for r in reasons), reasons
    assert report.opset_after == 12  # no match, so the opset is not raised
    assert [n.op_type for n in out.graph.node] == [n.op_type for n in model.graph.node]


def test_epsilon_not_constant_not_fused() -> None:
    model = _model(_decomposed(eps="Identity(e)"), inputs="float[2, 3, 4] x, float e")
    _, report = apply_rewrites(model, ["fuse-layernorm"])
    assert any("epsilon is not a float scalar constant" in r.reason for r in report.skipped())


def test_pow_exponent_must_be_two() -> None:
    model = _model(_decomposed().replace("float {2.0}", "float {3.0}"))
    _, report = apply_rewrites(model, ["fuse-layernorm"])
    assert any("exponent is [3.0], not 2" in r.reason for r in report.skipped())


def test_low_target_opset_blocks_fusion_with_reason() -> None:
    model = _model(_decomposed(), opset=12)
    _, report = apply_rewrites(model, ["fuse-layernorm"], target_opset=12)
    [record] = report.skipped("fuse-layernorm")
    assert "target_opset=12" in record.reason and record.nodes[0] == "ReduceMean_0"
    assert report.opset_after == 12 and not report.changed


def test_mean_used_elsewhere_is_not_fused() -> None:
    body = _decomposed().replace("y = Add(ng, beta)", "y0 = Add(ng, beta)\n y = Add(y0, mean)")
    _, report = apply_rewrites(_model(body), ["fuse-layernorm"])
    assert not report.applied()
    assert all("not part of a complete decomposed LayerNorm" in r.reason
               for r in report.skipped())


def test_requested_target_opset_converts_first() -> None:
    _, report = _assert_fused(_model(_decomposed(), opset=12), target_opset=17)
    assert [r.rule for r in report.records] == ["convert-opset", "fuse-layernorm"]
    assert report.records[0].details == {"from_opset": 12, "to_opset": 17}
