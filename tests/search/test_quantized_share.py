"""``search.cost.quantized_share``: the share of MACs and parameters a Q/DQ model runs in INT8,
whoever wrote it, on a hand-built model whose counts are known."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from precision_doctor.search.cost import quantized_share


def _model():
    """x [1,4,8] -> conv-free chain of three MatMuls:

    * ``q1``: both inputs from DequantizeLinear (the weight int8, 8x16): quantized;
    * ``q2``: its activation through DequantizeLinear -> Cast, its weight a float initializer
      quantized at run time (QuantizeLinear -> DequantizeLinear): quantized;
    * ``f``: its activation from DequantizeLinear but its weight float (16x2): not quantized.
    """
    init = [numpy_helper.from_array(np.ones((8, 16), np.int8), "w1_q"),
            numpy_helper.from_array(np.ones((16, 16), np.float32), "w2"),
            numpy_helper.from_array(np.ones((16, 2), np.float32), "w3"),
            numpy_helper.from_array(np.float32(0.1), "s"),
            numpy_helper.from_array(np.int8(0), "z")]
    n = helper.make_node
    nodes = [n("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             n("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             n("DequantizeLinear", ["w1_q", "s", "z"], ["w1"]),
             n("MatMul", ["xd", "w1"], ["h1"], name="q1"),
             n("QuantizeLinear", ["h1", "s", "z"], ["h1q"]),
             n("DequantizeLinear", ["h1q", "s", "z"], ["h1d"]),
             n("Cast", ["h1d"], ["h1c"], to=TensorProto.FLOAT),
             n("QuantizeLinear", ["w2", "s", "z"], ["w2q"]),
             n("DequantizeLinear", ["w2q", "s", "z"], ["w2d"]),
             n("MatMul", ["h1c", "w2d"], ["h2"], name="q2"),
             n("QuantizeLinear", ["h2", "s", "z"], ["h2q"]),
             n("DequantizeLinear", ["h2q", "s", "z"], ["h2d"]),
             n("MatMul", ["h2d", "w3"], ["y"], name="f")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 4, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 4, 2])], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def test_macs_and_parameters_of_the_layers_fed_by_dequantize_linear():
    share = quantized_share(_model(), {"x": (1, 4, 8)})
    macs = {"q1": 4 * 16 * 8, "q2": 4 * 16 * 16, "f": 4 * 2 * 16}
    assert share["mac_layers"] == 3 and share["quantized_layers"] == 2
    assert share["total_macs"] == sum(macs.values())
    assert share["macs"] == (macs["q1"] + macs["q2"]) / sum(macs.values())
    # parameters: the weights (8x16 int8, 16x16 and 16x2 float); scales and zero points not
    assert share["total_params"] == 128 + 256 + 32 and share["quantized_params"] == 128 + 256
    assert share["params"] == 384 / 416


def test_a_float_model_runs_nothing_quantized():
    n = helper.make_node
    graph = helper.make_graph(
        [n("MatMul", ["x", "w1"], ["h"], name="a"), n("MatMul", ["h", "w2"], ["y"], name="b")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 2])],
        [numpy_helper.from_array(np.ones((8, 16), np.float32), "w1"),
         numpy_helper.from_array(np.ones((16, 2), np.float16), "w2")])
    share = quantized_share(helper.make_model(graph), {"x": (1, 4, 8)})
    assert share["quantized_layers"] == 0 and share["macs"] == 0 and share["params"] == 0
    assert share["total_macs"] == 4 * 16 * 8 + 4 * 2 * 16 and share["total_params"] == 160


def _const(name: str, array: np.ndarray):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name))


def test_weights_in_constant_nodes_are_parameters():
    """ONNX Runtime ``quantize_static`` and ModelOpt keep a Paddle2ONNX model's weights in
    Constant nodes: ``q`` reads an int8 Constant through DequantizeLinear, ``r`` a float
    Constant quantized at run time through Transpose -> QuantizeLinear -> DequantizeLinear,
    ``f`` a float Constant through Cast (not quantized)."""
    n = helper.make_node
    nodes = [_const("w1_q", np.ones((8, 16), np.int8)),
             _const("w2", np.ones((16, 16), np.float32)),
             _const("w3", np.ones((16, 2), np.float16)),
             _const("s", np.float32(0.1)), _const("z", np.int8(0)),
             n("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             n("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             n("DequantizeLinear", ["w1_q", "s", "z"], ["w1"]),
             n("MatMul", ["xd", "w1"], ["h1"], name="q"),
             n("QuantizeLinear", ["h1", "s", "z"], ["h1q"]),
             n("DequantizeLinear", ["h1q", "s", "z"], ["h1d"]),
             n("Transpose", ["w2"], ["w2t"], perm=[1, 0]),
             n("QuantizeLinear", ["w2t", "s", "z"], ["w2q"]),
             n("DequantizeLinear", ["w2q", "s", "z"], ["w2d"]),
             n("MatMul", ["h1d", "w2d"], ["h2"], name="r"),
             n("Cast", ["w3"], ["w3f"], to=TensorProto.FLOAT),
             n("MatMul", ["h2", "w3f"], ["y"], name="f")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 4, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 4, 2])])
    share = quantized_share(helper.make_model(graph), {"x": (1, 4, 8)})
    assert share["quantized_layers"] == 2
    assert share["total_params"] == 128 + 256 + 32 and share["quantized_params"] == 128 + 256
    assert share["params"] == 384 / 416


def test_fp8_matmul_behind_a_dynamic_axis_counts_its_macs():
    """An FP8 Q/DQ MatMul after a BERT-like position embedding (Slice whose end is the
    sequence length, from Shape), batch and sequence dynamic, sample shape (1, 5, 8): ONNX
    inference leaves the Slice unknown, so the MACs rest on ONNX Runtime's symbolic inference,
    which must get past a ``value_ints`` Constant and a Concat of shape values at axis -1."""
    n = helper.make_node
    f8 = TensorProto.FLOAT8E4M3FN
    nodes = [_const("pos", np.arange(16, dtype=np.int64).reshape(1, 16)),
             _const("table", np.ones((16, 8), np.float32)),
             _const("zero", np.array([0], np.int64)), _const("one", np.array(1, np.int64)),
             _const("ax1", np.array([1], np.int64)),
             n("Constant", [], ["axes"], value_ints=[0]),
             n("Shape", ["x"], ["shape"]), n("Gather", ["shape", "one"], ["seq"], axis=0),
             n("Unsqueeze", ["seq", "axes"], ["seq1"]),
             n("Slice", ["pos", "zero", "seq1", "ax1", "ax1"], ["ids"]),
             n("Gather", ["table", "ids"], ["emb"], axis=0),
             n("Add", ["x", "emb"], ["h"]),
             _const("c_a", np.array([-1], np.int32)), _const("c_b", np.array([8], np.int32)),
             n("Cast", ["c_a"], ["c_a64"], to=TensorProto.INT64),
             n("Cast", ["c_b"], ["c_b64"], to=TensorProto.INT64),
             n("Concat", ["c_a64", "c_b64"], ["flat"], axis=-1),
             n("Reshape", ["h", "flat"], ["h2"]),
             _const("s", np.float32(0.5)),
             n("Constant", [], ["z"], value=helper.make_tensor("z", f8, [], [0.0])),
             n("Constant", [], ["w_q"], value=helper.make_tensor("w_q", f8, [8, 4], [1.0] * 32)),
             n("QuantizeLinear", ["h2", "s", "z"], ["hq"]),
             n("DequantizeLinear", ["hq", "s", "z"], ["hd"]),
             n("DequantizeLinear", ["w_q", "s", "z"], ["wd"]),
             n("MatMul", ["hd", "wd"], ["y"], name="mm")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["batch", "seq", 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [None, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    share = quantized_share(model, {"x": (1, 5, 8)})
    assert share["quantized_layers"] == share["mac_layers"] == 1
    assert share["total_macs"] == share["quantized_macs"] == 5 * 4 * 8 and share["macs"] == 1.0
    assert share["quantized_params"] == 32 and share["total_params"] == 32 + 16 * 8


def test_flop_counting_keeps_shape_inference_warnings_off_the_terminal(caplog) -> None:
    """A Slice of one NonZero's columns up to another NonZero's count: ONNX Runtime's symbolic
    inference cannot compare the two data-dependent dims and logs "Unable to determine if
    ... treat as equal" (Piper's voice printed 6 such lines on fix's terminal)."""
    from precision_doctor.search.cost import node_costs

    n = helper.make_node
    nodes = [n("NonZero", ["x"], ["nz1"]), n("Relu", ["x"], ["r"]), n("NonZero", ["r"], ["nz2"]),
             n("Shape", ["nz2"], ["count"], start=1, end=2),
             n("Cast", ["nz1"], ["f1"], to=TensorProto.FLOAT),
             n("Slice", ["f1", "zero", "count", "one"], ["cut"]),
             n("MatMul", ["w", "cut"], ["y"], name="mm")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([0], np.int64), "zero"),
         numpy_helper.from_array(np.array([1], np.int64), "one"),
         numpy_helper.from_array(np.ones((3, 1), np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with caplog.at_level("WARNING"):
        node_costs(model, {"x": (6,)})
    assert not [r for r in caplog.records if "Unable to determine" in r.getMessage()]
