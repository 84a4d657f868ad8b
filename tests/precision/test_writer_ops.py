"""Op-specific rules of the strongly typed writer (where onnxconverter-common goes wrong):
Resize scales, Clip/Pad/Where operands, original Casts, data movement between regions,
ConstantOfShape, Range, LayerNormalization, shape arithmetic, If bodies."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from precision_doctor.formats import Precision
from precision_doctor.precision.emulate import emulate
from precision_doctor.precision.plan import NodeDecision, PrecisionPlan
from precision_doctor.precision.writer import write_mixed_precision

FP16 = PrecisionPlan(Precision.FP16)
F16, F32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT


def parse(body: str, opset: int = 13) -> onnx.ModelProto:
    return onnx.parser.parse_model(f'<ir_version: 8, opset_import: ["" : {opset}]>\n{body}')


def plan(default: Precision = Precision.FP16, **nodes: str) -> PrecisionPlan:
    return PrecisionPlan(default, {n: NodeDecision(Precision(p), "user") for n, p in nodes.items()})


def run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def types(model: onnx.ModelProto) -> dict[str, int]:
    g = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph
    found = {v.name: v.type.tensor_type.elem_type for v in [*g.input, *g.value_info, *g.output]}
    found.update({t.name: t.data_type for t in g.initializer})
    return found


def node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.name == name)


def cast_pairs(model: onnx.ModelProto) -> int:
    producers = {o: n for n in model.graph.node for o in n.output}
    return sum(1 for n in model.graph.node if n.op_type == "Cast" and n.input[0] in producers
               and producers[n.input[0]].op_type == "Cast")


def x_feed(shape: tuple[int, ...], seed: int = 0) -> dict:
    return {"x": np.random.default_rng(seed).normal(0, 1, shape).astype(np.float32)}


def close_to_emulator(model: onnx.ModelProto, out: onnx.ModelProto, report, feeds) -> float:
    written = np.asarray(run(out, feeds)[0], np.float64)
    emulated = np.asarray(run(emulate(model, report.effective_plan())[0], feeds)[0], np.float64)
    return float(np.linalg.norm(written - emulated) / np.linalg.norm(emulated))


def test_resize_scales_stay_float32_and_roi_follows_where_allowed():
    model = parse("""
g (float[1,2,4,4] x) => (float[1,2,8,8] y)
  <float[0] roi = {}, float[4] scales = {1, 1, 2, 2}> {
  [relu] r = Relu(x)
  [resize] y = Resize<mode="linear">(r, roi, scales)
}""", opset=12)
    out, report = write_mixed_precision(model, FP16)
    inits = {t.name: t.data_type for t in out.graph.initializer}
    assert inits["scales"] == F32 and inits["roi"] == F16  # roi is T2 (float16 allowed)
    assert node(out, "resize").input[2] == "scales"
    assert report.node_precisions["resize"] == "fp16" and report.casts_inserted == 2
    assert close_to_emulator(model, out, report, x_feed((1, 2, 4, 4))) < 1e-3


def test_clip_min_max_change_with_the_node():
    model = parse("""
g (float[2,8] x, float lo) => (float[2,8] y) <float hi = {0.5}> {
  [relu] r = Relu(x)
  [clip] y = Clip(r, lo, hi)
}""")
    out, _ = write_mixed_precision(model, FP16)
    t = types(out)
    assert t["hi"] == F16  # constant converted, not cast
    clip = node(out, "clip")
    assert t[clip.input[1]] == F16 and clip.input[1] == "lo/fp16"  # graph input cast once
    feeds = {**x_feed((2, 8)), "lo": np.array(0.1, np.float32)}
    np.testing.assert_allclose(run(out, feeds)[0], np.clip(feeds["x"], 0.1, 0.5), atol=1e-3)


def test_cast_to_float_inside_fp16_region_becomes_cast_to_float16():
    model = parse("""
g (float[2,8] x, int64[2,8] k) => (float[2,8] y) {
  [relu] r = Relu(x)
  [cast] kf = Cast<to=1>(k)
  [add] y = Add(r, kf)
}""")
    out, report = write_mixed_precision(model, FP16)
    assert report.cast_nodes_retargeted == ("cast",)
    assert onnx.helper.get_attribute_value(node(out, "cast").attribute[0]) == F16
    assert report.casts_inserted == 2 and cast_pairs(out) == 0  # x in, y out only
    feeds = {**x_feed((2, 8)), "k": np.arange(16, dtype=np.int64).reshape(2, 8)}
    np.testing.assert_allclose(run(out, feeds)[0], np.maximum(feeds["x"], 0) + feeds["k"],
                               rtol=2e-3, atol=2e-3)


def test_data_movement_follows_its_producer_between_regions():
    model = parse("""
g (float[1,4,2,2] x) => (float[1,2,4,2] y) <int64[4] shape = {1, 2, 4, 2}> {
  [a32] a = Relu(x)
  [tr] t = Transpose<perm=[0,1,3,2]>(a)
  [rs] s = Reshape(t, shape)
  [b16] y = Sigmoid(s)
}""")
    out, report = write_mixed_precision(model, plan(a32="fp32"))
    assert report.node_precisions == {"a32": "fp32", "b16": "fp16", "rs": "fp32", "tr": "fp32"}
    # one Cast to fp16 right before the fp16 node and one back for the output: no pairs
    assert report.casts_inserted == 2 and cast_pairs(out) == 0
    assert node(out, "b16").input[0] == "s/fp16"
    _, report16 = write_mixed_precision(model, FP16)
    assert report16.casts_inserted == 2 and report16.node_precisions["tr"] == "fp16"


def test_concat_of_two_regions_takes_the_majority_and_casts_the_other():
    model = parse("""
g (float[1,2] x) => (float[1,6] y) {
  [a] a = Relu(x)
  [b] b = Sigmoid(x)
  [c] c = Tanh(x)
  [cat] y = Concat<axis=1>(a, b, c)
}""")
    out, report = write_mixed_precision(model, plan(c="fp32"))
    assert report.node_precisions["cat"] == "fp16"
    assert node(out, "cat").input[2] == "c/fp16" and cast_pairs(out) == 0


def test_where_pad_and_constant_of_shape_operands():
    model = parse("""
g (float[2,4] x) => (float[2,6] y) <int64[4] pads = {0, 1, 0, 1}, float pv = {-1}> {
  [relu] r = Relu(x)
  [gt] m = Greater(r, pv)
  [shape] s = Shape(r)
  [fill] f = ConstantOfShape<value = float[1] {0.25}>(s)
  [where] w = Where(m, r, f)
  [pad] y = Pad(w, pads, pv)
}""")
    out, report = write_mixed_precision(model, FP16)
    t = types(out)
    assert t["f"] == F16 and t["w"] == F16 and t["pv"] == F16 and t["m"] == onnx.TensorProto.BOOL
    assert report.constants_converted == 1 and report.casts_inserted == 2
    y = run(out, x_feed((2, 4)))[0]
    r = np.maximum(x_feed((2, 4))["x"], 0)
    expected = np.pad(np.where(r > -1, r, 0.25), ((0, 0), (1, 1)), constant_values=-1)
    np.testing.assert_allclose(y, expected, atol=2e-3)


def test_range_has_no_fp16_kernel_in_the_spec_so_it_stays_fp32():
    model = parse("""
g (float[5] x) => (float[5] y) <float start = {0}, float limit = {5}, float delta = {1}> {
  [range] r = Range(start, limit, delta)
  [add] y = Add(x, r)
}""", opset=13)
    out, report = write_mixed_precision(model, FP16)
    assert report.node_precisions["range"] == "fp32" and types(out)["r"] == F32
    assert report.casts_inserted == 3  # x in, r to fp16, y out
    np.testing.assert_allclose(run(out, {"x": np.ones(5, np.float32)})[0], np.arange(1, 6))


def test_layernormalization_scale_and_bias_follow_x():
    model = parse("""
g (float[2,8] x) => (float[2,8] y)
  <float[8] g = {1, 1, 1, 1, 2, 2, 2, 2}, float[8] b = {0, 0, 0, 0, 1, 1, 1, 1}> {
  [ln] y = LayerNormalization<axis=-1, epsilon=0.00001>(x, g, b)
}""", opset=17)
    out, report = write_mixed_precision(model, FP16)
    assert {t.name: t.data_type for t in out.graph.initializer} == {"g": F16, "b": F16}
    assert close_to_emulator(model, out, report, x_feed((2, 8))) < 1e-3


def test_shape_arithmetic_stays_fp32():
    model = parse("""
g (float[1,4,6] x) => (float[1,2,12] y)
  <float two = {2}, int64[1] idx = {1}, int64[1] one = {1}, int64[1] twelve = {12}> {
  [shape] s = Shape(x)
  [gather] d = Gather(s, idx)
  [tofloat] df = Cast<to=1>(d)
  [half] h = Div(df, two)
  [toint] hi = Cast<to=7>(h)
  [cat] target = Concat<axis=0>(one, hi, twelve)
  [relu] r = Relu(x)
  [resh] y = Reshape(r, target)
}""")
    out, report = write_mixed_precision(model, FP16)
    kept = {k.node: k.reason for k in report.kept_fp32}
    assert kept == {"half": "shape-computation"}
    assert not report.cast_nodes_retargeted  # df feeds an FP32 Div: stays Cast(to=FLOAT)
    assert run(out, x_feed((1, 4, 6)))[0].shape == (1, 2, 12)


def test_out_of_range_constant_behind_data_movement_keeps_consumer_fp32():
    model = parse("""
g (float[2,2] x) => (float[2,2] y) <int64[2] shape = {2, 2}> {
  [k] c = Constant<value = float[4] {1, 2, 3, 100000}>()
  [rs] cr = Reshape(c, shape)
  [mul] y = Mul(x, cr)
}""")
    out, report = write_mixed_precision(model, FP16)
    (kept,) = report.kept_fp32
    assert (kept.node, kept.tensor, kept.max_abs) == ("mul", "c", 100000.0)
    x = {"x": np.ones((2, 2), np.float32)}
    np.testing.assert_allclose(run(out, x)[0], [[1, 2], [3, 100000]])


def test_if_node_and_the_values_its_body_reads_stay_fp32():
    model = parse("""
g (float[2] x, bool c) => (float[2] y) {
  [relu] a = Relu(x)
  [if] y = If(c) <then_branch = t () => (float[2] o) { [neg] o = Neg(a) },
                  else_branch = e () => (float[2] o2) { [abs] o2 = Abs(a) }>
}""")
    out, report = write_mixed_precision(model, FP16)
    assert report.subgraph_nodes == 2 and report.node_precisions["if"] == "fp32"
    assert [k.reason for k in report.kept_fp32] == ["subgraph"]
    feeds = {"x": np.array([-1, 2], np.float32), "c": np.array(True)}
    np.testing.assert_allclose(run(out, feeds)[0], [0, -2])
    assert any("If/Loop/Scan" in w for w in report.warnings)


def test_model_cast_feeding_both_regions_makes_no_cast_pair():
    model = parse("""
g (int64[4] k, float[4] x) => (float[4] y, float[4] z) {
  [tofloat] kf = Cast<to=1>(k)
  [a16] y = Mul(kf, x)
  [b32] z = Add(kf, x)
}""")
    out, report = write_mixed_precision(model, plan(b32="fp32"))
    assert cast_pairs(out) == 0 and not report.cast_nodes_retargeted
    assert node(out, "a16").input[0] == "kf/fp16"
    assert node(out, "pd_cast/fp16/kf").input[0] == "k"  # reads k, not the model's Cast
    feeds = {"k": np.arange(4, dtype=np.int64), "x": np.full(4, 0.5, np.float32)}
    y, z = run(out, feeds)
    np.testing.assert_allclose(y, [0, 0.5, 1, 1.5])
    np.testing.assert_allclose(z, [0.5, 1.5, 2.5, 3.5])


def test_batchnorm_15_mean_var_are_checked_even_though_their_type_is_separate():
    model = parse("""
g (float[1,2,3] x) => (float[1,2,3] y)
  <float[2] s = {1, 1}, float[2] b = {0, 0}, float[2] m = {0, 0}, float[2] v = {1, 70000}> {
  [bn] y = BatchNormalization(x, s, b, m, v)
}""", opset=15)
    _, report = write_mixed_precision(model, FP16)
    assert [(k.node, k.tensor) for k in report.kept_fp32] == [("bn", "v")]
    model_ok = parse("""
g (float[1,2,3] x) => (float[1,2,3] y)
  <float[2] s = {1, 1}, float[2] b = {0, 0}, float[2] m = {0, 0}, float[2] v = {1, 4}> {
  [bn] y = BatchNormalization(x, s, b, m, v)
}""", opset=15)
    out, report = write_mixed_precision(model_ok, FP16)
    assert all(t.data_type == F16 for t in out.graph.initializer)
    assert close_to_emulator(model_ok, out, report, x_feed((1, 2, 3))) < 1e-3
