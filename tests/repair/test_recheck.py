"""``repair.recheck``: where the search's plan fails its verification, ``fix`` searches again
judged by the verifying runner, and returns a passing plan wherever every candidate in FP32
passes. The search's answer is made to fail deterministically here (on any CPU, whatever
kernels ONNX Runtime picks) by replacing it with the start plan."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tiny_models import random_samples

from precision_doctor.compare.metrics import relative_l2
from precision_doctor.compare.tasks.registry import get_metric
from precision_doctor.compare.tolerance import Tolerance
from precision_doctor.errors import TargetNotMetError
from precision_doctor.formats import Precision
from precision_doctor.precision.plan import PrecisionPlan, candidate_nodes
from precision_doctor.precision.writer import write_mixed_precision
from precision_doctor.repair import pipeline, recheck, stages
from precision_doctor.repair.recheck import recheck_ranking
from precision_doctor.runners.emulator import EmulatorRunner
from precision_doctor.runners.ort import OrtRunner
from precision_doctor.search.bisection import SearchResult
from precision_doctor.search.objective import Objective, Score

F = TensorProto.FLOAT
TOL = Objective(tolerances={"*": Tolerance(rel_l2=1e-2)})


def _node(op, inputs, output, **attrs):
    return helper.make_node(op, inputs, [output], name=output, **attrs)


def _model(nodes, inits, outputs, shape=(1, 4, 8)) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "recheck", [helper.make_tensor_value_info("x", F, list(shape))], outputs,
        [numpy_helper.from_array(np.asarray(v, d), n) for n, (v, d) in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def underflow() -> onnx.ModelProto:
    """y = ((x * 1e-9) * 1e3) + x * 0: 1e-9 flushes to zero in FP16, so the all-FP16 plan
    loses y (relative L2 1); a and b in FP32 cure it, c may stay FP16."""
    return _model([_node("Mul", ["x", "tiny"], "a"), _node("Mul", ["a", "big"], "b"),
                   _node("Mul", ["x", "zero"], "c"), _node("Add", ["b", "c"], "y")],
                  {"tiny": (1e-9, np.float32), "big": (1e3, np.float32),
                   "zero": (0.0, np.float32)},
                  [helper.make_tensor_value_info("y", F, [1, 4, 8])])


def _answer_fails(monkeypatch, keep: tuple[str, ...] = ()) -> None:
    """The search's answer becomes its start plan with ``keep`` in FP32 (which fails), its
    score still passing: a search whose evaluations disagree with the verifying runner."""
    real = stages.search

    def search(request, baseline, rewritten, start):
        found = real(request, baseline, rewritten, start)
        wrong = replace(found.result, plan=start.plan.keep_fp32(list(keep), "search"),
                        kept=keep, final_outputs=None)
        return replace(found, result=wrong)

    monkeypatch.setattr(pipeline, "search", search)


def _verified_independently(result, samples, bound: float = 1e-2) -> float:
    """Relative L2 of the fixed model on ONNX Runtime CPU against the FP32 model's."""
    with OrtRunner(result.rewritten, ("cpu",)) as ref, OrtRunner(result.model, ("cpu",)) as got:
        err = max(relative_l2([ref.run(s.feeds)["y"]], [got.run(s.feeds)["y"]])
                  for s in samples)
    assert err <= bound
    return err


def test_recheck_ranking_puts_the_first_answer_first_and_covers_every_candidate():
    assert recheck_ranking(["c", "a"], ["a", "b", "x"], ["a", "b", "c", "d"]) == [
        "c", "a", "b", "d"]
    assert recheck_ranking([], [], ["a", "b"]) == ["a", "b"]


def test_an_answer_failing_verification_is_searched_again_on_the_written_model(monkeypatch):
    model, samples = underflow(), random_samples((1, 4, 8))
    _answer_fails(monkeypatch)
    result = pipeline.fix(model, samples, Precision.FP16, TOL, rewrites=[])
    assert result.passed
    candidates = {n.name for n in candidate_nodes(result.rewritten)}
    assert set(result.plan.fp32_nodes()) <= candidates
    assert {"a", "b"} <= set(result.plan.fp32_nodes())
    assert any(t.stage.startswith("verified-") for t in result.search.trials)
    assert any("searched again" in w for w in result.warnings), result.warnings
    assert "recheck" in result.seconds
    _verified_independently(result, samples)


def quantized_matmul() -> onnx.ModelProto:
    """Q -> DQ -> MatMul <- DQ(int8 weights) of ``tests/fuzz/test_regressions.py``."""
    weights = np.tile(np.array([[120], [125], [-119], [-110]], np.int8), (2, 8))
    return _model([_node("QuantizeLinear", ["x", "s", "zp"], "q"),
                   _node("DequantizeLinear", ["q", "s", "zp"], "dq"),
                   _node("DequantizeLinear", ["wq", "ws", "wzp"], "w"),
                   _node("MatMul", ["dq", "w"], "y")],
                  {"s": (0.001, np.float32), "zp": (128, np.uint8), "wq": (weights, np.int8),
                   "ws": (7.874016e-12, np.float32), "wzp": (0, np.int8)},
                  [helper.make_tensor_value_info("y", F, [1, 4, 8])])


def test_each_plan_of_the_second_search_is_judged_by_its_own_verifier(monkeypatch):
    """The answer (w, y) fails (its FP16 DQ's scale is rounded) and is verified by ONNX Runtime
    CPU, which has FP16 Q and DQ kernels; a plan with the MatMul in FP16 is verified by the
    exact emulation of the written model (ONNX Runtime CPU would run that MatMul in FP32).
    Judged by the first verifier, the second search took such a plan, which then failed its
    own verification; judged by the runner ``verify`` picks for each, its answer passes as
    found (dq, w, y in FP32 run the reference's own fused kernel on any CPU)."""
    samples = random_samples((1, 4, 8), scale=0.001)  # q near its zero point: no saturation
    _answer_fails(monkeypatch, ("w", "y"))  # Q and DQ in FP16: dq's scale rounded, 4e-4 off
    result = pipeline.fix(quantized_matmul(), samples, Precision.FP16,
                          Objective(tolerances={"*": Tolerance(rel_l2=1e-6)}))
    assert result.passed
    assert any("searched again" in w for w in result.warnings), result.warnings
    assert set(result.plan.fp32_nodes()) <= {"q", "dq", "w", "y"}


def test_every_candidate_in_fp32_is_returned_where_the_second_search_gives_up(monkeypatch):
    model, samples = underflow(), random_samples((1, 4, 8))
    _answer_fails(monkeypatch)

    def gives_up(*args, **kwargs):
        raise TargetNotMetError("not met", best=1.0)

    monkeypatch.setattr(recheck, "search_fp32_set", gives_up)
    result = pipeline.fix(model, samples, Precision.FP16, TOL, rewrites=[])
    assert result.passed
    assert set(result.plan.fp32_nodes()) == {n.name for n in candidate_nodes(result.rewritten)}
    assert any("every candidate node in FP32" in w for w in result.warnings), result.warnings
    _verified_independently(result, samples)


def test_the_first_verification_stands_where_every_candidate_in_fp32_fails(monkeypatch):
    """A target nothing meets (top-1 agreement above 1): the second search gives up, every
    candidate in FP32 fails its verification too, and ``fix`` fails with the first plan."""

    def search(request, baseline, rewritten, start):  # an answer claimed to pass
        return stages.Searched(SearchResult(start.plan, (), Score(True, 1.0, {}), ()), None, 0.0)

    monkeypatch.setattr(pipeline, "search", search)
    impossible = Objective(metric=get_metric("top1"), threshold=1.5)
    result = pipeline.fix(underflow(), random_samples((1, 4, 8)), Precision.FP16, impossible,
                          rewrites=[])
    assert not result.passed and result.search.kept == ()
    assert any("with every candidate node in FP32" in w for w in result.warnings), (
        result.warnings)


def test_a_passing_verification_is_not_searched_again():
    model, samples = underflow(), random_samples((1, 4, 8))
    result = pipeline.fix(model, samples, Precision.FP16, TOL, rewrites=[])
    assert result.passed and "recheck" not in result.seconds
    assert not any(t.stage.startswith("verified-") for t in result.search.trials)


# -- nodes that read a float and write an integer decide: their float inputs can stay exact --
def decisions() -> onnx.ModelProto:
    """a = x * 1 read by QuantizeLinear, Cast to int32, ArgMax, Round -> Cast, Ceil -> Cast,
    Greater and TopK; y = x * 2 beside them."""
    i64, vi = TensorProto.INT64, helper.make_tensor_value_info
    nodes = [_node("Mul", ["x", "one"], "a"), _node("QuantizeLinear", ["a", "s", "zp"], "q"),
             _node("Cast", ["a"], "ci", to=TensorProto.INT32),
             _node("ArgMax", ["a"], "am", axis=-1),
             _node("Round", ["a"], "r"), _node("Cast", ["r"], "rc", to=i64),
             _node("Ceil", ["a"], "c"), _node("Cast", ["c"], "cc", to=i64),
             _node("Greater", ["a", "thr"], "gt"),
             helper.make_node("TopK", ["a", "k"], ["tv", "ti"], name="tk", axis=-1),
             _node("Mul", ["x", "two"], "y")]
    outputs = [vi("q", TensorProto.UINT8, [1, 4]), vi("ci", TensorProto.INT32, [1, 4]),
               vi("am", i64, [1, 1]), vi("rc", i64, [1, 4]), vi("cc", i64, [1, 4]),
               vi("gt", TensorProto.BOOL, [1, 4]), vi("ti", i64, [1, 2]), vi("y", F, [1, 4])]
    return _model(nodes, {"one": (1.0, np.float32), "two": (2.0, np.float32),
                          "s": (1.0, np.float32), "zp": (0, np.uint8), "k": ([2], np.int64),
                          "thr": (100.01, np.float32)}, outputs, shape=(1, 4))


# FP16's spacing at 100 is 1/16: 100.51 rounds to 100.5 (Round: 100, not 101), 100.999 to 101
# (Cast: 101, not 100), 100.02 and 100.001 to 100 (Ceil: 100, not 101; Greater 100.01: false)
DECIDING = {"x": np.array([[100.51, 100.999, 100.02, 100.001]], np.float32)}
DECISIONS = ["q", "ci", "am", "rc", "cc", "gt", "ti"]


@pytest.mark.parametrize("verify_with", ["emulator", "written"])
def test_a_plan_keeps_the_float_inputs_of_deciding_nodes_exact(verify_with):
    """Every decision of the FP32 model is reproduced by a plan that keeps the deciding nodes'
    producer (and those of them that are candidates) FP32, with y still FP16; the all-FP16
    plan flips some of them, so the test would see a rounding left in."""
    model = decisions()
    with OrtRunner(model, ("cpu",)) as runner:
        ref = runner.run(DECIDING)
    low = PrecisionPlan(Precision.FP16)
    with EmulatorRunner(model, low) as runner:
        naive = runner.run(DECIDING)
    assert any(not np.array_equal(ref[k], naive[k]) for k in DECISIONS)
    candidates = {n.name for n in candidate_nodes(model)}
    assert {"a", "q", "r", "c", "y"} <= candidates  # the float-reading deciders are candidates
    plan = low.keep_fp32(sorted(candidates - {"y"}), "decision")
    if verify_with == "emulator":
        with EmulatorRunner(model, plan) as runner:
            got = runner.run(DECIDING)
    else:
        written, report = write_mixed_precision(model, plan)
        assert report.node_precisions["y"] == "fp16"
        with OrtRunner(written, ("cpu",)) as runner:
            got = runner.run(DECIDING)
    for name in DECISIONS:
        assert np.array_equal(ref[name], got[name]), name
