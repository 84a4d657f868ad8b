"""The switched emulation (``precision.emulate_switch``): one graph whose FP32 fallbacks are
inputs computes, for every plan, what the per-plan emulation computes."""

from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from real_inputs import real_image
from tiny_models import make_model, tensor

from precision_doctor.formats import Precision
from precision_doctor.precision.conv_bias import FUSED, SEPARATE
from precision_doctor.precision.emulate import emulate
from precision_doctor.precision.emulate_switch import (
    SWITCH_INPUT,
    emulate_switchable,
    switchable,
)
from precision_doctor.precision.plan import NodeDecision, PrecisionPlan
from precision_doctor.runners.emulator import EmulatorRunner
from precision_doctor.runners.sessions import switched

RNG = np.random.default_rng(5)
X = (RNG.standard_normal((1, 4, 6, 6)) * 3).astype(np.float32)


def conv_net():
    """Conv(bias) -> Relu -> Conv -> Add(residual) -> Mul -> MatMul: rounding at every node."""
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Conv", ["x", "W1", "B1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("Conv", ["b", "W2", "B2"], ["c"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "a"], ["d"], name="add"),
        helper.make_node("Mul", ["d", "S"], ["e"], name="mul"),
        helper.make_node("Reshape", ["e", "shape"], ["g"], name="reshape"),
        helper.make_node("MatMul", ["g", "M"], ["y"], name="matmul"),
    ]
    inits = [tensor("W1", RNG.standard_normal((4, 4, 3, 3)).astype(np.float32)),
             tensor("B1", (RNG.standard_normal(4) * 20).astype(np.float32)),
             tensor("W2", RNG.standard_normal((4, 4, 3, 3)).astype(np.float32)),
             tensor("B2", RNG.standard_normal(4).astype(np.float32)),
             tensor("S", np.float32(1.37)),
             onnx.numpy_helper.from_array(np.array([4, 36], dtype=np.int64), "shape"),
             tensor("M", RNG.standard_normal((36, 5)).astype(np.float32))]
    return make_model(nodes, [helper.make_tensor_value_info("x", f, [1, 4, 6, 6])],
                      [helper.make_tensor_value_info("y", f, [4, 5])], inits, opset=17)


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()  # basic: no fusion of FP32 nodes that differ between graphs
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("precision,bias", [(Precision.FP16, FUSED), (Precision.FP16, SEPARATE),
                                            (Precision.BF16, FUSED), (Precision.BF16, SEPARATE),
                                            (Precision.TF32, FUSED)])
def test_every_plan_equals_its_own_emulation(precision, bias) -> None:
    model = conv_net()
    built = emulate_switchable(model, precision, bias)
    assert built is not None
    assert set(built.nodes) == {"conv1", "relu", "conv2", "add", "mul", "matmul"} \
        or precision is Precision.TF32
    session = _session(built.model)
    assert [i.name for i in session.get_inputs()] == ["x", SWITCH_INPUT]
    names = ["conv1", "relu", "conv2", "add", "mul", "matmul"]
    for mask in range(1 << len(names)):
        fp32 = [n for i, n in enumerate(names) if mask >> i & 1]
        plan = PrecisionPlan(precision).keep_fp32(fp32, "test")
        expected = _session(emulate(model, plan, bias)[0]).run(None, {"x": X})[0]
        flags = built.flags(plan)
        got = session.run(None, {"x": X, SWITCH_INPUT: flags})[0]
        # a switched conv adds its bias in a second FP32 operation (one FP32 rounding)
        if bias == SEPARATE and {"conv1", "conv2"} & set(fp32):
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(got, expected, err_msg=f"FP32 nodes {fp32}")


def test_plans_it_cannot_express() -> None:
    built = emulate_switchable(conv_net(), Precision.FP16)
    assert built is not None
    assert built.flags(PrecisionPlan(Precision.BF16)) is None
    mixed = PrecisionPlan(Precision.FP16, {"conv1": NodeDecision(Precision.BF16)})
    assert built.flags(mixed) is None
    assert built.flags(PrecisionPlan(Precision.FP16)).tolist() == [False] * len(built.nodes)
    assert emulate_switchable(conv_net(), Precision.FP32) is None


def test_layernorm_with_low_precision_statistics_is_not_switchable() -> None:
    f = TensorProto.FLOAT
    ln = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], name="ln", axis=-1,
                          stash_type=0)
    model = make_model([ln], [helper.make_tensor_value_info("x", f, [2, 8])],
                       [helper.make_tensor_value_info("y", f, [2, 8])],
                       [tensor("g", np.ones(8, np.float32)), tensor("b", np.zeros(8, np.float32))],
                       opset=17)
    assert not switchable(model, Precision.FP16)
    assert emulate_switchable(model, Precision.FP16) is None


def test_runners_share_one_session_inside_the_scope() -> None:
    model = conv_net()
    plans = [PrecisionPlan(Precision.FP16), PrecisionPlan(Precision.FP16).keep_fp32(["add"], "t")]
    outside = []
    for plan in plans:
        with EmulatorRunner(model, plan) as runner:
            outside.append(runner.run({"x": X})["y"])
    with switched.sessions(on_cpu=True):
        sessions = set()
        for plan, expected in zip(plans, outside):
            with EmulatorRunner(model, plan) as runner:
                assert [m.name for m in runner.input_metadata()] == ["x"]
                sessions.add(id(runner._ort))
                np.testing.assert_allclose(runner.run({"x": X})["y"], expected, rtol=1e-6)
        assert len(sessions) == 1
        # a plan it cannot express gets its own emulation
        mixed = PrecisionPlan(Precision.FP16, {"conv1": NodeDecision(Precision.BF16)})
        with EmulatorRunner(model, mixed) as runner:
            assert runner._switch is None
    assert switched._entry is None  # closed with the scope
    with EmulatorRunner(model, plans[0]) as runner:  # outside: its own session again
        assert runner._switch is None


def test_one_plan_builds_its_own_emulation_and_keeps_the_shared_session() -> None:
    """A stage that runs one plan of another model (marked outputs) inside ``one_plan`` gets
    a per-plan emulation, with the same values, and the open switched session stays."""
    from precision_doctor.graph.outputs import mark_outputs

    model = conv_net()
    plan = PrecisionPlan(Precision.FP16)
    marked = mark_outputs(model, ["y"])
    with EmulatorRunner(marked, plan) as runner:
        expected = runner.run({"x": X})["y"]
    with switched.sessions(on_cpu=True):
        with EmulatorRunner(model, plan) as runner:
            shared = runner._ort
        with switched.one_plan():
            assert not switched.serves(switched.device.current())
            with EmulatorRunner(marked, plan) as runner:
                assert runner._switch is None and runner._ort is not shared
                np.testing.assert_array_equal(runner.run({"x": X})["y"], expected)
        assert switched.serves(switched.device.current())
        assert switched._entry is not None and switched._entry.model is model
        with EmulatorRunner(model, plan) as runner:
            assert runner._ort is shared


def test_real_model_plans_match_their_emulation(shared_dir: Path) -> None:
    """PP-OCRv4 cls: all-FP16 and 10%-FP32 plans equal their per-plan emulation exactly (at
    the basic optimization level, where ONNX Runtime fuses no FP32 nodes)."""
    model = onnx.load(str(shared_dir / "models" / "ppocrv4" / "cls.onnx"))
    x = real_image(shared_dir, "cls")
    built = emulate_switchable(model, Precision.FP16)
    assert built is not None and len(built.nodes) > 100
    session = _session(built.model)
    name = model.graph.input[0].name
    rng = np.random.default_rng(0)
    for share in (0.0, 0.1):
        fp32 = [n for n in built.nodes if rng.random() < share]
        plan = PrecisionPlan(Precision.FP16).keep_fp32(fp32, "test")
        expected = _session(emulate(model, plan)[0]).run(None, {name: x})
        got = session.run(None, {name: x, SWITCH_INPUT: built.flags(plan)})
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)

