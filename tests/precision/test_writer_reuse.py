"""``PlanWriter`` writes many plans of one model byte for byte as ``write_mixed_precision`` does,
whatever plans came before (what it shares: inferred types, constants' FP16/BF16 fit and their
converted copies)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from precision_doctor.formats import Precision
from precision_doctor.graph.load import load_model
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.precision.writer import PlanWriter, write_mixed_precision

RNG = np.random.default_rng(7)


def _model() -> onnx.ModelProto:
    """x[2,8] -> MatMul(w) -> Add(b) -> Mul(huge: 1e5 > FP16 max) -> Relu -> Mul(Constant)
    -> Add(shared b): initializers, a Constant node, a constant read by two nodes, and one that
    does not fit FP16 (its node stays FP32)."""
    inits = [numpy_helper.from_array(RNG.standard_normal((8, 8)).astype(np.float32), "w"),
             numpy_helper.from_array(RNG.standard_normal(8).astype(np.float32) * 1e-6, "b"),
             numpy_helper.from_array(np.full(8, 1e5, np.float32), "huge")]
    scale = numpy_helper.from_array(np.full(8, 0.5, np.float32), "scale")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "b"], ["a"], name="add"),
             helper.make_node("Mul", ["a", "huge"], ["h"], name="big"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Constant", [], ["s"], name="const", value=scale),
             helper.make_node("Mul", ["r", "s"], ["p"], name="mul"),
             helper.make_node("Add", ["p", "b"], ["y"], name="out")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


MODEL = _model()
NODES = ["mm", "add", "big", "relu", "mul", "out"]
WRITER = PlanWriter(MODEL)  # one writer across every example: later plans reuse earlier ones


def _same(writer: PlanWriter, model: onnx.ModelProto, plan: PrecisionPlan,
          keep_io_types: bool) -> None:
    got, got_report = writer(plan, keep_io_types, validate=False)
    want, want_report = write_mixed_precision(model, plan, keep_io_types, validate=False)
    assert got.SerializeToString() == want.SerializeToString()
    assert got_report == want_report


@settings(max_examples=40, deadline=None)
@given(default=st.sampled_from([Precision.FP16, Precision.BF16]),
       fp32=st.sets(st.sampled_from(NODES)), keep_io_types=st.booleans())
def test_every_plan_is_written_as_on_its_own(default, fp32, keep_io_types):
    _same(WRITER, MODEL, PrecisionPlan(default).keep_fp32(sorted(fp32), "test"), keep_io_types)


def test_a_constant_out_of_range_stays_reported_on_every_write():
    writer = PlanWriter(MODEL)
    for _ in range(2):
        _, report = writer(PrecisionPlan(Precision.FP16), validate=False)
        (kept,) = report.kept_fp32
        assert kept.node == "big" and kept.reason == "parameter-out-of-range"
    assert writer.memo.overflow and writer.memo.converted


@pytest.mark.shared
def test_real_detector_plans_in_sequence(shared_dir: Path):
    """PP-OCRv4 det: FP16 plans with scattered FP32 nodes, then BF16 (opset raised to 22)."""
    model = load_model(shared_dir / "models" / "ppocrv4" / "det.onnx")
    names = [n.name for n in model.graph.node if n.op_type not in ("Constant", "Shape")]
    writer = PlanWriter(model)
    rng = np.random.default_rng(0)
    for default in (Precision.FP16, Precision.FP16, Precision.FP16, Precision.BF16):
        fp32 = rng.choice(names, size=40, replace=False).tolist()
        _same(writer, model, PrecisionPlan(default).keep_fp32(fp32, "test"), True)
