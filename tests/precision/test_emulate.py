import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from tiny_models import conv_bn, make_model, tensor

from precision_doctor.formats import Precision, round_to
from precision_doctor.precision.emulate import emulate
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners.ort import OrtRunner

VALUES = np.abs(np.concatenate([
    (np.random.default_rng(0).standard_normal(20000)
     * np.exp(np.random.default_rng(1).uniform(-25, 25, 20000))),
    np.arange(0, 70000, 7)])).astype(np.float32)


def _identity_model(op: str, opset: int):
    if op == "MatMul":
        nodes = [helper.make_node("MatMul", ["x", "one"], ["y"], name="n")]
        inits = [tensor("one", np.ones((1, 1)))]
        shape = [None, 1]
    else:
        nodes, inits, shape = [helper.make_node("Relu", ["x"], ["y"], name="n")], [], [None]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits,
                      opset)


@pytest.mark.parametrize("precision,op,opset", [
    (Precision.FP16, "Relu", 12), (Precision.BF16, "Relu", 13), (Precision.BF16, "Relu", 12),
    (Precision.TF32, "MatMul", 12)])
def test_activation_rounding_is_exact(precision, op, opset):
    model = _identity_model(op, opset)
    emulated, info = emulate(model, PrecisionPlan(precision))
    x = VALUES if op == "Relu" else VALUES[:, None]
    # Veltkamp (BF16 below opset 13) is exact on normal numbers; subnormals excluded
    normal = x[np.abs(x) > 1.2e-38] if precision is Precision.BF16 and opset < 13 else x
    with OrtRunner(emulated) as r:
        y = r.run({"x": normal})["y"]
    assert np.array_equal(y, round_to(normal, precision))
    expected = "cast" if precision is Precision.FP16 or opset >= 13 else "veltkamp"
    assert info.method[precision.value] == expected


def test_fp32_nodes_untouched_and_out_of_range_parameter_becomes_inf():
    model = conv_bn()
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    with OrtRunner(model) as r:
        ref = r.run({"x": x})["y"]
    fp16, _ = emulate(model, PrecisionPlan(Precision.FP16))
    with OrtRunner(fp16) as r:
        broken = r.run({"x": x})["y"]
    # variance 9.8e7 -> inf in FP16: that channel's normalized output collapses to beta = 0
    assert np.abs(broken[0, 3]).max() == 0 and np.abs(ref[0, 3]).max() > 0
    kept, _ = emulate(model, PrecisionPlan(Precision.FP16).keep_fp32(["bn"], "test"))
    with OrtRunner(kept) as r:
        fixed = r.run({"x": x})["y"]
    assert np.abs(fixed - ref).max() < 1e-2 * np.abs(ref).max()
    same, info = emulate(model, PrecisionPlan(Precision.FP32))
    with OrtRunner(same) as r:
        assert np.array_equal(r.run({"x": x})["y"], ref)
    assert info.rounded_activations == 0


def test_emulation_keeps_names_and_model_untouched():
    model = conv_bn()
    before = model.SerializeToString()
    emulated, _ = emulate(model, PrecisionPlan(Precision.FP16))
    assert model.SerializeToString() == before
    assert [o.name for o in emulated.graph.output] == ["y"]
    produced = {o for n in emulated.graph.node for o in n.output}
    assert {"c", "bn", "y"} <= produced  # rounded values keep the original tensor names


@pytest.mark.parametrize("precision", [Precision.FP16, Precision.BF16])
def test_exact_ops_skip_their_output_round_trip_with_identical_values(precision, monkeypatch):
    """Relu/Clip/MaxPool/Max/Abs/Neg outputs of rounded inputs are already in the format."""
    import precision_doctor.precision.emulate_pass as emulate_module

    f = TensorProto.FLOAT
    nodes = [helper.make_node("Mul", ["x", "s"], ["a"], name="scale"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Clip", ["a", "lo", "hi"], ["c"], name="clip"),
             helper.make_node("MaxPool", ["c"], ["p"], name="pool", kernel_shape=[3],
                              pads=[1, 1]),
             helper.make_node("Neg", ["p"], ["n"], name="neg"),
             helper.make_node("Abs", ["n"], ["b"], name="abs"),
             helper.make_node("Max", ["b", "r"], ["m"], name="max"),
             helper.make_node("Add", ["m", "s"], ["y"], name="add")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", f, [1, 2, 64])],
                       [helper.make_tensor_value_info("y", f, [1, 2, 64])],
                       [tensor("s", 1.3), tensor("lo", 0.1), tensor("hi", 5.7)])
    x = np.random.default_rng(0).standard_normal((1, 2, 64)).astype(np.float32) * 4
    names = ["a", "r", "c", "p", "n", "b", "m", "y"]

    def run():
        emulated, info = emulate(model, PrecisionPlan(precision))
        from precision_doctor.graph.outputs import mark_outputs

        with OrtRunner(mark_outputs(emulated, names)) as runner:
            return runner.run({"x": x}), info.rounded_activations

    fast, fewer = run()
    monkeypatch.setattr(emulate_module, "EXACT_OPS", frozenset())
    full, more = run()
    assert fewer == more - 6  # relu, clip, pool, neg, abs, max
    for n in names:
        assert np.array_equal(fast[n], full[n]), n
        assert np.array_equal(fast[n], round_to(fast[n], precision)), n


def test_an_fp32_weight_only_rounded_copies_read_is_dropped():
    """``w`` is read by FP16 nodes only: the emulation keeps its rounded copy alone. ``b`` is
    read by an FP16 node and an FP32 one: both copies stay. The values are unchanged."""
    from precision_doctor.precision.plan import NodeDecision

    f = TensorProto.FLOAT
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
             helper.make_node("Add", ["a", "b"], ["c"], name="add16"),
             helper.make_node("Add", ["c", "b"], ["y"], name="add32")]
    rng = np.random.default_rng(2)
    model = make_model(nodes, [helper.make_tensor_value_info("x", f, [2, 8])],
                       [helper.make_tensor_value_info("y", f, [2, 8])],
                       [tensor("w", rng.standard_normal((8, 8))),
                        tensor("b", rng.standard_normal(8) * 1e-3)])
    plan = PrecisionPlan(Precision.FP16).with_overrides(
        {"add32": NodeDecision(Precision.FP32, "test")})
    emulated, info = emulate(model, plan)
    assert sorted(t.name for t in emulated.graph.initializer) == ["b", "b__pd_fp16", "w__pd_fp16"]
    assert info.rounded_initializers == 2
    x = rng.standard_normal((2, 8)).astype(np.float32)
    # the values: MatMul and the first Add in FP16 (rounded inputs and outputs), the last in FP32
    weights = {t.name: t for t in model.graph.initializer}
    w16 = round_to(numpy_helper.to_array(weights["w"]), Precision.FP16)
    b = numpy_helper.to_array(weights["b"])
    a = round_to(round_to(x, Precision.FP16) @ w16, Precision.FP16)
    c = round_to(a + round_to(b, Precision.FP16), Precision.FP16)
    with OrtRunner(emulated) as r:
        y = r.run({"x": x})["y"]
    np.testing.assert_allclose(y, c + b, rtol=1e-6)
