"""Q/DQ placement, insertion and the emulation: the model ONNX Runtime runs is the one the
formulas describe."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from tiny_models import make_model, tensor

from precision_doctor.formats import Precision
from precision_doctor.graph.outputs import mark_outputs
from precision_doctor.quant.emulation import EMULATION_OPTIMIZATION, quantized_model, run_outputs
from precision_doctor.quant.placement import ACTIVATION, RESIDUAL, WEIGHT, place
from precision_doctor.quant.qdq import QuantConfig, insert_qdq, prepare, weight_channel_amax
from precision_doctor.quant.qformats import QUANT_FORMATS, fake_quant

F = TensorProto.FLOAT


def _resblock():
    """x -> Conv(w1) -> Add(x) -> MaxPool -> Gemm(transB) : TensorRT's placement cases."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c1", "x"], ["r"], name="residual"),
             helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2],
                              strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "wg"], ["y"], name="fc", transB=1)]
    inits = [tensor("w1", rng.standard_normal((4, 4, 3, 3)) * 0.2),
             tensor("b1", rng.standard_normal(4)), tensor("wg", rng.standard_normal((5, 64)))]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F, [1, 4, 8, 8])],
                       [helper.make_tensor_value_info("y", F, [1, 5])], inits, opset=13)
    return model, rng.standard_normal((1, 4, 8, 8)).astype(np.float32)


def test_placement_follows_tensorrt_rules():
    model, _ = _resblock()
    units = {u.name: u for u in place(model)}
    assert list(units) == ["conv", "pool", "fc"]
    conv = [(s.tensor, s.kind, s.axis) for s in units["conv"].sites]
    assert conv == [("x", ACTIVATION, 1), ("w1", WEIGHT, 0), ("x", RESIDUAL, 1)]
    assert units["conv"].sites[2].node == "residual"  # the fused Add's other input
    assert [(s.tensor, s.kind, s.axis) for s in units["fc"].sites] == [
        ("f", ACTIVATION, -1), ("wg", WEIGHT, 0)]  # transB: B[N, K], channels on axis 0
    assert units["pool"].after == "Add"


@pytest.mark.parametrize("name", ["int8", "fp8"])
def test_the_qdq_model_computes_the_formulas(name):
    fmt = QUANT_FORMATS[name]
    model, x = _resblock()
    model = prepare(model, fmt)
    units = place(model)
    amax = {"x": float(np.abs(x).max()), "f": 3.0, "r": 4.0}
    config = QuantConfig(fmt, amax, frozenset({"fc"}))
    qdq = insert_qdq(model, units, config)
    onnx.checker.check_model(qdq)
    assert {n.op_type for n in qdq.graph.node} >= {"QuantizeLinear", "DequantizeLinear"}
    stored = [i for i in qdq.graph.initializer if i.name.endswith("/w_q")]
    assert [i.data_type for i in stored] == [fmt.onnx_type]  # weights stored quantized
    # the Gemm's input and weight fake-quantized by hand, the rest in FP32
    f = run_outputs(mark_outputs(model, ["f"]), [_S(x)], ["f"])["f"][0]
    wg = onnx.numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "wg"))
    wq = fake_quant(wg, fmt.scale_for(weight_channel_amax(wg, 0)), fmt, axis=0)
    expected = fake_quant(f, fmt.scale_for(3.0), fmt) @ wq.T
    got = run_outputs(quantized_model(model, units, config, Precision.FP32), [_S(x)], ["y"])
    np.testing.assert_allclose(got["y"][0], expected, rtol=1e-5, atol=1e-5)


class _S:
    def __init__(self, x):
        self.feeds = {"x": x}


def test_no_unit_quantized_is_the_fp32_model():
    model, x = _resblock()
    model = prepare(model, QUANT_FORMATS["int8"])
    units = place(model)
    qdq = insert_qdq(model, units, QuantConfig(QUANT_FORMATS["int8"], {}, frozenset()))
    a = run_outputs(model, [_S(x)], ["y"])["y"][0]
    b = run_outputs(qdq, [_S(x)], ["y"])["y"][0]
    assert np.array_equal(a, b)


def test_onnx_runtime_extended_optimizations_drop_a_relu_before_an_fp8_quantize():
    """Why the emulation runs at ``basic``: ORT 1.32's Relu/QuantizeLinear fusion treats the
    FP8 zero point as the type's minimum and removes the Relu; INT8 is unaffected."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    x = np.array([-1.0, -0.5, 0.2, 0.7], np.float32)
    for zero, changed in ((TensorProto.FLOAT8E4M3FN, True), (TensorProto.INT8, False)):
        model = make_model(nodes, [helper.make_tensor_value_info("x", F, [4])],
                           [helper.make_tensor_value_info("y", F, [4])],
                           [tensor("s", 0.01), helper.make_tensor("z", zero, [], [0])], opset=21)
        outs = {}
        for level in (ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                      ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED):
            so = ort.SessionOptions()
            so.graph_optimization_level = level
            outs[level] = ort.InferenceSession(model.SerializeToString(), so, providers=[
                "CPUExecutionProvider"]).run(None, {"x": x})[0]
        basic = outs[ort.GraphOptimizationLevel.ORT_ENABLE_BASIC]
        assert (basic[:2] == 0).all()  # the Relu ran
        extended = outs[ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED]
        if changed and (extended[:2] == 0).all():
            pytest.skip("this ONNX Runtime keeps the Relu: the emulation's basic level is "
                        "then a precaution")
        assert (extended[:2] < 0).all() == changed
    assert EMULATION_OPTIMIZATION == "basic"


def test_a_dead_weight_channel_gets_a_scale_fp16_can_store():
    w = np.ones((4, 3), np.float32)
    w[:, 1] = 1e-12  # a dead output channel: amax / 127 would store as 0 in FP16
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                       [helper.make_tensor_value_info("x", F, [2, 4])],
                       [helper.make_tensor_value_info("y", F, [2, 3])], [tensor("w", w)],
                       opset=17)
    units = place(model)
    qdq = insert_qdq(model, units, QuantConfig(QUANT_FORMATS["int8"], {"x": 1.0},
                                               frozenset({"mm"})))
    scales = [onnx.numpy_helper.to_array(i) for i in qdq.graph.initializer
              if i.name.endswith("/scale")]
    assert all((s.astype(np.float16) > 0).all() for s in scales)
