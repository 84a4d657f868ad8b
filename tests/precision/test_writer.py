"""Strongly typed writer: Casts at boundaries only, constants converted per consumer, I/O kept,
out-of-range parameters kept FP32, report round trip. Tiny models built from ONNX text."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from precision_doctor.errors import BackendError, PlanError, UnsupportedModelError
from precision_doctor.formats import Precision
from precision_doctor.precision.emulate import emulate
from precision_doctor.precision.plan import NodeDecision, PrecisionPlan
from precision_doctor.precision.writer import core as writer_module
from precision_doctor.precision.writer import write_mixed_precision
from precision_doctor.precision.writer.report import WriterReport

FP16 = PrecisionPlan(Precision.FP16)
F16, F32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT


def parse(body: str, opset: int = 13, extra: str = "") -> onnx.ModelProto:
    return onnx.parser.parse_model(
        f'<ir_version: 8, opset_import: ["" : {opset}]{extra}>\n{body}')


def plan(default: Precision = Precision.FP16, **nodes: str) -> PrecisionPlan:
    return PrecisionPlan(default, {n: NodeDecision(Precision(p), "user") for n, p in nodes.items()})


def run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def inserted_casts(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "Cast" and n.name.startswith("pd_cast/")]


def cast_pairs(model: onnx.ModelProto) -> int:
    producers = {o: n for n in model.graph.node for o in n.output}
    return sum(1 for n in model.graph.node if n.op_type == "Cast" and n.input[0] in producers
               and producers[n.input[0]].op_type == "Cast")


def elem_types(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*g.input, *g.value_info, *g.output]}
    types.update({t.name: t.data_type for t in g.initializer})
    return types


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


CHAIN = """
g (float[1,3,8,8] x) => (float[1,3,8,8] y)
  <float[3,3,3,3] w = {W}, float[3] b = {0.1, -0.2, 0.3}> {
  [conv] c = Conv<kernel_shape=[3,3], pads=[1,1,1,1]>(x, w, b)
  [relu] r = Relu(c)
  [add] y = Add(r, x)
}"""


def chain() -> onnx.ModelProto:
    w = np.random.default_rng(0).normal(0, 0.3, 81).round(3)
    return parse(CHAIN.replace("{W}", "{" + ", ".join(map(str, w)) + "}"))


def feed_x(shape=(1, 3, 8, 8), seed: int = 1) -> dict:
    return {"x": np.random.default_rng(seed).normal(0, 1, shape).astype(np.float32)}


def test_all_fp16_chain_casts_only_at_io_and_agrees_with_emulator():
    model = chain()
    out, report = write_mixed_precision(model, FP16)
    assert report.casts_inserted == 2 and report.casts_at_inputs == 1
    assert report.casts_at_outputs == 1 and cast_pairs(out) == 0
    assert report.initializers_converted == 2 and report.initializers_duplicated == 0
    assert report.nodes_per_precision == {"fp16": 3} and report.ort_validated
    types = elem_types(out)
    assert types["w"] == F16 and types["c"] == F16 and types["y"] == F32
    written = run(out, feed_x())[0]
    emulated = run(emulate(model, report.effective_plan())[0], feed_x())[0]
    assert written.dtype == np.float32
    assert rel_l2(written, emulated) < 2e-3


def test_fp32_island_gets_one_cast_per_boundary():
    model = chain()
    out, report = write_mixed_precision(model, plan(relu="fp32"))
    # x -> fp16 (conv), c -> fp32 (relu), r -> fp16 (add), y -> fp32 (output); the Add also
    # reads x in fp16 and reuses the first Cast.
    assert report.casts_inserted == 4 and cast_pairs(out) == 0
    assert report.node_precisions == {"add": "fp16", "conv": "fp16", "relu": "fp32"}
    types = elem_types(out)
    assert types["c"] == F16 and types["r"] == F32
    assert rel_l2(run(out, feed_x())[0], run(model, feed_x())[0]) < 5e-3


def test_shared_initializer_duplicated_for_fp32_and_fp16_consumers():
    model = parse("""
g (float[2,4] x) => (float[2,4] y, float[2,4] z) <float[4] s = {1.5, 2.5, -3.5, 4.5}> {
  [m16] y = Mul(x, s)
  [m32] z = Add(x, s)
}""")
    out, report = write_mixed_precision(model, plan(m32="fp32"))
    assert report.initializers_duplicated == 1 and report.initializers_converted == 0
    inits = {t.name: t.data_type for t in out.graph.initializer}
    assert inits == {"s": F32, "s_fp16": F16}
    nodes = {n.name: list(n.input) for n in out.graph.node}
    assert nodes["m16"][1] == "s_fp16" and nodes["m32"][1] == "s"
    x = feed_x((2, 4))
    y, z = run(out, x)
    np.testing.assert_allclose(z, x["x"] + np.array([1.5, 2.5, -3.5, 4.5], np.float32))
    assert rel_l2(y, run(model, x)[0]) < 1e-3


def test_shared_initializer_of_two_fp16_nodes_converted_once_in_place():
    model = parse("""
g (float[2,4] x) => (float[2,4] y) <float[4] s = {1, 2, 3, 4}> {
  [a] t = Mul(x, s)
  [b] y = Add(t, s)
}""")
    out, report = write_mixed_precision(model, FP16)
    assert report.initializers_converted == 1 and report.initializers_duplicated == 0
    assert [(t.name, t.data_type) for t in out.graph.initializer] == [("s", F16)]


def test_constant_node_shared_by_fp16_and_fp32_is_copied_never_cast():
    model = parse("""
g (float[2,4] x) => (float[2,4] y, float[2,4] z) {
  [k] c = Constant<value = float[4] {1, 2, 3, 4}>()
  [a] y = Mul(x, c)
  [b] z = Add(x, c)
}""")
    out, report = write_mixed_precision(model, plan(b="fp32"))
    assert report.constants_duplicated == 1
    constants = [n for n in out.graph.node if n.op_type == "Constant"]
    assert [n.name for n in constants] == ["k", "k_fp16"]
    assert all(n.input[0] not in {"c", "c_fp16"} for n in out.graph.node if n.op_type == "Cast")
    assert elem_types(out)["c_fp16"] == F16


def test_parameter_out_of_range_keeps_batchnorm_fp32_even_when_plan_says_fp16():
    model = parse("""
g (float[1,2,4,4] x) => (float[1,2,4,4] y)
  <float[2] s = {1, 1}, float[2] b = {0, 0}, float[2] m = {0, 100}, float[2] v = {4, 98000000}> {
  [conv_relu] r = Relu(x)
  [bn] n = BatchNormalization(r, s, b, m, v)
  [out_relu] y = Relu(n)
}""", opset=12)
    out, report = write_mixed_precision(model, plan(Precision.FP16, bn="fp16"))
    (kept,) = report.kept_fp32
    assert (kept.node, kept.reason, kept.tensor, kept.count_over) == (
        "bn", "parameter-out-of-range", "v", 1)
    assert kept.max_abs == pytest.approx(9.8e7) and kept.limit == 65504
    assert kept.requested == "fp16" and "9.8e+07" in kept.detail
    assert report.node_precisions["bn"] == "fp32"
    assert report.effective_plan().precision_of("bn") is Precision.FP32
    assert {t.name: t.data_type for t in out.graph.initializer}["v"] == F32
    x = {"x": np.abs(feed_x((1, 2, 4, 4))["x"]) * 1e4}
    written, reference = run(out, x)[0], run(model, x)[0]
    assert np.isfinite(written).all() and rel_l2(written, reference) < 2e-3


def test_tf32_nodes_stay_fp32_and_are_listed():
    out, report = write_mixed_precision(chain(), plan(Precision.FP32, conv="tf32"))
    assert report.tf32_nodes == ("conv",) and report.casts_inserted == 0
    assert report.nodes_per_precision == {"fp32": 3}
    assert report.effective_plan().precision_of("conv") is Precision.TF32
    assert all(t.data_type == F32 for t in out.graph.initializer)


def test_model_fields_names_and_io_are_preserved():
    model = chain()
    model.producer_name, model.producer_version, model.doc_string = "exporter", "9.1", "docs"
    model.graph.doc_string = "graph docs"
    model.graph.node[0].doc_string = "conv docs"
    onnx.helper.set_model_props(model, {"character": "a\nb\nc", "other": "1"})
    before = model.SerializeToString()
    out, _ = write_mixed_precision(model, FP16)
    assert model.SerializeToString() == before  # the input is never modified
    assert list(out.metadata_props) == list(model.metadata_props)
    assert (out.producer_name, out.producer_version, out.doc_string) == ("exporter", "9.1", "docs")
    assert out.graph.doc_string == "graph docs" and out.graph.name == model.graph.name
    original = [n.name for n in model.graph.node]
    assert [n.name for n in out.graph.node if not n.name.startswith("pd_cast/")] == original
    assert next(n for n in out.graph.node if n.name == "conv").doc_string == "conv docs"


def test_multiple_io_names_order_and_dtypes_kept_with_keep_io_types():
    model = parse("""
g (float[2,4] b, int64[2] shape, float[2,4] a) => (float[4,2] z, float[2,4] y, int64[2] s) {
  [mul] y = Mul(a, b)
  [resh] z = Reshape(y, shape)
  [shp] s = Shape(a)
}""", opset=13)
    out, report = write_mixed_precision(model, FP16)
    sig = [(v.name, v.type.tensor_type.elem_type) for v in [*out.graph.input, *out.graph.output]]
    assert sig == [(v.name, v.type.tensor_type.elem_type)
                   for v in [*model.graph.input, *model.graph.output]]
    assert report.io_dtypes == {"b": "float32", "shape": "int64", "a": "float32",
                                "z": "float32", "y": "float32", "s": "int64"}
    # Reshape follows the fp16 y, so both float outputs get a Cast back; a and b one Cast each.
    assert report.casts_at_inputs == 2 and report.casts_at_outputs == 2 and cast_pairs(out) == 0
    feeds = {"a": np.ones((2, 4), np.float32) * 3, "b": np.ones((2, 4), np.float32) * 0.5,
             "shape": np.array([4, 2], np.int64)}
    z, y, s = run(out, feeds)
    np.testing.assert_array_equal(y, np.full((2, 4), 1.5, np.float32))
    assert z.shape == (4, 2) and list(s) == [2, 4]


def test_keep_io_types_false_gives_fp16_io():
    out, report = write_mixed_precision(chain(), FP16, keep_io_types=False)
    assert report.casts_inserted == 0
    assert report.io_dtypes == {"x": "float16", "y": "float16"}
    assert out.graph.input[0].type.tensor_type.elem_type == F16
    x16 = feed_x()["x"].astype(np.float16)
    assert run(out, {"x": x16})[0].dtype == np.float16


def test_report_round_trips_through_json():
    _, report = write_mixed_precision(chain(), plan(relu="fp32", conv="tf32"))
    data = json.loads(json.dumps(report.to_dict()))
    assert data["schema_version"] == 1
    assert WriterReport.from_dict(data) == report


def test_unknown_node_in_plan_is_a_plan_error():
    with pytest.raises(PlanError, match="relux"):
        write_mixed_precision(chain(), plan(relux="fp32"))


def test_bf16_raises_opset_and_reports_missing_cpu_kernels():
    model = parse("""
g (float[2,4] x) => (float[2,4] y) <float[4] s = {1, 2, 3, 4}> {
  [mul] t = Mul(x, s)
  [relu] y = Relu(t)
}""", opset=12)
    out, report = write_mixed_precision(model, PrecisionPlan(Precision.BF16))
    assert (report.opset_before, report.opset_after) == (12, 13)  # bf16 Mul/Relu/Cast: 13
    assert report.nodes_per_precision == {"bf16": 2}
    assert {t.name: t.data_type for t in out.graph.initializer} == {"s": onnx.TensorProto.BFLOAT16}
    assert any("opset raised 12 -> 13" in w for w in report.warnings)
    assert not report.ort_validated and any("BF16 kernel" in w for w in report.warnings)


def test_failed_opset_conversion_is_unsupported_model_error(monkeypatch):
    def broken(model, target):
        raise RuntimeError("No Adapter For Foo")

    monkeypatch.setattr(writer_module.version_converter, "convert_version", broken)
    with pytest.raises(UnsupportedModelError, match="No Adapter For Foo"):
        write_mixed_precision(chain(), PrecisionPlan(Precision.BF16))


def test_session_failure_is_backend_error_with_ort_message(monkeypatch):
    # The writer checks the session with onnxruntime directly (it sits below the runners).
    monkeypatch.setattr("precision_doctor.precision.writer.validate.ort_cpu_session_error",
                        lambda model, *args, **kwargs: "boom")
    with pytest.raises(BackendError, match="boom"):
        write_mixed_precision(chain(), FP16)
