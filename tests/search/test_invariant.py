"""The all-FP32 invariant (``search.invariant``) and the candidates it rests on."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from tiny_models import make_model, quantized_block, tensor

from precision_doctor.errors import InvariantError
from precision_doctor.formats import Precision
from precision_doctor.precision import plan as plan_module
from precision_doctor.precision.emulate import emulate
from precision_doctor.precision.plan import PrecisionPlan, candidate_nodes
from precision_doctor.search.cost import node_costs
from precision_doctor.search.invariant import check_all_fp32, unreached_nodes


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def _feeds(seed: int = 1) -> dict:
    return {"x": np.random.default_rng(seed).uniform(0, 1, (1, 8, 64)).astype(np.float32)}


def test_candidates_include_int_to_float_casts_not_integer_ops():
    names = [n.name for n in candidate_nodes(quantized_block(blocks=1))]
    assert "b0/cast" in names                       # int32 accumulator -> float
    assert "b0/dql" in names                        # its float scale
    assert "b0/mmi" not in names                    # MatMulInteger: integers only
    assert names == [n for n in names if n != "out"]  # Identity: data movement


def test_cast_to_int_reads_its_input_unrounded():
    f = TensorProto.FLOAT
    model = make_model(
        [helper.make_node("Mul", ["x", "k"], ["y"], name="mul"),
         helper.make_node("Cast", ["y"], ["i"], to=TensorProto.INT64, name="to_int"),
         helper.make_node("Cast", ["i"], ["z"], to=f, name="to_float")],
        [helper.make_tensor_value_info("x", f, [3])],
        [helper.make_tensor_value_info("z", f, [3])], [tensor("k", [1.0])])
    assert [n.name for n in candidate_nodes(model)] == ["mul", "to_float"]
    plan = PrecisionPlan(Precision.FP16).keep_fp32(["mul", "to_float"], "test")
    emulated, _ = emulate(model, plan)
    x = {"x": np.array([2049.0, 70000.0, 3.0], np.float32)}
    np.testing.assert_array_equal(_run(emulated, x)[0], [2049.0, 70000.0, 3.0])


def test_all_fp32_plan_is_the_reference_on_a_quantized_encoder():
    model = quantized_block(blocks=2)
    feeds = _feeds()
    ref = _run(model, feeds)[0]
    plan = PrecisionPlan(Precision.FP16)
    assert unreached_nodes(model, plan) == []
    check_all_fp32(model, plan, feeds, {"y": ref})   # raises on a defect


def test_a_node_the_plan_cannot_reach_is_named(monkeypatch):
    model = quantized_block(blocks=1)
    real = plan_module.candidate_nodes
    monkeypatch.setattr("precision_doctor.search.invariant.candidate_nodes",
                        lambda m: [n for n in real(m) if n.op_type != "Cast"])
    plan = PrecisionPlan(Precision.FP16)
    assert unreached_nodes(model, plan) == ["b0/cast"]
    with pytest.raises(InvariantError, match="b0/cast") as info:
        check_all_fp32(model, plan)
    assert info.value.context["node"] == "b0/cast"


def test_attention_flops_use_the_samples_shapes():
    """Symbolic batch/sequence and a Reshape target computed from Shape (as exporters write
    attention): the MatMuls count their FLOPs, the mask Mul is a small share."""
    f = TensorProto.FLOAT
    h = 16
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "zero"], ["b"], axis=0, name="gb"),
        helper.make_node("Gather", ["shape", "one"], ["s"], axis=0, name="gs"),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"], name="ub"),
        helper.make_node("Unsqueeze", ["s", "ax0"], ["s1"], name="us"),
        helper.make_node("Concat", ["b1", "s1", "heads", "dh"], ["target"], axis=0,
                         name="cat"),
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q_proj"),
        helper.make_node("Reshape", ["q", "target"], ["q4"], name="q_split"),
        helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3], name="q_t"),
        helper.make_node("Transpose", ["q4"], ["kt"], perm=[0, 2, 3, 1], name="k_t"),
        helper.make_node("MatMul", ["qt", "kt"], ["scores"], name="scores"),
        helper.make_node("Mul", ["scores", "mask"], ["masked"], name="mask_mul"),
        helper.make_node("Softmax", ["masked"], ["p"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["p", "qt"], ["ctx"], name="ctx"),
    ]
    i64 = TensorProto.INT64
    inits = [tensor("wq", np.eye(h)), tensor("mask", [1.0]),
             helper.make_tensor("zero", i64, [], [0]), helper.make_tensor("one", i64, [], [1]),
             helper.make_tensor("ax0", i64, [1], [0]), helper.make_tensor("heads", i64, [1], [2]),
             helper.make_tensor("dh", i64, [1], [h // 2])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", f, ["batch", "seq", h])],
                       [helper.make_tensor_value_info("ctx", f, ["batch", 2, "seq", h // 2])],
                       inits)
    costs = node_costs(model, {"x": (2, 32, h)})
    assert costs["scores"].flops == 2.0 * (2 * 2 * 32 * 32) * (h // 2)
    assert costs["ctx"].flops == 2.0 * (2 * 2 * 32 * (h // 2)) * 32
    total = sum(c.flops for c in costs.values())
    assert costs["mask_mul"].flops / total < 0.1
