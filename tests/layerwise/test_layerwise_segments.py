"""Layerwise comparison by segments: cuts, boundaries, fallback to marking, same records."""

import json
from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, external_data_helper, helper
from tiny_models import conv_bn, make_model, random_samples, tensor, transformer_block

from precision_doctor.diagnosis.diagnose import diagnose
from precision_doctor.formats import FORMATS, Precision
from precision_doctor.graph.outputs import TensorSite, float_activations
from precision_doctor.graph.segments import (
    cut_like,
    plan_segments,
    segment_model,
    why_not_segmentable,
)
from precision_doctor.graph.shapes import infer_types
from precision_doctor.layerwise.candidates import emulated, emulated_fused, reference_factory
from precision_doctor.layerwise.compare import LayerwiseResult, compare_layerwise
from precision_doctor.layerwise.engines import node_output_bytes
from precision_doctor.layerwise.stats import BLOCK, _Accumulator
from precision_doctor.precision.emulate import emulate
from precision_doctor.precision.plan import PrecisionPlan

FP16 = Precision.FP16


def residual_model():
    """A residual, an int64 shape tensor, a late side input and a reused Constant, all of
    which cross segment boundaries when every node is its own segment."""
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Constant", [], ["k"], name="k",
                         value=helper.make_tensor("kv", f, [], [3.0])),
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Shape", ["a"], ["shp"], name="shape"),
        helper.make_node("Mul", ["a", "k"], ["b"], name="scale"),
        helper.make_node("Sigmoid", ["b"], ["c"], name="sigmoid"),
        helper.make_node("Add", ["c", "a"], ["d"], name="residual"),
        helper.make_node("Flatten", ["d"], ["flat"], name="flatten"),
        helper.make_node("Reshape", ["flat", "shp"], ["e"], name="reshape"),
        helper.make_node("Mul", ["e", "m"], ["g"], name="mask"),
        helper.make_node("MatMul", ["g", "w"], ["h"], name="proj"),
        helper.make_node("Mul", ["h", "k"], ["y"], name="rescale"),
    ]
    w = np.random.default_rng(3).normal(0, 0.5, (8, 8))
    return make_model(nodes, [helper.make_tensor_value_info("x", f, ["batch", 4, 8]),
                              helper.make_tensor_value_info("m", f, ["batch", 4, 8])],
                      [helper.make_tensor_value_info("y", f, ["batch", 4, 8])],
                      [tensor("w", w)])


def residual_samples(count=2):
    rng = np.random.default_rng(5)
    return [{"x": rng.standard_normal((1, 4, 8)).astype(np.float32) * 300,
             "m": rng.uniform(0, 2, (1, 4, 8)).astype(np.float32)} for _ in range(count)]


def _compare(model, samples, plan=None, budget=1 << 30, segments=True):
    plan = plan or PrecisionPlan(FP16)
    return compare_layerwise(model, samples, reference_factory, emulated(plan).factory, FP16,
                             1e-3, budget, segments=segments)


def test_one_node_per_segment_carries_residuals_shapes_and_side_inputs():
    model = residual_model()
    sites = float_activations(model, {"x": (1, 4, 8)})
    segs = plan_segments(model, node_output_bytes(model, sites), budget_bytes=1)
    assert [(s.start, s.stop) for s in segs] == [(i, i + 1) for i in range(len(model.graph.node))]
    by_node = {model.graph.node[s.start].name: s for s in segs}
    assert by_node["residual"].boundary == ("c", "a")  # the residual crosses three cuts
    assert by_node["reshape"].boundary == ("flat", "shp")  # int64 shape tensor
    assert by_node["mask"].model_inputs == ("m",) and by_node["mask"].boundary == ("e",)
    assert "a" in by_node["relu"].carry and "a" in by_node["residual"].release
    assert by_node["rescale"].boundary == ("h",)  # the Constant is copied, not carried
    types = infer_types(model)
    assert types["shp"].tensor_type.elem_type == TensorProto.INT64
    sub = segment_model(model, by_node["rescale"], ["y"], types, len(segs))
    assert [n.op_type for n in sub.graph.node] == ["Constant", "Mul"]
    assert [i.name for i in sub.graph.input] == ["h"] and not sub.graph.initializer
    proj = segment_model(model, by_node["proj"], ["h"], types, len(segs))
    assert [t.name for t in proj.graph.initializer] == ["w"]  # only its own weights
    onnx.checker.check_model(segment_model(model, by_node["residual"], ["d"], types, len(segs)))


def test_segments_give_the_records_of_one_marked_run():
    model, samples = residual_model(), residual_samples()
    plan = PrecisionPlan(FP16).keep_fp32(["sigmoid"], "user")  # a plan override per segment
    marked = _compare(model, samples, plan, segments=False)
    for budget in (1, 200, 1 << 30):  # one node per segment, a few segments, one segment
        seg = _compare(model, samples, plan, budget=budget)
        assert seg.mode == "segments" and seg.fallback_reason is None
        assert seg.records == marked.records
        assert (seg.first_divergence, seg.nan_birth) == (marked.first_divergence,
                                                         marked.nan_birth)
    assert _compare(model, samples, plan, budget=1).chunks == len(model.graph.node)
    assert marked.mode == "marking" and "model of its own" in marked.fallback_reason


def test_candidate_error_accumulates_across_boundaries():
    """The candidate's segments read candidate boundaries: the FP16 overflow born at the Pow
    of a decomposed LayerNorm reaches every later tensor, exactly as in one whole run."""
    model, samples = transformer_block(hot_value=1000.0), random_samples((1, 8, 16))
    feeds = [s.feeds for s in samples]
    seg = _compare(model, feeds, budget=1)
    whole = _compare(model, feeds, segments=False)
    assert seg.chunks == len(model.graph.node) and seg.records == whole.records
    assert seg.nan_birth == "d2" and seg.record("std").cand_inf > 0


def test_control_flow_falls_back_to_marking_and_says_why():
    f = TensorProto.FLOAT
    then_g = helper.make_graph([helper.make_node("Relu", ["a"], ["t"], name="then_relu")],
                               "then", [], [helper.make_tensor_value_info("t", f, [4])])
    else_g = helper.make_graph([helper.make_node("Neg", ["a"], ["e"], name="else_neg")],
                               "else", [], [helper.make_tensor_value_info("e", f, [4])])
    nodes = [helper.make_node("Exp", ["x"], ["a"], name="exp"),
             helper.make_node("ReduceSum", ["a"], ["s"], name="sum", keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["cond"], name="gt"),
             helper.make_node("If", ["cond"], ["r"], name="branch", then_branch=then_g,
                              else_branch=else_g),
             helper.make_node("Sqrt", ["r"], ["y"], name="sqrt")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", f, [4])],
                       [helper.make_tensor_value_info("y", f, [4])], [tensor("zero", 0.0)])
    assert "control flow" in why_not_segmentable(model)
    result = _compare(model, [s.feeds for s in random_samples((4,))], budget=1)
    assert result.mode == "marking" and "'branch' (If)" in result.fallback_reason
    assert result.record("y") is not None and result.chunks >= 2


def test_a_candidate_running_its_own_model_uses_marking():
    report = diagnose(conv_bn(), random_samples((1, 3, 8, 8)), FP16,
                      emulated_fused(conv_bn(), PrecisionPlan(FP16)), noise=False)
    assert report.layerwise.mode == "marking" and report.layerwise.fallback_reason
    direct = compare_layerwise(conv_bn(), [s.feeds for s in random_samples((1, 3, 8, 8))],
                               reference_factory,
                               emulated_fused(conv_bn(), PrecisionPlan(FP16)).factory, FP16,
                               1e-3)  # segments asked for, refused by the candidate
    assert direct.mode == "marking" and "runs a model of its own" in direct.fallback_reason
    assert direct.records == report.layerwise.records
    plain = diagnose(conv_bn(), random_samples((1, 3, 8, 8)), FP16,
                     emulated(PrecisionPlan(FP16)), noise=False, measure_impact=False)
    assert plain.layerwise.mode == "segments"


def test_budget_bounds_every_segment_of_several_nodes():
    model = transformer_block(hot_value=1.0)
    sites = float_activations(model, {"x": (4, 8, 16)})
    sizes = node_output_bytes(model, sites)
    weights = {t.name: t.ByteSize() for t in model.graph.initializer}
    for budget in (600, 2048, 8192):
        segs = plan_segments(model, sizes, budget)
        assert sum(s.stop - s.start for s in segs) == len(model.graph.node)
        for s in segs:
            nodes = model.graph.node[s.start:s.stop]
            inits = {n for node in nodes for n in node.input if n in weights}
            used = sum(sizes[s.start:s.stop]) + sum(
                4 * int(np.prod(onnx.numpy_helper.to_array(t).shape))
                for t in model.graph.initializer if t.name in inits)
            assert used <= budget or s.stop - s.start == 1
    assert len(plan_segments(model, sizes, 1 << 30)) == 1
    assert len(plan_segments(model, sizes, 600)) > len(plan_segments(model, sizes, 8192))


def test_external_data_initializers_stay_references():
    model = residual_model()
    w = model.graph.initializer[0]
    external_data_helper.set_external_data(w, location="weights.bin", offset=0, length=256)
    w.ClearField("raw_data")
    w.ClearField("float_data")
    sites = float_activations(model, {"x": (1, 4, 8)})
    segs = plan_segments(model, node_output_bytes(model, sites), 1)
    proj = next(s for s in segs if model.graph.node[s.start].name == "proj")
    sub = segment_model(model, proj, ["h"], infer_types(model), len(segs))
    (t,) = sub.graph.initializer
    assert t.data_location == TensorProto.EXTERNAL and not t.raw_data
    assert {e.key: e.value for e in t.external_data}["location"] == "weights.bin"


def test_result_json_round_trip_keeps_mode_and_reason():
    result = _compare(residual_model(), residual_samples(1), segments=False)
    data = json.loads(json.dumps(result.to_dict()))
    assert LayerwiseResult.from_dict(data) == result
    assert data["mode"] == "marking" and data["fallback_reason"]
    del data["mode"], data["fallback_reason"]  # a report written before segments existed
    assert LayerwiseResult.from_dict(data).mode == "marking"


@pytest.mark.parametrize("pattern,size", [("mixed", 4000), ("sparse", 4000), ("relu", 4000),
                                          ("mixed", 2 * BLOCK + 123)])
def test_fast_statistics_equal_the_general_path(pattern, size):
    """The blocked fast path counts exactly what the general path counts; its sums agree to
    float32 rounding (BLAS dots instead of numpy's pairwise sums)."""
    rng = np.random.default_rng(0)
    fmt = FORMATS[FP16]
    r = rng.standard_normal(size).astype(np.float32) * 3e4
    r[3::17] *= 10  # beyond 65504
    if pattern == "relu":  # half exact zeros, nothing else small
        r = np.maximum(r, 0)
    else:
        step = 7 if pattern == "mixed" else 101  # dense or sparse small values
        r[::step] = 0.0
        r[1::step] = rng.uniform(-6e-5, 6e-5, r[1::step].size)  # FP16 subnormal range
        r[2::step] = rng.uniform(-3e-8, 3e-8, r[2::step].size)  # below half the smallest one
    c = (r * (1 + rng.standard_normal(r.size) * 1e-3)).astype(np.float32)
    c[1::5] = 0.0
    site = TensorSite("t", "n", "Op", 0, r.size)
    fast, general = _Accumulator(site), _Accumulator(site)
    for _ in range(2):
        fast.add(r, c, fmt.max, fmt.min_subnormal, fmt.min_normal)
        general._add_nonfinite(r, c, fmt.max, fmt.min_subnormal, fmt.min_normal)
    rec, want = fast.record(fmt.max), general.record(fmt.max)
    assert rec.mean_abs_err == pytest.approx(want.mean_abs_err, rel=1e-5)
    assert rec.rel_l2 == pytest.approx(want.rel_l2, rel=1e-5)
    assert replace(rec, mean_abs_err=0.0, rel_l2=0.0) == replace(want, mean_abs_err=0.0,
                                                                rel_l2=0.0)
    assert rec.overflow
    if pattern != "relu":
        assert rec.flush_to_zero and rec.subnormal and rec.lost_to_zero


@pytest.mark.parametrize("budget", [1, 1 << 30])
def test_cutting_the_whole_emulation_gives_the_per_segment_records(budget):
    """The emulator's whole graph cut like the model (``graph.segments.cut_like``) gives the
    records of emulating every segment on its own, tensor for tensor; its cut carries the
    emulator's rounded copies of inputs that cross a cut."""
    for model, samples, plan in [
            (residual_model(), residual_samples(), PrecisionPlan(FP16)),
            (residual_model(), residual_samples(),
             PrecisionPlan(FP16).keep_fp32(["sigmoid"], "user")),
            (transformer_block(hot_value=1000.0, opset=13),
             [s.feeds for s in random_samples((1, 8, 16), count=2)], PrecisionPlan(FP16))]:
        cand = emulated(plan)
        per_segment = compare_layerwise(model, samples, reference_factory, cand.factory, FP16,
                                        1e-3, budget)
        whole = compare_layerwise(model, samples, reference_factory, cand.factory, FP16, 1e-3,
                                  budget, candidate_graph=cand.graph)
        assert whole.mode == "segments" and whole.records == per_segment.records
        assert whole.chunks == per_segment.chunks


def test_cut_like_places_each_cut_before_the_segment_start_node():
    model = residual_model()
    sites = float_activations(model, {"x": (1, 4, 8)})
    segs = plan_segments(model, node_output_bytes(model, sites), budget_bytes=1)
    emulated_model, _ = emulate(model, PrecisionPlan(FP16))
    cut = cut_like(model, segs, emulated_model)
    assert cut is not None and len(cut) == len(segs)
    for seg, there in zip(segs, cut):
        produced = {o for n in emulated_model.graph.node[there.start:there.stop] for o in n.output}
        for node in model.graph.node[seg.start:seg.stop]:
            assert node.name in {n.name for n in emulated_model.graph.node[there.start:there.stop]}
            assert set(node.output) <= produced  # the rounded value keeps the name
    renamed = onnx.ModelProto()
    renamed.CopyFrom(emulated_model)
    start = model.graph.node[segs[2].start].name
    next(n for n in renamed.graph.node if n.name == start).name = "not-there"
    assert cut_like(model, segs, renamed) is None


def test_statistics_of_huge_finite_values_do_not_overflow():
    """An attention mask of -3.4e38 (float32's lowest): its squares overflow a float32 sum, so
    the relative L2 error must come from float64 sums, not inf/inf or x/inf."""
    fmt = FORMATS[FP16]
    r = np.full(4096, -3.4e38, np.float32)
    r[::2] = 0.5
    c = r.copy()
    c[::2] = 0.5 * (1 + 1e-3)
    acc = _Accumulator(TensorSite("mask", "n", "Add", 0, r.size))
    with np.errstate(over="raise"):
        acc.add(r, c, fmt.max, fmt.min_subnormal, fmt.min_normal)
    rec = acc.record(fmt.max)
    assert rec.overflow == 2048 and rec.cand_nan == rec.cand_inf == 0
    assert 0 < rec.rel_l2 < 1e-30 and rec.max_abs_err == pytest.approx(5e-4, rel=1e-3)
