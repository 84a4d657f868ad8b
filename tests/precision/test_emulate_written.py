"""The exact emulation of a strongly typed model: Casts, BF16 storage, weights, I/O types."""

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tiny_models import IR_VERSION, conv_bn, transformer_block

from precision_doctor.formats import Precision, round_to
from precision_doctor.precision.emulate import emulate
from precision_doctor.precision.emulate_written import emulate_written, low_precision_formats
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.precision.writer import write_mixed_precision
from precision_doctor.runners.ort import OrtRunner

BF16 = ml_dtypes.bfloat16


def _run(model, feeds):
    with OrtRunner(model) as r:
        return r.run(feeds)


def _bf16(array):
    return np.asarray(array, np.float32).astype(BF16).astype(np.float32)


def _typed_matmul(opset=13):
    """x (FP32) -> Cast(bf16) -> MatMul(W bf16) -> Add(b bf16) -> Cast(float) -> y: a strongly
    typed BF16 model written by hand, weights stored as BF16."""
    rng = np.random.default_rng(0)
    w = rng.normal(0, 1, (16, 8)).astype(np.float32)
    b = rng.normal(0, 1, 8).astype(np.float32)
    inits = [numpy_helper.from_array(w.astype(BF16), "w"),
             numpy_helper.from_array(b.astype(BF16), "b")]
    nodes = [helper.make_node("Cast", ["x"], ["xb"], name="in", to=TensorProto.BFLOAT16),
             helper.make_node("MatMul", ["xb", "w"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["hb"], name="add"),
             helper.make_node("Cast", ["hb"], ["y"], name="out", to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [4, 16])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [4, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=IR_VERSION)
    onnx.checker.check_model(model, full_check=True)
    return model, w, b


def test_hand_written_bf16_matmul_matches_numpy_rounded_where_the_engine_stores():
    model, w, b = _typed_matmul()
    x = np.random.default_rng(1).normal(0, 3, (4, 16)).astype(np.float32)
    emulated, info = emulate_written(model)
    y = _run(emulated, {"x": x})["y"]
    # the engine: x stored in BF16, W and b as stored, MatMul accumulates in FP32 and stores
    # BF16, Add computes in FP32 on BF16 operands and stores BF16
    h = _bf16(_bf16(x).astype(np.float64) @ _bf16(w).astype(np.float64))
    expected = _bf16(h + _bf16(b))
    assert np.allclose(y, expected, rtol=2 ** -8, atol=0)  # at most one BF16 ulp apart
    assert np.mean(y == expected) > 0.9  # float64 vs FP32 accumulation only at ties
    assert np.array_equal(y, _bf16(y))  # every output value is a BF16 value
    assert info.formats == ("bf16",) and info.converted_constants == 2
    assert info.retyped_nodes == 1 and info.rounded_activations == 3  # Cast, MatMul, Add
    assert all(i.data_type == TensorProto.FLOAT for i in emulated.graph.initializer)


def test_cast_to_bf16_rounds_to_nearest_even_with_overflow_and_flush():
    model, _, _ = _typed_matmul()
    tie_down, tie_up = 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8  # halfway: to even (1, 1 + 2^-6)
    x = np.resize(np.array([tie_down, tie_up, 3.4e38, -3.4e38, 1e-41, 65504.0, np.pi],
                           np.float32), 16)
    emulated, _ = emulate_written(onnx.ModelProto(graph=helper.make_graph(
        [helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16),
         helper.make_node("Cast", ["xb"], ["y"], to=TensorProto.FLOAT)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])]),
        opset_import=model.opset_import, ir_version=IR_VERSION))
    y = _run(emulated, {"x": x})["y"]
    assert np.array_equal(y, x.astype(BF16).astype(np.float32))  # ml_dtypes: exact RNE
    assert y[0] == 1.0 and y[1] == np.float32(1 + 2.0 ** -6)
    assert np.isinf(y[2]) and np.isinf(y[3]) and y[4] == np.float32(1e-41).astype(BF16)


@pytest.mark.parametrize("keep_io_types", [True, False])
def test_writer_bf16_models_emulate_exactly_as_the_plan_emulator(keep_io_types):
    for model, shape in ((conv_bn(var_max=50.0), (1, 3, 8, 8)),
                         (transformer_block(hot_value=1.0), (2, 8, 16))):
        written, report = write_mixed_precision(model, PrecisionPlan(Precision.BF16),
                                                keep_io_types)
        assert low_precision_formats(written) == {Precision.BF16}
        x = np.random.default_rng(2).normal(0, 1, shape).astype(np.float32)
        name = model.graph.output[0].name
        out = [o.name for o in written.graph.output][0]
        y = _run(emulate_written(written)[0], {"x": x})[out]
        reference = _run(emulate(model, report.effective_plan())[0], {"x": x})[name]
        assert np.array_equal(y, reference)  # the model as written == the plan it implements
        fp32 = _run(model, {"x": x})[name]
        assert 0 < np.linalg.norm(y - fp32) / np.linalg.norm(fp32) < 0.05


def test_low_io_types_bf16_input_is_fed_float32_and_rounded_on_entry():
    model = transformer_block(hot_value=1.0)
    written, _ = write_mixed_precision(model, PrecisionPlan(Precision.BF16), keep_io_types=False)
    assert written.graph.input[0].type.tensor_type.elem_type == TensorProto.BFLOAT16
    emulated, info = emulate_written(written)
    assert emulated.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert emulated.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert info.rounded_inputs == 1
    x = np.random.default_rng(3).normal(0, 1, (1, 8, 16)).astype(np.float32)
    y = _run(emulated, {"x": x})
    y_rounded_in = _run(emulated, {"x": _bf16(x)})
    assert np.array_equal(y[written.graph.output[0].name],
                          y_rounded_in[written.graph.output[0].name])


def test_bf16_constants_constant_of_shape_and_cast_like_become_float():
    c = numpy_helper.from_array(np.array([1.5, 2.5], np.float32).astype(BF16), "c")
    fill = numpy_helper.from_array(np.array([3.0], np.float32).astype(BF16), "fill")
    nodes = [helper.make_node("Constant", [], ["k"], value=c),
             helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16),
             helper.make_node("Mul", ["xb", "k"], ["m"]),
             helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ConstantOfShape", ["s"], ["f"], value=fill),
             helper.make_node("Add", ["m", "f"], ["a"]),
             helper.make_node("CastLike", ["x", "a"], ["xl"]),
             helper.make_node("Add", ["a", "xl"], ["z"]),
             helper.make_node("Cast", ["z"], ["y"], to=TensorProto.FLOAT)]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]),
        opset_imports=[helper.make_opsetid("", 21)], ir_version=IR_VERSION)
    onnx.checker.check_model(model, full_check=True)
    emulated, info = emulate_written(model)
    x = np.array([1.01, -7.3], np.float32)
    y = _run(emulated, {"x": x})["y"]
    xb = _bf16(x)
    expected = _bf16(_bf16(_bf16(xb * [1.5, 2.5]) + 3.0) + xb)
    assert np.array_equal(y, expected)
    assert info.converted_constants == 2


def test_fp32_model_is_unchanged_and_round_to_agrees():
    model = conv_bn()
    emulated, info = emulate_written(model)
    assert info.formats == () and info.rounded_activations == 0
    x = np.random.default_rng(4).normal(0, 1, (1, 3, 8, 8)).astype(np.float32)
    assert np.array_equal(_run(emulated, {"x": x})["y"], _run(model, {"x": x})["y"])
    assert np.array_equal(round_to(x, Precision.BF16), _bf16(x))
