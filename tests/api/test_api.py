"""The public API at the package root: diagnose, fix, audit, compare_inputs and their results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper
from tiny_models import conv_bn, make_model, transformer_block

import precision_doctor as pd
from precision_doctor.errors import (
    InputError,
    InputNameError,
    ModelLoadError,
    OutputExistsError,
    PrecisionDoctorError,
)

RNG = np.random.default_rng(0)
ENV = {**os.environ, "PYTHONPATH": str(Path(pd.__file__).parents[1])}  # this precision_doctor


def feeds(count: int = 2, shape=(1, 8, 16)) -> list[dict[str, np.ndarray]]:
    return [{"x": RNG.standard_normal(shape).astype(np.float32)} for _ in range(count)]


def test_root_exports_are_short_and_complete():
    assert {"diagnose", "fix", "audit", "compare_inputs", "Diagnosis", "Fix", "Audit",
            "InputComparison", "PrecisionDoctorError", "InputError"} <= set(pd.__all__)
    # 31: the PyTorch user's two entry points beside diagnose/fix (compare_autocast,
    # torch_recipe); their result types stay in precision_doctor.api
    assert len(pd.__all__) < 32
    for name in pd.__all__:
        assert getattr(pd, name) is not None
    assert issubclass(pd.InputShapeError, pd.InputError)
    assert issubclass(pd.InputError, pd.PrecisionDoctorError)


def test_import_is_light():
    code = ("import sys, precision_doctor as pd; "
            "print(sorted(m for m in ('onnx', 'onnxruntime', 'onnx_ir', 'numpy', 'rich') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=ENV)
    assert out.stdout.strip() == "[]"


def test_audit_is_the_function_even_after_the_audit_subpackage_loads():
    """``precision_doctor.audit`` is also a subpackage; the root's public name is the function."""
    code = ("import precision_doctor.audit.records, precision_doctor as pd; "
            "import precision_doctor.api; a = pd.audit; "
            "import precision_doctor as pd2; pd2.__dict__.pop('audit'); b = pd2.audit; "
            "print(callable(a), callable(b))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=ENV)
    assert out.stdout.split() == ["True", "True"]
    assert callable(pd.audit)


def test_help_documents_arguments_return_and_errors():
    doc = pd.diagnose.__doc__ or ""
    for word in ("Args:", "model:", "data:", "target:", "tolerance:", "progress:", "Returns:",
                 "Raises:", "InputShapeError"):
        assert word in doc
    assert pd.diagnose.__annotations__["return"] in ("Diagnosis", pd.Diagnosis)
    for fn in (pd.fix, pd.audit, pd.compare_inputs):
        assert "Raises:" in (fn.__doc__ or "") and "Returns:" in (fn.__doc__ or "")


def test_diagnose_proto_with_in_memory_feeds_bf16():
    model = transformer_block(hot_value=1000.0)
    model.graph.node[0].name = ""  # naming happens on a copy, never on the caller's proto
    before = model.SerializeToString()
    d = pd.diagnose(model, feeds(), target="bf16", noise=False, quiet=True)
    assert isinstance(d, pd.Diagnosis) and d.target == "bf16"
    assert d.verdict in ("pass", "fail") and [o.name for o in d.outputs] == ["probs"]
    assert [s["name"] for s in d.samples] == ["data[0]", "data[1]"]
    assert d.layerwise is not None and d.layerwise.records
    assert model.SerializeToString() == before


def test_diagnose_fails_fp16_overflow_and_names_the_node():
    d = pd.diagnose(transformer_block(hot_value=1000.0), feeds(), target="fp16", noise=False,
                    quiet=True)
    assert not d.passed and d.verdict == "fail"
    assert any("ln/pow" in f.nodes or f.node == "ln/pow" for f in d.findings)


def test_diagnose_arrays_ir_model_and_npy_path(tmp_path: Path):
    model = transformer_block(hot_value=1.0)
    arrays = [f["x"] for f in feeds(3)]
    d_arrays = pd.diagnose(ir.serde.deserialize_model(model), arrays, layerwise=False,
                           noise=False, quiet=True, max_samples=2)
    assert len(d_arrays.samples) == 2 and d_arrays.passed
    np.save(tmp_path / "a.npy", arrays[0])
    np.save(tmp_path / "b.npy", arrays[1])
    onnx.save(model, str(tmp_path / "m.onnx"))
    d_files = pd.diagnose(tmp_path / "m.onnx", str(tmp_path), layerwise=False, noise=False,
                          quiet=True)
    assert d_files.model["path"] == str(tmp_path / "m.onnx") and d_files.model["sha256"]
    assert d_files.outputs[0].metrics == d_arrays.outputs[0].metrics  # same two samples


def test_diagnose_tolerance_forms_and_task_metric():
    model = transformer_block(hot_value=1.0)
    strict = pd.diagnose(model, feeds(), tolerance=1e-9, layerwise=False, noise=False,
                         quiet=True)
    assert not strict.passed and strict.outputs[0].tolerance.rel_l2 == 1e-9
    per_output = pd.diagnose(model, feeds(), tolerance=["probs:rel_l2=0.5"], layerwise=False,
                             noise=False, quiet=True)
    assert per_output.outputs[0].tolerance.rel_l2 == 0.5
    stages: list[str] = []
    d = pd.diagnose(model, feeds(), metric="top1", layerwise=False, noise=False,
                    progress=lambda stage, done, total: stages.append(stage))
    assert d.task is not None and d.task["passed"] is True and set(d.task["per_sample"]) == {
        "data[0]", "data[1]"}
    assert pd.Diagnosis.from_dict(d.to_dict()).task == d.task
    # the metric scores the runs diagnose made; the model is not run again for it
    assert "reference" in stages and not any(s.startswith("task-") for s in stages)


def test_progress_callback_and_quiet():
    calls: list[tuple[str, int, int]] = []
    pd.diagnose(transformer_block(), feeds(), noise=False, progress=lambda *a: calls.append(a))
    stages = {c[0] for c in calls}
    assert {"reference", "candidate", "layerwise"} <= stages
    assert all(0 < done <= total for _, done, total in calls)
    silent: list[tuple] = []
    pd.diagnose(transformer_block(), feeds(), noise=False, quiet=True,
                progress=lambda *a: silent.append(a))
    assert silent == []


@pytest.mark.parametrize("data, error, text", [
    ([], InputError, "no samples"),
    (None, InputError, "data is required"),
    ([{"y": np.zeros((1, 8, 16), np.float32)}], InputNameError, "'x'"),
    ([np.zeros((1, 8), np.float32)], pd.InputShapeError, "x"),
])
def test_diagnose_bad_data_raises_clear_errors(data, error, text):
    with pytest.raises(error, match=text):
        pd.diagnose(transformer_block(), data, quiet=True)


def test_bare_array_needs_a_single_input_model():
    nodes = [helper.make_node("Add", ["a", "b"], ["y"], name="add")]
    model = make_model(nodes, [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2])
                               for n in "ab"],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    with pytest.raises(InputNameError, match="single-input"):
        pd.diagnose(model, [np.ones(2, np.float32)], quiet=True)
    with pytest.raises(InputError, match="preprocess applies to image files"):
        pd.diagnose(model, [{"a": np.ones(2), "b": np.ones(2)}], preprocess="imagenet")
    with pytest.raises(ModelLoadError, match="onnx.ModelProto"):
        pd.diagnose(42, [{"a": np.ones(2)}])
    with pytest.raises(ModelLoadError, match="not found"):
        pd.diagnose("missing.onnx", [{"a": np.ones(2)}])


def test_diagnosis_json_html_and_notebook_views(tmp_path: Path):
    d = pd.diagnose(transformer_block(hot_value=1000.0), feeds(), noise=False, quiet=True)
    assert pd.Diagnosis.from_dict(json.loads(d.to_json())) == d
    out = tmp_path / "d.json"
    d.to_json(out)
    with pytest.raises(OutputExistsError):
        d.to_json(out)
    d.to_json(out, force=True)
    page = d.to_html(tmp_path / "d.html")
    assert page.startswith("<!DOCTYPE html>") and (tmp_path / "d.html").read_text() == page
    assert "ln/pow" in page
    view = d._repr_html_()
    assert view.startswith("<iframe srcdoc=") and "<html" not in view  # escaped page


def test_fix_holds_the_model_until_saved(tmp_path: Path):
    model_path = tmp_path / "conv_bn.onnx"
    onnx.save(conv_bn(), str(model_path))
    samples = [RNG.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(2)]
    f = pd.fix(model_path, samples, target="fp16", tolerance="rel_l2=1e-2", quiet=True)
    assert isinstance(f, pd.Fix) and f.passed and isinstance(f.model, onnx.ModelProto)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conv_bn.onnx"]  # nothing written
    onnx.checker.check_model(f.model)
    written = f.save(tmp_path / "fixed.onnx")
    assert set(written) == {"model", "plan", "recipes", "report", "rewritten"}
    assert all(p.is_file() for p in written.values())
    report = json.loads(written["report"].read_text())
    assert report["verdict"] == "pass" and report["model"]["input"] == str(model_path)
    assert "trtexec" in written["recipes"].read_text()
    assert f.to_dict()["model"]["output"] == str(tmp_path / "fixed.onnx")
    with pytest.raises(OutputExistsError):
        f.save(tmp_path / "fixed.onnx")
    f.save(tmp_path / "fixed.onnx", force=True)
    with pytest.raises(InputError, match="never overwrites"):
        f.save(model_path, force=True)
    again = pd.Fix.from_dict(report, model=f.model)
    assert again.plan == f.plan and again.passed
    assert "PASS" in f._repr_html_()
    report = {**f.report, "plan": {"default": "fp16", "overrides": {
        "<b>bn</b>": {"precision": "fp32", "reason": "<i>x</i>"}}}}
    view = pd.Fix.from_dict(report)._repr_html_()
    assert "<b>bn" not in view and "&lt;b&gt;bn" in view
    page = f.to_html(tmp_path / "fix.html")
    assert "FP32" in page and (tmp_path / "fix.html").is_file()


def test_fix_metric_needs_threshold_and_target_errors():
    with pytest.raises(pd.PlanError, match="FP16 or BF16"):
        pd.fix(conv_bn(), [np.zeros((1, 3, 8, 8), np.float32)], target="tf32", quiet=True)
    with pytest.raises(InputError, match="pass mark of a task metric"):
        pd.fix(conv_bn(), [np.zeros((1, 3, 8, 8), np.float32)], threshold=0.5, quiet=True)
    with pytest.raises(InputError, match="pass mark of a task metric"):  # as diagnose does
        pd.diagnose(conv_bn(), [np.zeros((1, 3, 8, 8), np.float32)], threshold=0.5, quiet=True)


def _layer_info() -> dict:
    def t(name: str, fmt: str) -> dict:
        return {"Name": name, "Dimensions": [1, 4, 8, 8], "Format/Datatype": fmt,
                "Location": "Device"}
    return {"Layers": [
        {"Name": "conv + bn", "LayerType": "CaskConvolution",
         "Inputs": [t("x", "Row major linear FP16 format")],
         "Outputs": [t("c", "Row major linear FP16 format")], "ParameterType": "Convolution",
         "Weights": {"Type": "Half", "Count": 108}, "TacticValue": "0x1"},
    ], "Bindings": ["x", "c"]}


def test_audit_flags_an_fp32_request_not_honored(tmp_path: Path):
    a = pd.audit(_layer_info(), onnx=conv_bn(), expect_fp32=["bn"])
    assert isinstance(a, pd.Audit) and not a.passed
    assert any(f.kind == "fp32-not-honored" for f in a.findings)
    assert pd.Audit.from_dict(json.loads(a.to_json())) == a
    page = a.to_html()
    assert "conv + bn" in page and "<script" not in page
    hostile = _layer_info()
    hostile["Layers"][0]["Name"] = "<img src=x onerror=alert(1)>"
    page = pd.audit(hostile).to_html()
    assert "<img src=x" not in page and "&lt;img src=x" in page


def test_compare_inputs_names_the_channel_order():
    rgb = RNG.uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)
    c = pd.compare_inputs(rgb, rgb[:, ::-1].copy())
    assert isinstance(c, pd.InputComparison) and not c.passed
    assert c.top is not None and c.top.kind == "channel-order"
    assert pd.InputComparison.from_dict(c.to_dict()) == c
    assert "channel" in c.to_html()
    assert pd.compare_inputs(rgb, rgb.copy()).passed


def test_every_error_is_a_precision_doctor_error():
    with pytest.raises(PrecisionDoctorError):
        pd.diagnose(transformer_block(), [{"x": np.zeros((1, 8), np.float32)}])


def test_audit_reads_a_build_log_beside_the_layer_info(tmp_path: Path):
    log = tmp_path / "build.log"
    log.write_text(
        "&&&& RUNNING TensorRT.trtexec [TensorRT v101000] # trtexec --onnx=m.onnx --fp16\n"
        "[06/18/2025-03:48:34] [I] TensorRT version: 10.10.0\n"
        "[06/18/2025-03:48:34] [W] [TRT] Detected layernorm nodes in FP16.\n")
    a = pd.audit(_layer_info(), onnx=conv_bn(), log=log)
    assert a.build_log is not None and a.build_log["tensorrt_version"] == "10.10.0"
    assert "links" in a.build_log
    again = pd.Audit.from_dict(json.loads(a.to_json()))
    assert again == a and again.build_log == a.build_log
