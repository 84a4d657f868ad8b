"""fold-batchnorm and fold-bias-add on tiny models: outputs unchanged, names kept, reasons given."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from precision_doctor.precision.rewrites import apply_rewrites, fold_batchnorm_params

RNG = np.random.default_rng(0)


def _init(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(np.asarray(array, dtype=np.float32), name)


def _bn_params(prefix: str, channels: int, var_scale: float = 1.0) -> list[TensorProto]:
    return [_init(f"{prefix}_gamma", RNG.uniform(0.5, 1.5, channels)),
            _init(f"{prefix}_beta", RNG.normal(size=channels)),
            _init(f"{prefix}_mean", RNG.normal(size=channels)),
            _init(f"{prefix}_var", RNG.uniform(0.1, 2.0, channels) * var_scale)]


def _bn(prefix: str, x: str, y: str) -> onnx.NodeProto:
    return helper.make_node("BatchNormalization", [x] + [f"{prefix}_{p}" for p in
                                                          ("gamma", "beta", "mean", "var")],
                            [y], name=f"{prefix}_bn", epsilon=1e-3)


def _model(nodes, inits, x_shape, y_shape, opset: int = 13, extra_outputs=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)]
        + [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in extra_outputs],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def _assert_same_outputs(before: onnx.ModelProto, after: onnx.ModelProto, x_shape) -> None:
    x = RNG.normal(size=x_shape).astype(np.float32)
    for a, b in zip(_run(before, x), _run(after, x)):
        rel = np.linalg.norm(b - a) / np.linalg.norm(a)
        assert rel < 1e-6, rel


@pytest.mark.parametrize("with_bias,group", [(True, 1), (False, 1), (True, 2), (False, 4)])
def test_conv_bn_folded_outputs_unchanged(with_bias: bool, group: int) -> None:
    inits = [_init("W", RNG.normal(size=(8, 8 // group, 3, 3)))] + _bn_params("b", 8)
    conv_in = ["x", "W"]
    if with_bias:
        inits.append(_init("B", RNG.normal(size=8)))
        conv_in.append("B")
    model = _model([helper.make_node("Conv", conv_in, ["c"], name="conv", group=group,
                                     pads=[1, 1, 1, 1]), _bn("b", "c", "y")],
                   inits, [1, 8, 6, 6], [1, 8, 6, 6])
    out, report = apply_rewrites(model, ["fold-batchnorm"])
    onnx.checker.check_model(out, full_check=True)
    assert [n.op_type for n in out.graph.node] == ["Conv"]
    assert out.graph.node[0].name == "conv" and out.graph.node[0].output[0] == "y"
    [record] = report.applied("fold-batchnorm")
    assert record.nodes[:2] == ("conv", "b_bn") and record.new_nodes == ("conv",)
    _assert_same_outputs(model, out, [1, 8, 6, 6])


@pytest.mark.parametrize("group", [1, 2])
def test_conv_transpose_bn_folded_with_groups(group: int) -> None:
    inits = [_init("W", RNG.normal(size=(4, 6 // group, 2, 2)))] + _bn_params("b", 6)
    model = _model([helper.make_node("ConvTranspose", ["x", "W"], ["c"], name="deconv",
                                     group=group, strides=[2, 2]), _bn("b", "c", "y")],
                   inits, [1, 4, 5, 5], [1, 6, 10, 10])
    out, report = apply_rewrites(model, ["fold-batchnorm"])
    onnx.checker.check_model(out, full_check=True)
    assert [n.op_type for n in out.graph.node] == ["ConvTranspose"]
    assert len(report.applied("fold-batchnorm")) == 1
    _assert_same_outputs(model, out, [1, 4, 5, 5])


@pytest.mark.parametrize("trans_b,with_c", [(0, True), (1, True), (1, False)])
def test_gemm_bn_folded(trans_b: int, with_c: bool) -> None:
    w = RNG.normal(size=(6, 5) if trans_b else (5, 6))
    inits = [_init("W", w)] + _bn_params("b", 6)
    gemm_in = ["x", "W"] + (["C"] if with_c else [])
    if with_c:
        inits.append(_init("C", RNG.normal(size=6)))
    model = _model([helper.make_node("Gemm", gemm_in, ["c"], name="gemm", transB=trans_b,
                                     alpha=0.7, beta=1.3), _bn("b", "c", "y")],
                   inits, [3, 5], [3, 6])
    out, report = apply_rewrites(model, ["fold-batchnorm"])
    onnx.checker.check_model(out, full_check=True)
    gemm = out.graph.node[0]
    assert gemm.op_type == "Gemm" and len(out.graph.node) == 1
    assert "beta" not in {a.name for a in gemm.attribute}  # folded into the new C
    assert report.applied()[0].new_nodes == ("gemm",)
    _assert_same_outputs(model, out, [3, 5])


def test_two_consumer_conv_not_folded_with_reason() -> None:
    inits = [_init("W", RNG.normal(size=(4, 4, 1, 1)))] + _bn_params("b", 4)
    model = _model([helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
                    _bn("b", "c", "y"), helper.make_node("Relu", ["c"], ["r"], name="relu")],
                   inits, [1, 4, 3, 3], [1, 4, 3, 3], extra_outputs=["r"])
    out, report = apply_rewrites(model, ["fold-batchnorm"])
    [record] = report.skipped("fold-batchnorm")
    assert record.nodes == ("b_bn",)
    assert "another consumer" in record.reason and "relu" in record.reason
    assert [n.op_type for n in out.graph.node] == ["Conv", "BatchNormalization", "Relu"]


def test_standalone_bn_reason_names_its_source() -> None:
    model = _model([_bn("b", "x", "y")], _bn_params("b", 3), [1, 3, 2, 2], [1, 3, 2, 2])
    _, report = apply_rewrites(model, ["fold-batchnorm"])
    [record] = report.skipped()
    assert "graph input 'x'" in record.reason
    assert "not from Conv/ConvTranspose/Gemm" in record.reason


def test_non_constant_bn_parameter_not_folded() -> None:
    inits = [_init("W", RNG.normal(size=(3, 3, 1, 1)))] + _bn_params("b", 3)[1:]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W"], ["c"], name="conv"), _bn("b", "c", "y")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 2, 2]),
         helper.make_tensor_value_info("b_gamma", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 2, 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    _, report = apply_rewrites(model, ["fold-batchnorm"])
    assert "scale is not a constant" in report.skipped()[0].reason


def test_constant_node_weights_and_fp16_range_details() -> None:
    """Weights as Constant nodes (PaddlePaddle export) and a variance beyond FP16 max."""
    params = _bn_params("b", 4, var_scale=1e8)
    consts = [helper.make_node("Constant", [], [t.name], value=t) for t in
              [_init("W", RNG.normal(size=(4, 2, 3, 3)))] + params]
    model = _model(consts + [helper.make_node("Conv", ["x", "W"], ["c"], name="conv",
                                              pads=[1, 1, 1, 1]), _bn("b", "c", "y")],
                   [], [1, 2, 5, 5], [1, 4, 5, 5])
    out, report = apply_rewrites(model, ["fold-batchnorm"])
    onnx.checker.check_model(out, full_check=True)
    assert [n.op_type for n in out.graph.node] == ["Conv"]  # the 5 Constants are gone
    [record] = report.applied()
    assert len(record.nodes) == 2 + 5
    assert record.details["bn_var_over_fp16_max"] == 4
    assert record.details["weight_absmax_after"] < 1e-3
    assert 0.0 < float(record.details["weight_fp16_subnormal_fraction"]) <= 1.0
    _assert_same_outputs(model, out, [1, 2, 5, 5])


def test_fold_params_match_batchnorm_formula() -> None:
    w, b = RNG.normal(size=(3, 2, 1, 1)), RNG.normal(size=3)
    gamma, beta, mean, var = (RNG.uniform(0.5, 2, 3) for _ in range(4))
    w2, b2 = fold_batchnorm_params("Conv", w, b, gamma, beta, mean, var, 1e-5)
    s = gamma / np.sqrt(var + 1e-5)
    np.testing.assert_allclose(w2[:, 0, 0, 0], w[:, 0, 0, 0] * s)
    np.testing.assert_allclose(b2, (b - mean) * s + beta)
    with pytest.raises(ValueError, match="output channels"):
        fold_batchnorm_params("Conv", w, b, gamma[:2], beta[:2], mean[:2], var[:2], 1e-5)


def _deconv_add_bn(bias_shape: tuple[int, ...]) -> onnx.ModelProto:
    inits = [_init("W", RNG.normal(size=(4, 6, 2, 2))),
             _init("bias", RNG.normal(size=bias_shape))] + _bn_params("b", 6)
    return _model([helper.make_node("ConvTranspose", ["x", "W"], ["c"], name="deconv",
                                    strides=[2, 2]),
                   helper.make_node("Add", ["c", "bias"], ["a"], name="bias_add"),
                   _bn("b", "a", "y")], inits, [1, 4, 3, 3], [1, 6, 6, 6])


def test_bias_add_then_batchnorm_fold_like_ppocr_det() -> None:
    model = _deconv_add_bn((1, 6, 1, 1))
    out, report = apply_rewrites(model)
    onnx.checker.check_model(out, full_check=True)
    assert [n.op_type for n in out.graph.node] == ["ConvTranspose"]
    assert report.counts()["fold-bias-add"] == {"applied": 1, "skipped": 0}
    assert report.counts()["fold-batchnorm"] == {"applied": 1, "skipped": 0}
    _assert_same_outputs(model, out, [1, 4, 3, 3])
    # Without fold-bias-add the BatchNormalization stays, and the reason says what to do.
    _, alone = apply_rewrites(model, ["fold-batchnorm"])
    assert "run fold-bias-add first" in alone.skipped()[0].reason


def test_bias_add_not_per_channel_is_reported() -> None:
    inits = [_init("W", RNG.normal(size=(4, 6, 2, 2))),
             _init("bias", RNG.normal(size=(1, 6, 6, 6)))]
    model = _model([helper.make_node("ConvTranspose", ["x", "W"], ["c"], name="deconv",
                                     strides=[2, 2]),
                    helper.make_node("Add", ["c", "bias"], ["y"], name="bias_add")],
                   inits, [1, 4, 3, 3], [1, 6, 6, 6])
    out, report = apply_rewrites(model, ["fold-bias-add"])
    [record] = report.skipped("fold-bias-add")
    assert "not per-channel" in record.reason
    assert len(out.graph.node) == 2


def test_non_finite_fold_keeps_the_batchnorm() -> None:
    params = _bn_params("b", 2)
    params[3] = _init("b_var", [-1.0, 1.0])  # var + eps < 0: sqrt is NaN
    model = _model([helper.make_node("Conv", ["x", "W"], ["c"], name="conv"), _bn("b", "c", "y")],
                   [_init("W", RNG.normal(size=(2, 2, 1, 1)))] + params, [1, 2, 2, 2], [1, 2, 2, 2])
    out, report = apply_rewrites(model, ["fold-batchnorm"])
    assert "not finite" in report.skipped()[0].reason
    assert len(out.graph.node) == 2
