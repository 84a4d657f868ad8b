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
