"""graph.upcast: a model shipped in FP16/BF16 is recognized and widened exactly to FP32."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from tiny_models import IR_VERSION

from precision_doctor.graph.upcast import LOW, shipped_precision, upcast, with_fp32_io

F32, F16, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16
NP = {F32: np.float32, F16: np.float16, BF16: ml_dtypes.bfloat16}


def _model(nodes, inputs, outputs, inits=(), value_info=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits),
                              value_info=list(value_info))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    return model


def conv_matmul(dtype: int) -> onnx.ModelProto:
    """Conv -> Relu -> Flatten -> MatMul (+ bias), weights and I/O in ``dtype``; the weights
    are the same FP16-representable values for every ``dtype``."""
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float16).astype(np.float32)
    b = rng.normal(0, 0.1, 4).astype(np.float16).astype(np.float32)
    w2 = rng.normal(0, 0.1, (4 * 6 * 6, 5)).astype(np.float16).astype(np.float32)
    t = NP[dtype]
    inits = [numpy_helper.from_array(w.astype(t), "w"), numpy_helper.from_array(b.astype(t), "b"),
             numpy_helper.from_array(w2.astype(t), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
             helper.make_node("MatMul", ["f", "w2"], ["y"], name="fc")]
    return _model(nodes, [helper.make_tensor_value_info("x", dtype, [1, 3, 8, 8])],
                  [helper.make_tensor_value_info("y", dtype, [1, 5])], inits,
                  [helper.make_tensor_value_info("c", dtype, [1, 4, 6, 6])])


def _run(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _low_types(model: onnx.ModelProto) -> list[str]:
    """Every place a FLOAT16/BFLOAT16 element type is left (text of the proto)."""
    text = str(model)
    return [f"data_type: {t}" for t in LOW if f"data_type: {t}\n" in text] + \
           [f"elem_type: {t}" for t in LOW if f"elem_type: {t}\n" in text]


def test_fp32_model_is_returned_unchanged():
    model = conv_matmul(F32)
    same, record = upcast(model)
    assert same is model and record is None and shipped_precision(model) is None


def test_fp16_weights_and_io_upcast_equals_the_fp32_model():
    shipped, fp32 = conv_matmul(F16), conv_matmul(F32)
    before = shipped.SerializeToString()
    up, record = upcast(shipped)
    assert shipped.SerializeToString() == before  # the caller's model is untouched
    assert record is not None and record.shipped == "fp16"
    assert (record.initializers, record.inputs, record.outputs, record.value_types) == \
        (3, ("x",), ("y",), 1)
    assert "This model is FP16 as shipped; reference = its FP32 upcast" in record.statement()
    assert not _low_types(up)
    onnx.checker.check_model(up)
    assert [n.name for n in up.graph.node] == [n.name for n in shipped.graph.node]
    for a, b in zip(up.graph.initializer, fp32.graph.initializer):
        np.testing.assert_array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))
    x = np.random.default_rng(1).normal(size=(1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(_run(up, {"x": x}), _run(fp32, {"x": x}))
    # the upcast is the FP32 computation, not the FP16 one
    assert not np.array_equal(_run(up, {"x": x}), _run(shipped, {"x": x.astype(np.float16)}))


def test_fp32_io_with_internal_casts_to_fp16():
    w = np.random.default_rng(2).normal(size=(6, 4)).astype(np.float16)
    nodes = [helper.make_node("Cast", ["x"], ["x16"], name="to_half", to=F16),
             helper.make_node("MatMul", ["x16", "w"], ["y16"], name="mm"),
             helper.make_node("Cast", ["y16"], ["y"], name="to_float", to=F32)]
    io = ([helper.make_tensor_value_info("x", F32, [2, 6])],
          [helper.make_tensor_value_info("y", F32, [2, 4])])
    shipped = _model(nodes, *io, [numpy_helper.from_array(w, "w")])
    up, record = upcast(shipped)
    assert record is not None and (record.casts, record.inputs, record.outputs) == (1, (), ())
    assert [a.i for n in up.graph.node for a in n.attribute] == [F32, F32]
    hand = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], *io,
                  [numpy_helper.from_array(w.astype(np.float32), "w")])
    x = np.random.default_rng(3).normal(size=(2, 6)).astype(np.float32)
    np.testing.assert_array_equal(_run(up, {"x": x}), _run(hand, {"x": x}))


def test_bf16_constants_and_io():
    c = np.array([1.5, -2.0, 3.25, 0.0078125], ml_dtypes.bfloat16)
    nodes = [helper.make_node("Constant", [], ["c"], name="const",
                              value=numpy_helper.from_array(c, "c")),
             helper.make_node("Mul", ["x", "c"], ["m"], name="mul"),
             helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("ConstantOfShape", ["s"], ["one"], name="fill",
                              value=numpy_helper.from_array(np.array([1], ml_dtypes.bfloat16))),
             helper.make_node("Add", ["m", "one"], ["y"], name="add")]
    shipped = _model(nodes, [helper.make_tensor_value_info("x", BF16, [4])],
                     [helper.make_tensor_value_info("y", BF16, [4])])
    up, record = upcast(shipped)
    assert record is not None and record.shipped == "bf16" and record.constants == 2
    assert "BF16 as shipped" in record.statement() and not _low_types(up)
    x = np.array([0.1, 0.2, 0.3, 1e4], np.float32)
    np.testing.assert_array_equal(_run(up, {"x": x}), x * c.astype(np.float32) + 1)


def test_subgraphs_dtype_attributes_and_mixed_formats():
    then = helper.make_graph(
        [helper.make_node("Constant", [], ["t"], value=numpy_helper.from_array(
            np.array([2.0], np.float16), "t"))], "then", [],
        [helper.make_tensor_value_info("t", F16, [1])])
    other = helper.make_graph(
        [helper.make_node("Constant", [], ["e"], value=numpy_helper.from_array(
            np.array([3.0], np.float16), "e"))], "else", [],
        [helper.make_tensor_value_info("e", F16, [1])])
    nodes = [helper.make_node("If", ["cond"], ["picked"], name="if", then_branch=then,
                              else_branch=other),
             helper.make_node("EyeLike", ["square"], ["eye"], name="eye", dtype=F16),
             helper.make_node("RandomNormal", [], ["noise"], name="rnd", dtype=BF16, shape=[2],
                              seed=0.0),
             helper.make_node("Cast", ["noise"], ["noise32"], name="widen", to=F32)]
    shipped = _model(nodes, [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                             helper.make_tensor_value_info("square", F32, [2, 2])],
                     [helper.make_tensor_value_info("picked", F16, [1]),
                      helper.make_tensor_value_info("eye", F16, [2, 2]),
                      helper.make_tensor_value_info("noise32", F32, [2])])
    up, record = upcast(shipped)
    assert record is not None and record.shipped == "mixed"
    assert (record.constants, record.dtype_attributes, record.value_types) == (2, 2, 2)
    assert record.outputs == ("picked", "eye") and not _low_types(up)
    onnx.checker.check_model(up, full_check=True)
    session = ort.InferenceSession(up.SerializeToString(), providers=["CPUExecutionProvider"])
    picked, eye, _ = session.run(None, {"cond": np.array(False),
                                        "square": np.zeros((2, 2), np.float32)})
    assert picked.dtype == np.float32 and picked[0] == 3.0
    np.testing.assert_array_equal(eye, np.eye(2, dtype=np.float32))


def test_external_fp16_weights_are_widened_into_the_weight_store(tmp_path):
    from precision_doctor.graph import load_model
    from precision_doctor.graph.external import is_external, tensor_array

    shipped = conv_matmul(F16)
    onnx.save_model(shipped, tmp_path / "m.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="m.data", size_threshold=64)
    up, record = upcast(load_model(tmp_path / "m.onnx"))
    assert record is not None and record.initializers == 3
    w2 = next(t for t in up.graph.initializer if t.name == "w2")
    assert is_external(w2) and w2.data_type == F32
    np.testing.assert_array_equal(tensor_array(w2), numpy_helper.to_array(
        conv_matmul(F32).graph.initializer[2]))


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_every_low_value_widens_exactly(dtype):
    """All 65536 bit patterns: the FP32 value is the format's own value (NaN stays NaN)."""
    t = NP[dtype]
    values = np.arange(1 << 16, dtype=np.uint16).view(t)
    model = _model([helper.make_node("Identity", ["w"], ["y"])], [],
                   [helper.make_tensor_value_info("y", dtype, [1 << 16])],
                   [numpy_helper.from_array(values, "w")])
    widened = numpy_helper.to_array(upcast(model)[0].graph.initializer[0])
    assert widened.dtype == np.float32
    with np.errstate(invalid="ignore"):  # NaN patterns cast to NaN
        np.testing.assert_array_equal(widened.astype(np.float64), values.astype(np.float64))


def test_with_fp32_io_runs_the_shipped_model_on_fp32_feeds():
    shipped = conv_matmul(F16)
    wrapped = with_fp32_io(shipped)
    onnx.checker.check_model(wrapped, full_check=True)
    assert [n.name for n in wrapped.graph.node] == \
        ["x/to_shipped", *(n.name for n in shipped.graph.node), "y/to_float"]
    x = np.random.default_rng(4).normal(size=(1, 3, 8, 8)).astype(np.float32)
    # onnx.reference computes in the model's types (ONNX Runtime CPU merges the boundary Casts
    # with those around its FP32 fallback kernels and skips the rounding)
    expected = ReferenceEvaluator(shipped).run(None, {"x": x.astype(np.float16)})[0]
    got = ReferenceEvaluator(wrapped).run(None, {"x": x})[0]
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected.astype(np.float32))
    fp32 = conv_matmul(F32)
    assert with_fp32_io(fp32) is fp32


def test_castlike_follows_its_widened_target():
    like = numpy_helper.from_array(np.zeros(1, np.float16), "like")
    shipped = _model([helper.make_node("CastLike", ["x", "like"], ["y"], name="castlike")],
                     [helper.make_tensor_value_info("x", TensorProto.INT64, [3])],
                     [helper.make_tensor_value_info("y", F16, [3])], [like])
    up, record = upcast(shipped)
    assert record is not None and record.outputs == ("y",) and record.initializers == 1
    onnx.checker.check_model(up, full_check=True)
    y = _run(up, {"x": np.array([1, 2049, -3])})
    assert y.dtype == np.float32 and y.tolist() == [1.0, 2049.0, -3.0]  # FP16 would give 2048
