"""BF16 end to end through the CLI on the CPU: a BF16 Conv model and a BF16 MatMul model are
written, verified by the exact emulation of the written model, and say so; ONNX Runtime CPU is
refused for BF16 with what to use instead."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from tiny_models import conv_bn, conv_pool_model, transformer_block
from typer.testing import CliRunner

from precision_doctor.cli import app
from precision_doctor.runners.kernels.registry import missing_kernels

runner = CliRunner()
CASES = {  # name -> (model, input shape, the compute op ONNX Runtime CPU has no BF16 kernel for)
    "conv": (lambda: conv_bn(var_max=50.0), "1x3x8x8", "Conv"),
    "matmul": (lambda: transformer_block(hot_value=1.0), "1x8x16", "MatMul"),
}


def _bf16_initializers(model):
    return [i.name for i in model.graph.initializer if i.data_type == TensorProto.BFLOAT16]


@pytest.mark.parametrize("case", sorted(CASES))
def test_fix_bf16_writes_a_verified_model_and_names_its_verifier(tmp_path, case):
    build, shape, op = CASES[case]
    src = tmp_path / "m.onnx"
    onnx.save(build(), str(src))
    out = tmp_path / "m_bf16.onnx"
    res = runner.invoke(app, ["fix", str(src), "-o", str(out), "--target", "bf16", "--data",
                              f"random:seed=0,low=-1,high=1,count=2,shape=x:{shape}",
                              "--html", str(tmp_path / "fix.html")],
                        terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "verified with emulate-written-bf16" in res.output
    written = onnx.load(str(out))
    onnx.checker.check_model(written, full_check=True)
    onnx.shape_inference.infer_shapes(written, strict_mode=True)
    opset = max(o.version for o in written.opset_import if o.domain in ("", "ai.onnx"))
    assert opset >= (22 if op == "Conv" else 13)  # bfloat16 Conv from 22, Cast/MatMul from 13
    casts = [n for n in written.graph.node if n.op_type == "Cast"
             and n.attribute[0].i == TensorProto.BFLOAT16]
    assert casts and _bf16_initializers(written)
    assert any(n.op_type == op for n in written.graph.node)
    gaps = missing_kernels(written)
    assert gaps is None or any(m.op.startswith(op) for m in gaps)  # CPU cannot run it itself
    report = json.loads((tmp_path / "m_bf16.report.json").read_text())
    v = report["verification"]
    assert v["runner"] == "emulate-written-bf16" and v["spec"] == "emulate-written"
    assert {s["runner"] for s in v["skipped"]} >= {"ort-cpu-fixed"}
    assert report["verdict"] == "pass"
    after = max(m["rel_l2"] for m in report["after"].values())
    emulated = max(m["rel_l2"] for m in report["after_emulated"].values())
    assert 0 < after < 8e-2 and after == pytest.approx(emulated, rel=1e-6)
    page = (tmp_path / "fix.html").read_text()
    assert "emulate-written-bf16" in page and "Verified with" in page
    recipes = (tmp_path / "m_bf16.recipes.md").read_text()
    assert "--stronglyTyped" in recipes and "--providers cuda" in recipes


def test_diagnose_bf16_refuses_ort_cpu_and_runs_the_written_model_emulated(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(conv_bn(var_max=50.0), str(src))
    data = "random:seed=0,low=-1,high=1,count=2,shape=x:1x3x8x8"
    res = runner.invoke(app, ["diagnose", str(src), "--data", data, "--target", "bf16",
                              "--runner", "ort:cpu"], terminal_width=200)
    assert res.exit_code == 2
    assert "compare FP32 with FP32" in res.output and "--runner emulate" in res.output
    out = tmp_path / "m_bf16.onnx"
    assert runner.invoke(app, ["fix", str(src), "-o", str(out), "--target", "bf16", "--data",
                               data, "-q"]).exit_code == 0
    res = runner.invoke(app, ["diagnose", str(src), "--data", data, "--target", "bf16",
                              "--runner", "ort:cpu", "--candidate-model", str(out)],
                        terminal_width=200)
    assert res.exit_code == 2 and "emulate-written" in res.output
    report = tmp_path / "d.json"
    res = runner.invoke(app, ["diagnose", str(src), "--data", data, "--target", "bf16",
                              "--runner", "emulate-written", "--candidate-model", str(out),
                              "--json", str(report)], terminal_width=200)
    assert res.exit_code == 0, res.output
    d = json.loads(report.read_text())
    rel = max(o["metrics"]["rel_l2"] for o in d["outputs"])
    assert 0 < rel < 8e-2 and np.isfinite(rel)
    res = runner.invoke(app, ["fix", str(src), "-o", str(tmp_path / "x.onnx"), "--target",
                              "bf16", "--data", data, "--runner", "ort:cpu"],
                        terminal_width=200)
    assert res.exit_code == 2 and "Leave --runner out" in res.output


def test_fix_bf16_for_onnx_runtime_cuda_keeps_its_missing_kernels_fp32(tmp_path):
    """``--engine ort-cuda`` on a machine without a GPU: the nodes ONNX Runtime CUDA 1.31 has
    no BF16 kernel for (MaxPool-22, GlobalAveragePool-22) or an inexact one (Sigmoid) are FP32
    in the plan (reason ``engine``) and in the written model, and the verification says so."""
    src = tmp_path / "m.onnx"
    onnx.save(conv_pool_model(opset=11), str(src))
    out = tmp_path / "m_bf16.onnx"
    data = "random:seed=0,low=-1,high=1,count=2,shape=x:1x3x8x8"
    res = runner.invoke(app, ["fix", str(src), "-o", str(out), "--target", "bf16", "--data",
                              data, "--engine", "ort-cuda"], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "written for ONNX Runtime CUDA: 3 nodes kept FP32" in " ".join(res.output.split())
    report = json.loads((tmp_path / "m_bf16.report.json").read_text())
    assert report["engine"] == "ort-cuda"
    overrides = report["plan"]["overrides"]
    assert {n for n, d in overrides.items() if d["reason"] == "engine"} == {
        "pool", "sigmoid", "gap"}
    assert "MaxPool-22" in overrides["pool"]["detail"]
    assert "GlobalAveragePool x1, MaxPool x1, Sigmoid x1" in report["verification"]["engine"]
    written = onnx.load(str(out))
    types = {v.name: v.type.tensor_type.elem_type for v in onnx.shape_inference.infer_shapes(
        written).graph.value_info}
    pool = next(n for n in written.graph.node if n.name == "pool")
    conv = next(n for n in written.graph.node if n.name == "conv")
    assert types[pool.input[0]] == TensorProto.FLOAT and types[pool.output[0]] == \
        TensorProto.FLOAT
    assert types[conv.output[0]] == TensorProto.BFLOAT16  # Conv-22 has a BF16 kernel there
    # the same without --engine: every node BF16 (a model for an engine with every kernel)
    res = runner.invoke(app, ["fix", str(src), "-o", str(tmp_path / "any.onnx"), "--target",
                              "bf16", "--data", data, "-q"], terminal_width=200)
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "any.report.json").read_text())
    assert report["engine"] is None and not report["plan"]["overrides"]
    res = runner.invoke(app, ["fix", str(src), "-o", str(tmp_path / "x.onnx"), "--target",
                              "bf16", "--data", data, "--engine", "tensorrt-llm"],
                        terminal_width=200)
    assert res.exit_code == 2 and "known engines are ort-cuda" in res.output
    assert not (tmp_path / "x.onnx").exists()
