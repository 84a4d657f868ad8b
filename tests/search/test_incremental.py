"""Incremental evaluation (search.incremental): a plan's outputs are the same bits whether its
segments run from a kept state or from the inputs, whatever plans came before, and within the
cache bound."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from real_inputs import real_image

from precision_doctor.formats import Precision
from precision_doctor.graph.load import load_model
from precision_doctor.inputs.feeds import Sample
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners.emulator import EmulatorRunner
from precision_doctor.search.incremental import IncrementalEmulation, incremental_scope

_OPS = ("Mul", "Add", "Tanh", "Sigmoid", "Exp", "Sub")


def _chain(depth: int = 24) -> onnx.ModelProto:
    """Elementwise ops with a skip connection every few nodes: values near FP16's rounding
    steps, so a node's precision shows in the output bits."""
    nodes, prev, skip = [], "x", "x"
    for i in range(depth):
        op = _OPS[i % len(_OPS)]
        out = f"t{i}"
        if op in ("Mul", "Add", "Sub"):
            other = skip if i % 4 == 0 else f"c{i}"
            nodes.append(helper.make_node(op, [prev, other], [out], name=f"n{i}"))
        else:
            nodes.append(helper.make_node(op, [prev], [out], name=f"n{i}"))
        if i % 5 == 0:
            skip = out
        prev = out
    inits = [helper.make_tensor(f"c{i}", TensorProto.FLOAT, [8], np.linspace(
        0.1 + i / 50, 0.9, 8).astype(np.float32)) for i in range(depth)]
    used = {n for nd in nodes for n in nd.input}
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["n", 8])], [helper.make_tensor_value_info(
            prev, TensorProto.FLOAT, ["n", 8])], [t for t in inits if t.name in used])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _samples(count: int, seed: int = 0) -> list[Sample]:
    rng = np.random.default_rng(seed)
    return [Sample(f"s{i}", {"x": rng.normal(0, 1.5, (3, 8)).astype(np.float32)})
            for i in range(count)]


def _bits(outputs: dict) -> dict[str, bytes]:
    return {k: np.asarray(v).tobytes() for k, v in outputs.items()}


MODEL = _chain()
NAMES = [n.name for n in MODEL.graph.node]


@settings(max_examples=6, deadline=None)
@given(plans=st.lists(st.sets(st.sampled_from(NAMES)), min_size=2, max_size=4),
       cache=st.sampled_from([0, 200, 1 << 20]))
def test_a_plan_gives_the_same_bits_from_kept_states_as_from_its_inputs(plans, cache):
    samples = _samples(3)
    with IncrementalEmulation(MODEL, Precision.FP16, samples, segments=5,
                              cache_bytes=cache) as inc:
        for fp32 in plans:
            plan = PrecisionPlan(Precision.FP16).keep_fp32(sorted(fp32), "test")
            with inc.runner(plan) as r, EmulatorRunner(MODEL, plan) as whole:
                for i in (2, 0, 1):
                    got = _bits(r.run_sample(i, samples[i].feeds))
                    assert got == _bits(r.run(samples[i].feeds))
                    assert got == _bits(whole.run(samples[i].feeds))  # no fusion across cuts
            assert inc._state_bytes <= cache


def test_a_repeated_prefix_skips_its_segments_and_reuses_its_sessions():
    samples = _samples(2)
    late = NAMES[-3:]  # only the last segment differs between the two plans
    with IncrementalEmulation(MODEL, Precision.FP16, samples, segments=4) as inc:
        assert len(inc.segments) == 4
        for fp32 in ([], late):
            plan = PrecisionPlan(Precision.FP16).keep_fp32(fp32, "test")
            with inc.runner(plan) as r:
                for i, s in enumerate(samples):
                    r.run_sample(i, s.feeds)
        assert inc.counts.segments_skipped == 2 * 3
        assert inc.counts.segment_runs == 2 * 4 + 2 * 1
        assert inc.counts.sessions_built == 4 + 1  # the second plan opens its last segment only


def test_the_plan_must_share_the_default_and_the_graph_must_be_cuttable():
    samples = _samples(1)
    with IncrementalEmulation(MODEL, Precision.FP16, samples) as inc:
        with pytest.raises(ValueError, match="bf16"):
            inc.runner(PrecisionPlan(Precision.BF16))
    loop = helper.make_model(helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="branch",
                          then_branch=helper.make_graph([], "t", [], []),
                          else_branch=helper.make_graph([], "e", [], []))],
        "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]))
    with pytest.raises(ValueError, match="control flow"):
        IncrementalEmulation(loop, Precision.FP16, samples)
    assert not isinstance(incremental_scope(loop, Precision.FP16, samples),
                          IncrementalEmulation)


def test_real_recognizer_keeps_its_bits_across_a_search_like_sequence(shared_dir: Path):
    model = load_model(shared_dir / "models/ppocrv4/rec.onnx")
    x = real_image(shared_dir, "rec")
    samples = [Sample("a", {"x": x}), Sample("b", {"x": x[..., ::-1].copy()})]
    compute = [n.name for n in model.graph.node if n.op_type in ("Conv", "MatMul", "Add")]
    rng = np.random.default_rng(3)
    sets = [[], compute[: len(compute) // 2], compute[: len(compute) // 2][:-5],
            list(rng.choice(compute, 12, replace=False))]
    with IncrementalEmulation(model, Precision.FP16, samples) as inc:
        for fp32 in sets:
            plan = PrecisionPlan(Precision.FP16).keep_fp32(fp32, "test")
            with inc.runner(plan) as r:
                for i, s in enumerate(samples):
                    assert _bits(r.run_sample(i, s.feeds)) == _bits(r.run(s.feeds))
        assert inc.counts.segments_skipped > 0


def test_a_graph_output_that_no_node_computes_is_left_to_whole_runs():
    passthrough = onnx.ModelProto()
    passthrough.CopyFrom(MODEL)
    passthrough.graph.output.append(helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                  ["n", 8]))
    with pytest.raises(ValueError, match="'x' is not computed"):
        IncrementalEmulation(passthrough, Precision.FP16, _samples(1))
