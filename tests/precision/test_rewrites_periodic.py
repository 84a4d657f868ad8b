"""reduce-periodic-argument: the Cody-Waite reduction is exact up to float32 rounding, the
rewritten model equals the original in FP32, and a timestep embedding keeps its phase in FP16
with the reduction (and only it) in FP32."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import precision_doctor as pd
from precision_doctor.formats import Precision
from precision_doctor.inputs.feeds import Sample
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.precision.rewrites import RewriteReport, apply_rewrites
from precision_doctor.precision.rewrites.ranges.periodic import phase_limit, reduce_2pi
from precision_doctor.repair.rewrites_proof import calibrate_rewrites, prove_rewrites
from precision_doctor.runners.emulator import EmulatorRunner

RULE = "reduce-periodic-argument"


def timestep_embedding(half: int = 32, opset: int = 17) -> onnx.ModelProto:
    """The sinusoidal timestep embedding of a diffusion U-Net, as diffusers exports it:
    ``t`` int64 ``[B]`` -> float -> ``[B, 1] * freqs[1, half]``, freqs = exp(-log(10000) i /
    half); output ``emb`` float32 ``[B, 2 half]`` = concat(sin, cos)."""
    freqs = np.exp(-math.log(10000.0) * np.arange(half) / half).astype(np.float32)[None, :]
    nodes = [helper.make_node("Cast", ["t"], ["tf"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["tf", "ax"], ["t1"], name="unsqueeze"),
             helper.make_node("Mul", ["t1", "freqs"], ["arg"], name="mul"),
             helper.make_node("Sin", ["arg"], ["s"], name="sin"),
             helper.make_node("Cos", ["arg"], ["c"], name="cos"),
             helper.make_node("Concat", ["s", "c"], ["emb"], name="concat", axis=-1)]
    graph = helper.make_graph(
        nodes, "timestep_embedding", [helper.make_tensor_value_info("t", TensorProto.INT64, ["B"])],
        [helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["B", 2 * half])],
        [numpy_helper.from_array(freqs, "freqs"),
         numpy_helper.from_array(np.array([1], np.int64), "ax")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _run(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _rel(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref))


def _steps(start: int = 80) -> dict:
    return {"t": np.arange(start, 1001, 40, dtype=np.int64)}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, width=32), min_size=1, max_size=64))
def test_reduction_is_exact_up_to_float32_rounding(values: list[float]) -> None:
    x = np.asarray(values, np.float32)
    reduced = reduce_2pi(x).astype(np.float64)
    exact = x.astype(np.float64)
    assert np.all(np.abs(reduced) <= math.pi + 1e-3)
    # sin(x_r) against sin of the float32 x in float64: 4.3e-7 is the bound of the docstring
    assert np.max(np.abs(np.sin(reduced) - np.sin(exact))) <= 4.3e-7
    assert np.max(np.abs(np.cos(reduced) - np.cos(exact))) <= 4.3e-7


def test_cody_waite_beats_mod_by_three_orders() -> None:
    """The measurement behind the choice (periodic.py's docstring): 1.2 million arguments."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-1e4, 1e4, 1_000_000),
                        np.linspace(-1e4, 1e4, 200_001)]).astype(np.float32)
    exact = np.sin(x.astype(np.float64))
    cody_waite = np.max(np.abs(np.sin(reduce_2pi(x).astype(np.float64)) - exact))
    fmod = np.fmod(x, np.float32(2 * math.pi)).astype(np.float64)
    mod = np.max(np.abs(np.sin(fmod) - exact))
    assert cody_waite < 2e-7 and 2.5e-4 < mod < 3e-4


def test_onnx_runtime_runs_the_reduction_as_numpy_does() -> None:
    model = timestep_embedding()
    rewritten, report = apply_rewrites(model, [RULE], target=Precision.FP16)
    onnx.checker.check_model(rewritten, full_check=True)
    feeds = {"t": np.arange(0, 10_001, 7, dtype=np.int64)}
    ref, out = _run(model, feeds), _run(rewritten, feeds)
    assert np.max(np.abs(out - ref)) <= 4.3e-7
    [record] = report.applied(RULE)
    assert record.nodes == ("sin", "cos")
    assert len(record.new_nodes) == 6
    assert set(record.keep_fp32) == {*record.new_nodes, "mul", "cast"}  # Sin/Cos stay low
    assert record.details["bound"] == "unknown"


def test_the_fp32_request_survives_the_json_report() -> None:
    _, report = apply_rewrites(timestep_embedding(), [RULE], target=Precision.FP16)
    again = RewriteReport.from_dict(report.to_dict())
    assert again == report and again.fp32_decisions() == report.fp32_decisions()
    assert report.to_dict()["records"][0]["keep_fp32"][-2:] == ["mul", "cast"]


def test_fp16_phase_error_drops_with_only_the_reduction_in_fp32() -> None:
    model = timestep_embedding()
    feeds = _steps()
    ref = _run(model, feeds).astype(np.float64)
    rewritten, report = apply_rewrites(model, target=Precision.FP16)
    plans = {"naive": (model, PrecisionPlan(Precision.FP16)),
             "rewritten": (rewritten, PrecisionPlan(Precision.FP16, report.fp32_decisions()))}
    errors = {}
    for name, (m, plan) in plans.items():
        with EmulatorRunner(m, plan) as runner:
            errors[name] = _rel(runner.run(feeds)["emb"], ref)
    assert errors["naive"] > 0.02  # 0.028: FP16 spacing 0.5 at t f ~ 1e3
    assert errors["rewritten"] < 1e-3  # 3.5e-4: the FP16 Sin/Cos of an argument in [-pi, pi]
    decisions = report.fp32_decisions()
    assert "sin" not in decisions and "cos" not in decisions
    assert {d.reason for d in decisions.values()} == {"rewrite"}


def test_bf16_phase_error_drops_too() -> None:
    model = timestep_embedding()
    feeds = _steps()
    ref = _run(model, feeds).astype(np.float64)
    rewritten, report = apply_rewrites(model, target=Precision.BF16)
    with EmulatorRunner(model, PrecisionPlan(Precision.BF16)) as runner:
        naive = _rel(runner.run(feeds)["emb"], ref)
    with EmulatorRunner(rewritten, PrecisionPlan(Precision.BF16,
                                                 report.fp32_decisions())) as runner:
        fixed = _rel(runner.run(feeds)["emb"], ref)
    assert naive > 0.15 and fixed < 5e-3  # 0.20 -> 2.9e-3 (BF16 spacing 2^-7 in [2, 4))


def _sin_of(expression_nodes: list, value: str, opset: int = 17) -> onnx.ModelProto:
    nodes = [*expression_nodes, helper.make_node("Sin", [value], ["y"], name="sin")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.array(3.0, np.float32), "three"),
         numpy_helper.from_array(np.array(4.0, np.float32), "four")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_a_bounded_argument_is_left_alone_with_its_bound() -> None:
    model = _sin_of([helper.make_node("Tanh", ["x"], ["th"], name="tanh"),
                     helper.make_node("Mul", ["th", "three"], ["arg"], name="mul")], "arg")
    _, report = apply_rewrites(model, [RULE], target=Precision.FP16)
    [record] = report.skipped(RULE)
    assert "<= 3 <= pi" in record.reason and record.details["bound"] == 3.0
    wider = _sin_of([helper.make_node("Tanh", ["x"], ["th"], name="tanh"),
                     helper.make_node("Mul", ["th", "four"], ["arg"], name="mul")], "arg")
    _, report = apply_rewrites(wider, [RULE], target=Precision.FP16)
    [record] = report.applied(RULE)
    assert record.details["bound"] == 4.0 and record.keep_fp32[-1] == "mul"


def test_checks_say_why_it_does_not_apply() -> None:
    model = timestep_embedding()
    _, report = apply_rewrites(model, [RULE])  # no target: diagnose's engine emulation
    assert report.records == ()
    _, report = apply_rewrites(timestep_embedding(opset=10), [RULE], target=Precision.FP16)
    [record] = report.skipped(RULE)
    assert "no Round" in record.reason
    once, _ = apply_rewrites(model, [RULE], target=Precision.FP16)
    _, again = apply_rewrites(once, [RULE], target=Precision.FP16)
    [record] = again.skipped(RULE)
    assert "already reduced" in record.reason


def test_fix_undoes_it_where_the_argument_is_beyond_its_exact_range() -> None:
    model = timestep_embedding()
    samples = [Sample("s0", {"t": np.array([3_000_000, 7_000_001], np.int64)})]
    rewritten, report = apply_rewrites(model, target=Precision.FP16)
    kept, proved = prove_rewrites(model, rewritten, report, samples, ["emb"], Precision.FP16,
                                  None)
    [undone] = proved.skipped(RULE)
    assert undone.reason.startswith("undone: output 'emb' moved") and not undone.keep_fp32
    assert not proved.fp32_decisions()
    assert [n.op_type for n in kept.graph.node] == [n.op_type for n in model.graph.node]


def test_fix_applies_it_and_keeps_the_sin_in_fp16() -> None:
    model = timestep_embedding()
    data = [{"t": np.arange(80 + k, 1001, 46, dtype=np.int64)} for k in range(3)]
    fixed = pd.fix(model, data, target="fp16", quiet=True, device="cpu")
    report = fixed.report
    [record] = [r for r in report["rewrites"]["records"] if r["rule"] == RULE]
    assert record["applied"] and "mul" in record["keep_fp32"]
    assert 900 < record["details"]["measured_max_abs"] <= 1000  # measured before applying
    overrides = report["plan"]["overrides"]
    assert {overrides[n]["reason"] for n in record["keep_fp32"]} == {"rewrite"}
    assert "sin" not in overrides and "cos" not in overrides
    assert fixed.passed
    assert report["before"]["emb"]["rel_l2"] > 0.02  # 0.034
    assert report["after"]["emb"]["rel_l2"] < 1e-3  # 3.7e-4, the written model


def snake(alpha: float) -> onnx.ModelProto:
    """A Snake activation as vocoders export it (x + sin(a x)^2 / a) behind a residual Add of
    two activations: ``x``, ``r`` float32 ``[4]``; output ``y``."""
    nodes = [helper.make_node("Add", ["x", "r"], ["h"], name="residual"),
             helper.make_node("Mul", ["h", "alpha"], ["ax"], name="mul_alpha"),
             helper.make_node("Sin", ["ax"], ["s"], name="sin"),
             helper.make_node("Mul", ["s", "s"], ["s2"], name="square"),
             helper.make_node("Div", ["s2", "alpha"], ["d"], name="div_alpha"),
             helper.make_node("Add", ["h", "d"], ["y"], name="snake")]
    value = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("x", "r", "y")]
    graph = helper.make_graph(nodes, "snake", value[:2], value[2:],
                              [numpy_helper.from_array(np.array(alpha, np.float32), "alpha")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_fp32_chain_stops_at_a_sum_of_two_activations() -> None:
    _, report = apply_rewrites(snake(1.0), [RULE], target=Precision.FP16)
    [record] = report.applied(RULE)
    assert set(record.keep_fp32) - set(record.new_nodes) == {"mul_alpha", "residual"}
    assert "graph input 'x'" in record.reason and "graph input 'r'" in record.reason


def test_calibration_leaves_a_moderate_argument_alone() -> None:
    assert (phase_limit(Precision.FP16), phase_limit(Precision.BF16)) == (128.0, 16.0)
    rng = np.random.default_rng(0)
    samples = [Sample(f"s{i}", {"x": rng.standard_normal(4).astype(np.float32),
                                "r": rng.standard_normal(4).astype(np.float32)})
               for i in range(3)]
    model = snake(1.0)
    rewritten, report = apply_rewrites(model, target=Precision.FP16)
    assert report.applied(RULE)  # from the graph alone: |x| unknown
    kept, calibrated, maxima = calibrate_rewrites(model, rewritten, report, samples,
                                                  Precision.FP16, None)
    [record] = calibrated.skipped(RULE)
    assert maxima is not None and record.details["measured_max_abs"] == maxima["ax"] < 8
    assert "below 128" in record.reason and not calibrated.fp32_decisions()
    assert [n.op_type for n in kept.graph.node] == [n.op_type for n in model.graph.node]
    loud = [Sample("s", {"x": np.full(4, 300.0, np.float32), "r": np.zeros(4, np.float32)})]
    _, calibrated, _ = calibrate_rewrites(model, rewritten, report, loud, Precision.FP16, None)
    [record] = calibrated.applied(RULE)
    assert record.details["measured_max_abs"] == 300.0
