"""The writer for a deployment engine: data-movement nodes the plan names FP32 get Casts around
them (they follow their producers otherwise), and a BF16 node whose ONNX function body takes
bfloat16 only from a later opset raises the opset (BF16 Clip: 16, for the Where in its body)."""

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper
from tiny_models import make_model, random_samples, tensor

from precision_doctor.formats import Precision
from precision_doctor.graph.load import opset_of
from precision_doctor.precision.plan import NodeDecision, PrecisionPlan
from precision_doctor.precision.writer import write_mixed_precision, written_opset
from precision_doctor.precision.writer.schema import function_body_opset
from precision_doctor.runners.emulator import WrittenEmulatorRunner

BF16, F32 = TensorProto.BFLOAT16, TensorProto.FLOAT


def types(model: onnx.ModelProto) -> dict[str, int]:
    g = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph
    found = {v.name: v.type.tensor_type.elem_type for v in [*g.input, *g.value_info, *g.output]}
    found.update({t.name: t.data_type for t in g.initializer})
    return found


def where_model() -> onnx.ModelProto:
    """x -> Relu -> Where(x > 0, r, fill) -> Expand -> Relu -> y (a masked fill, as in
    attention masks; Where and Expand are data movement)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Greater", ["x", "zero"], ["mask"], name="greater"),
        helper.make_node("Where", ["mask", "r", "fill"], ["w"], name="where"),
        helper.make_node("Expand", ["w", "shape"], ["e"], name="expand"),
        helper.make_node("Relu", ["e"], ["y"], name="relu2"),
    ]
    inits = [tensor("zero", 0.0), tensor("fill", -3.0),
             onnx.numpy_helper.from_array(np.array([2, 4], np.int64), "shape")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, 4])],
                      [helper.make_tensor_value_info("y", F32, [2, 4])], inits)


def test_data_movement_follows_its_producer_unless_the_plan_names_it_fp32():
    model = where_model()
    follow, _ = write_mixed_precision(model, PrecisionPlan(Precision.BF16), validate=False)
    t = types(follow)
    assert t["w"] == BF16 and t["e"] == BF16  # the BF16 Relu's values move in BF16

    plan = PrecisionPlan(Precision.BF16, {
        "where": NodeDecision(Precision.FP32, "engine", "no BF16 kernel"),
        "expand": NodeDecision(Precision.FP32, "engine", "no BF16 kernel")})
    pinned, report = write_mixed_precision(model, plan, validate=False)
    t = types(pinned)
    where = next(n for n in pinned.graph.node if n.name == "where")
    assert t[where.input[1]] == F32 and t["fill"] == F32 and t["w"] == F32 and t["e"] == F32
    assert t["r"] == BF16 and t["y"] == F32  # graph outputs stay FP32 (keep_io_types)
    relu2 = next(n for n in pinned.graph.node if n.name == "relu2")
    assert t[relu2.input[0]] == BF16
    assert report.node_precisions["where"] == "fp32"
    onnx.checker.check_model(pinned, full_check=True)
    # the same values either way: the Casts around a data-movement node are exact
    samples = random_samples((1, 4), count=3)
    with WrittenEmulatorRunner(follow) as a, WrittenEmulatorRunner(pinned) as b:
        for s in samples:
            np.testing.assert_array_equal(a.run(s.feeds)["y"], b.run(s.feeds)["y"])


def test_an_original_cast_to_float_named_fp32_stays_fp32():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Cast", ["r"], ["c"], name="cast", to=F32),
             helper.make_node("Relu", ["c"], ["y"], name="relu2")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F32, [4])],
                       [helper.make_tensor_value_info("y", F32, [4])])
    free, _ = write_mixed_precision(model, PrecisionPlan(Precision.BF16), validate=False)
    assert types(free)["c"] == BF16  # retargeted to what its consumer wants
    plan = PrecisionPlan(Precision.BF16).keep_fp32(["cast"], "engine", "x")
    pinned, _ = write_mixed_precision(model, plan, validate=False)
    assert types(pinned)["c"] == F32


def clip_model(opset: int = 11) -> onnx.ModelProto:
    """Add -> Clip(min, max as Constant nodes, as PaddlePaddle writes them) -> Mul."""
    nodes = [
        helper.make_node("Add", ["x", "b"], ["a"], name="add"),
        helper.make_node("Constant", [], ["lo"], value=helper.make_tensor("lo", F32, [], [0.0])),
        helper.make_node("Constant", [], ["hi"], value=helper.make_tensor("hi", F32, [], [6.0])),
        helper.make_node("Clip", ["a", "lo", "hi"], ["c"], name="clip"),
        helper.make_node("Mul", ["c", "b"], ["y"], name="mul"),
    ]
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, [2, 4])],
                      [helper.make_tensor_value_info("y", F32, [2, 4])],
                      [tensor("b", np.linspace(-1, 2, 4))], opset=opset)


def test_a_bf16_clip_is_written_at_an_opset_whose_where_takes_bfloat16():
    # Clip's ONNX function body (Less + Where) declares opset 13, and Where-9 has no bfloat16:
    # ONNX Runtime CPU, which runs the body when it has no BF16 Clip kernel, rejected the
    # opset-13 model written with Add and Mul FP32 ("Type 'tensor(bfloat16)' of input
    # parameter (Constant@2) of operator (Where) ... is invalid"): not a bad type in the model.
    bf16 = ir.DataType.BFLOAT16
    assert function_body_opset("Clip", bf16, 3, 13, 22) == 16
    assert function_body_opset("Clip", bf16, 1, 13, 22) == 13  # no min/max: no Where
    assert function_body_opset("Clip", ir.DataType.FLOAT16, 3, 13, 22) == 13
    assert function_body_opset("LayerNormalization", bf16, 3, 17, 22) == 17
    assert function_body_opset("Conv", bf16, 2, 22, 22) == 22  # no body
    model = clip_model(opset=11)
    plan = PrecisionPlan(Precision.BF16).keep_fp32(["add", "mul"], "engine", "x")
    assert written_opset(model, plan) == 16
    written, report = write_mixed_precision(model, plan, validate=False)
    assert opset_of(written) == 16
    assert any("Clip's function body" in w for w in report.warnings)
    t = types(written)
    clip = next(n for n in written.graph.node if n.op_type == "Clip")
    assert [t[i] for i in clip.input] == [BF16, BF16, BF16]
    onnx.checker.check_model(written, full_check=True)
    # FP16 needs nothing of the kind
    fp16, _ = write_mixed_precision(model, PrecisionPlan(Precision.FP16).keep_fp32(
        ["add", "mul"], "engine", "x"), validate=False)
    assert opset_of(fp16) == 11
