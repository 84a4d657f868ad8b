"""A model shipped in FP16 is diagnosed and fixed against its FP32 upcast, never itself."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from rich.console import Console
from tiny_models import IR_VERSION

import precision_doctor as pd
from precision_doctor.report.terminal.diagnosis import render_diagnosis

F32, F16, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16
NP = {F32: np.float32, F16: np.float16, BF16: ml_dtypes.bfloat16}
SHIFT = 2048.0  # FP16 spacing there is 2: (x + 2048) - 2048 keeps x to the nearest even number


def cancelling(dtype: int) -> onnx.ModelProto:
    """``y = (x + 2048) - 2048`` with ``x``, ``y`` and the constant in ``dtype``: a sum that
    cancels, exact in FP32 for |x| < 2^11 at 12 fractional bits, destroyed in FP16."""
    c = numpy_helper.from_array(np.array(SHIFT, NP[dtype]), "c")
    nodes = [helper.make_node("Add", ["x", "c"], ["shifted"], name="shift"),
             helper.make_node("Sub", ["shifted", "c"], ["y"], name="unshift")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", dtype, [1, 64])],
                              [helper.make_tensor_value_info("y", dtype, [1, 64])], [c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    return model


def samples(dtype=np.float16) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"x": rng.normal(0, 1, (1, 64)).astype(dtype)} for _ in range(2)]


def test_fp16_model_is_diagnosed_against_its_fp32_upcast():
    d = pd.diagnose(cancelling(F16), samples(np.float16), noise=False, quiet=True)
    assert d.model["shipped_precision"] == "fp16"
    assert d.model["reference"].startswith(
        "This model is FP16 as shipped; reference = its FP32 upcast")
    rel = d.outputs[0].metrics.rel_l2
    assert d.verdict == "fail" and rel > 0.1  # not 0: FP16 destroys the cancelling sum
    console = Console(record=True, width=100)
    render_diagnosis(d, console)
    assert "This model is FP16 as shipped; reference = its FP32 upcast" in console.export_text()
    assert "This model is FP16 as shipped; reference = its FP32 upcast" in d.to_html()
    assert pd.Diagnosis.from_dict(d.to_dict()).model == d.model  # the JSON keeps it


def test_bf16_model_with_bf16_feeds():
    d = pd.diagnose(cancelling(BF16), samples(ml_dtypes.bfloat16), target="bf16", noise=False,
                    quiet=True)
    assert d.model["shipped_precision"] == "bf16"
    assert d.model["reference"].startswith("This model is BF16 as shipped")
    assert d.verdict == "fail" and d.outputs[0].metrics.rel_l2 > 0.5  # BF16 spacing at 2048: 16


def test_fp16_model_matches_the_fp32_model_it_widens_to():
    """FP32 feeds of FP16-representable values: the same verdict and error as the FP32 model,
    whose JSON has no shipped precision."""
    fp16 = pd.diagnose(cancelling(F16), samples(np.float32), noise=False, quiet=True)
    fp32 = pd.diagnose(cancelling(F32), samples(np.float32), noise=False, quiet=True)
    assert fp16.outputs[0].metrics.rel_l2 == fp32.outputs[0].metrics.rel_l2
    assert set(fp32.to_dict()["model"]) == {"path", "opset", "nodes", "sha256", "producer"}


def test_engine_runners_run_the_model_as_shipped():
    """Without a candidate model, ort:/emulate-written run the FP16 model itself (FP32 feeds
    cast to FP16 at its input), not its FP32 upcast."""
    written = pd.diagnose(cancelling(F16), samples(np.float32), runner="emulate-written",
                          noise=False, quiet=True)
    assert written.model["shipped_precision"] == "fp16" and written.verdict == "fail"
    assert written.outputs[0].metrics.rel_l2 > 0.1  # the shipped FP16 arithmetic, emulated
    cpu = pd.diagnose(cancelling(F16), samples(np.float32), runner="ort:cpu", noise=False,
                      quiet=True)
    # ONNX Runtime CPU runs the FP16 model's Add/Sub in FP32, and says so (not "runs the FP32
    # model in FP32", its warning for an FP32 candidate)
    assert any("no FP16 kernel for Add" in w for w in cpu.warnings)


def test_fix_of_an_fp16_model_writes_a_loadable_fp32_io_model(tmp_path: Path):
    f = pd.fix(cancelling(F16), samples(np.float16), quiet=True)
    assert f.passed and f.report["model"]["shipped_precision"] == "fp16"
    assert f.report["before"]["y"]["rel_l2"] > 0.1
    written = f.save(tmp_path / "fixed.onnx")
    onnx.checker.check_model(str(written["model"]))
    session = ort.InferenceSession(str(written["model"]), providers=["CPUExecutionProvider"])
    assert [i.type for i in session.get_inputs()] == ["tensor(float)"]  # keep_io_types
    x = samples(np.float32)[0]["x"]
    np.testing.assert_allclose(session.run(None, {"x": x})[0], x, atol=1e-3)
    assert "This model is FP16 as shipped" in f.to_html()
