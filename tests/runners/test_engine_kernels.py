"""The deployment engine's kernel gaps (``runners.kernels.engines``) and the plan ``fix`` starts
from for it: nodes ONNX Runtime CUDA has no BF16 kernel for, or an inexact one, stay FP32,
judged at the opset the writer emits."""

import pytest
from tiny_models import conv_pool_model

from precision_doctor.errors import PlanError
from precision_doctor.formats import Precision
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.precision.writer import written_opset
from precision_doctor.repair.stages import keep_for_engine
from precision_doctor.runners.kernels.engines import (
    CUDA_BF16_INEXACT,
    CUDA_NO_BF16,
    ENGINES,
    describe_engine_nodes,
    engine_fp32_nodes,
    engine_of_runner,
    parse_engine,
)

CUDA = ENGINES["ort-cuda"]


def test_the_measured_table_names_the_ops_seen_failing_on_the_h100():
    # the session errors of BENCHMARKS.md ("Provider type for X node ... is not set")
    for op, version in [("GlobalAveragePool", 22), ("MaxPool", 22), ("BatchNormalization", 15),
                        ("PRelu", 16), ("Reciprocal", 13)]:
        assert CUDA.lacks(Precision.BF16, op, version), op
    for op, version in [("Conv", 22), ("MatMul", 13), ("Softmax", 13), ("Add", 14)]:
        assert not CUDA.lacks(Precision.BF16, op, version), op
    assert not CUDA.lacks(Precision.BF16, "MaxPool", 12)  # a BF16 kernel below opset 22
    assert CUDA.inexact_ulps(Precision.BF16, "Sigmoid", 13) == CUDA_BF16_INEXACT["Sigmoid"][1]
    assert CUDA.inexact_ulps(Precision.BF16, "Sigmoid", 13) > 1
    assert CUDA.inexact_ulps(Precision.FP16, "Sigmoid", 13) is None
    assert all(1 <= v <= 22 for versions in CUDA_NO_BF16.values() for v in versions)


def test_engine_nodes_are_judged_at_the_written_opset_and_only_on_float_tensors():
    model = conv_pool_model(opset=11)
    floats = {"x", "c", "p", "s", "g", "f", "y"}
    # at opset 11: MaxPool-11, Sigmoid-6, GlobalAveragePool-1, none of them in the tables
    assert engine_fp32_nodes(model, CUDA, Precision.BF16, 11, floats) == {}
    at22 = engine_fp32_nodes(model, CUDA, Precision.BF16, 22, floats)
    assert list(at22) == ["pool", "sigmoid", "gap"]  # graph order; the int64 Equal left out
    assert "no BF16 kernel in ONNX Runtime CUDA for MaxPool-22" in at22["pool"]
    assert "ulps from FP32 arithmetic rounded once" in at22["sigmoid"]
    assert "equal_ints" in engine_fp32_nodes(model, CUDA, Precision.BF16, 22)  # floats unknown
    assert engine_fp32_nodes(model, CUDA, Precision.FP16, 22, floats) == {}


def test_keep_for_engine_uses_the_opset_the_bf16_conv_needs():
    model = conv_pool_model(opset=11)
    plan = PrecisionPlan(Precision.BF16)
    assert written_opset(model, plan) == 22  # bfloat16 Conv exists from opset 22
    kept = keep_for_engine(model, plan, CUDA, Precision.BF16)
    assert {n: d.reason for n, d in kept.overrides.items()} == {
        "pool": "engine", "sigmoid": "engine", "gap": "engine"}
    user = plan.keep_fp32(["pool"], "user", "--keep")
    again = keep_for_engine(model, user, CUDA, Precision.BF16)
    assert again.overrides["pool"].reason == "user"  # an FP32 node keeps its own reason


def test_parse_engine_and_runner_default():
    assert parse_engine("ort-cuda") is CUDA and parse_engine("ORT_CUDA") is CUDA
    assert parse_engine(None) is None and parse_engine("") is None
    with pytest.raises(PlanError, match="ort-cuda .ONNX Runtime CUDA."):
        parse_engine("tensorrt-llm")
    assert engine_of_runner("ort:cuda,tf32=0") == "ort-cuda"
    assert engine_of_runner("emulate") is None and engine_of_runner("ort:cpu") is None
    text = describe_engine_nodes(CUDA, Precision.BF16, {"MaxPool": 3, "GlobalAveragePool": 10})
    assert text == ("written for ONNX Runtime CUDA: 13 nodes kept FP32 (its BF16 kernels for "
                    "them are missing or inexact: GlobalAveragePool x10, MaxPool x3)")
