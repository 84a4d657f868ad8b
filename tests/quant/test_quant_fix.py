"""``fix --target int8|fp8``: the fewest layers left in FP16, the rewrites that remove the need
for some, a Q/DQ model that ONNX Runtime loads, verified by its exact emulation."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import quant_models
from typer.testing import CliRunner

from precision_doctor.cli import app
from precision_doctor.compare.tolerance import Tolerance
from precision_doctor.quant.fix import fix_quantized
from precision_doctor.quant.qformats import QUANT_FORMATS
from precision_doctor.search.objective import Objective

INT8 = QUANT_FORMATS["int8"]


def _objective(tol):
    return Objective(tolerances={"*": Tolerance(tol)})


def _run(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_smoothquant_removes_the_outlier_channel_and_every_layer_stays_quantized():
    model, samples = quant_models.outlier_gemm()
    result = fix_quantized(model, samples, INT8, _objective(0.1))
    assert result.score_before > 1 and result.passed
    assert result.unquantized == () and result.smoothquant is not None
    assert result.smoothquant["units"] == ["proj"] and 0 < result.smoothquant["alpha"] < 1
    ops = [n.op_type for n in result.model.graph.node]
    assert ops.count("QuantizeLinear") == 1 and ops.count("DequantizeLinear") == 2
    assert "Mul" in ops  # the activation divided by s before its Q/DQ
    # the written model: FP16 between, FP32 inputs and outputs; ONNX Runtime runs it
    assert result.model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    y = _run(result.model, samples[0].feeds)
    ref = _run(model, samples[0].feeds)
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 0.1


def test_without_rewrites_a_broken_layer_is_left_in_fp16():
    model, samples = quant_models.flat_softmax()
    result = fix_quantized(model, samples, INT8, _objective(0.1), rewrites=False)
    assert result.passed and result.unquantized == ("pv",)
    assert not any(n.op_type == "QuantizeLinear" for n in result.model.graph.node)
    assert result.calibrators == {"max": result.score_before}  # nothing else tried


def test_smoothquant_moves_the_peaks_into_the_weight_rows_and_saves_the_flat_rows():
    model, samples = quant_models.flat_softmax()  # V is a weight here: SmoothQuant applies
    result = fix_quantized(model, samples, INT8, _objective(0.1))
    assert result.passed and result.unquantized == ()
    assert result.smoothquant is not None and result.smoothquant["units"] == ["pv"]


def test_the_search_leaves_few_layers_of_a_deep_chain_unquantized():
    model, samples = quant_models.deep_chain()
    result = fix_quantized(model, samples, INT8, _objective(0.02))
    assert not result.to_dict()["score_before"] <= 1  # every layer quantized fails
    assert result.passed and 0 < len(result.unquantized) < 8
    assert result.evaluations > 0 and result.verified_by.startswith("emulate-written")
    data = result.to_dict()
    assert set(data["calibrators"]) == {"max", "percentile", "entropy", "mse"}
    assert json.loads(json.dumps(data)) == data


@pytest.mark.parametrize("target", ["int8", "fp8"])
def test_cli_writes_the_qdq_model_its_report_and_recipes(tmp_path, target):
    model, samples = quant_models.outlier_gemm(samples=2)
    src = tmp_path / "m.onnx"
    onnx.save(model, str(src))
    (tmp_path / "data").mkdir()
    for s in samples:
        np.savez(tmp_path / "data" / f"{s.name}.npz", x=s.feeds["x"])
    out = tmp_path / "new" / "m_q.onnx"
    res = CliRunner().invoke(app, ["fix", str(src), "-o", str(out), "--target", target,
                                   "--data", str(tmp_path / "data")], terminal_width=100)
    assert res.exit_code == 0, res.output
    assert f"PASS {target.upper()} fix" in res.output
    report = json.loads((tmp_path / "new" / "m_q.report.json").read_text())
    assert report["target"] == target and report["passed"]
    assert "--stronglyTyped" in (tmp_path / "new" / "m_q.recipes.md").read_text()
    onnx.checker.check_model(onnx.load(str(out)))
    diag = CliRunner().invoke(app, ["diagnose", str(src), "--target", target, "--data",
                                    str(tmp_path / "data"), "--json",
                                    str(tmp_path / "d.json")], terminal_width=100)
    causes = json.loads((tmp_path / "d.json").read_text())["causes"]
    if target == "int8":  # one scale for a 100x channel: INT8 fails, named by its cure
        assert diag.exit_code == 1, diag.output
        assert "outlier-channels: proj" in diag.output
        assert causes[0]["kind"] == "outlier-channels"
    else:  # E4M3 keeps 3 mantissa bits at every magnitude: the outlier does not matter
        assert diag.exit_code == 0, diag.output
        assert "survives FP8" in diag.output and causes == []


def test_fp16_between_that_fails_by_itself_is_named_and_fixed_with_fp32_nodes(tmp_path):
    import precision_doctor as pd

    model, samples = quant_models.fp16_overflow()
    (tmp_path / "data").mkdir()
    for s in samples:
        np.savez(tmp_path / "data" / f"{s.name}.npz", x=s.feeds["x"])
    src = tmp_path / "m.onnx"
    onnx.save(model, str(src))
    diagnosis = pd.diagnose_quantized(src, str(tmp_path / "data"), target="int8", quiet=True)
    first = diagnosis.result.causes[0]
    assert not diagnosis.passed and first.kind == "float-between" and first.units == ()
    assert first.cure == "fp32-between" and first.removed > 0.9
    fixed = pd.fix_quantized(src, str(tmp_path / "data"), target="int8", quiet=True)
    assert fixed.passed and fixed.result.unquantized == ()  # the MatMul stays INT8
    assert set(fixed.result.float_fp32) >= {"scale_up"}  # found by the FP16 search
    assert fixed.report["between"].startswith("fp16 + ")
    y = _run(fixed.model, samples[0].feeds)
    assert np.isfinite(y).all()
