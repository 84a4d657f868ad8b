"""fix keeps saturate-constants only when the FP32 outputs do not move (repair.rewrites_proof)."""

from __future__ import annotations

import numpy as np
from mask_models import attention, feeds
from onnx import TensorProto, helper, numpy_helper

from precision_doctor.formats import Precision
from precision_doctor.inputs.feeds import Sample
from precision_doctor.precision.rewrites import apply_rewrites
from precision_doctor.repair.rewrites_proof import fp32_drift, prove_rewrites


def _temperature() -> tuple:
    """Softmax(x * 1e5): the constant 'only masks' by the rule's graph test, but it is a
    temperature: clamping it to 65504 changes the FP32 softmax."""
    nodes = [helper.make_node("Mul", ["x", "t"], ["xt"], name="temp"),
             helper.make_node("Softmax", ["xt"], ["y"], name="softmax", axis=-1)]
    graph = helper.make_graph(
        nodes, "temp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.array(1e5, np.float32), "t")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = np.array([[0.0, 1e-5, 2e-5, -1e-5]], np.float32)
    return model, [Sample("s0", {"x": x})]


def test_a_clamp_that_moves_fp32_is_undone():
    model, samples = _temperature()
    rewritten, report = apply_rewrites(model, target=Precision.FP16)
    assert report.applied("saturate-constants")
    kept, proved = prove_rewrites(model, rewritten, report, samples, ["y"], Precision.FP16,
                                  None)
    assert not proved.applied("saturate-constants")
    (undone,) = proved.skipped("saturate-constants")
    assert undone.reason.startswith("undone: output 'y' moved by rel L2")
    assert "saturate-constants" in proved.rules
    assert numpy_helper.to_array(kept.graph.initializer[0]) == np.float32(1e5)


def test_a_mask_clamp_is_kept():
    model = attention("mul")
    samples = [Sample("s0", feeds("mul"))]
    rewritten, report = apply_rewrites(model, ["saturate-constants"], target=Precision.FP16)
    kept, proved = prove_rewrites(model, rewritten, report, samples, ["y"], Precision.FP16,
                                  ["saturate-constants"])
    assert kept is rewritten and proved is report


def test_drift_rules():
    ref = {"y": [np.array([1.0, 2.0], np.float32)], "ids": [np.array([1, 2])]}
    assert fp32_drift(ref, {"y": [np.array([1.0, 2.0000002], np.float32)]}) is None
    assert "moved" in fp32_drift(ref, {"y": [np.array([1.0, 2.1], np.float32)]})
    assert "NaN/Inf" in fp32_drift(ref, {"y": [np.array([1.0, np.nan], np.float32)]})
