import json

import numpy as np
import onnx
from tiny_models import conv_bn, transformer_block
from typer.testing import CliRunner

from precision_doctor.cli import app

runner = CliRunner()


def _save(tmp_path, model, name="m.onnx"):
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def test_exit_codes_fail_pass_and_json(tmp_path):
    bad = _save(tmp_path, transformer_block(hot_value=1000.0), "hot.onnx")
    out = tmp_path / "r.json"
    res = runner.invoke(app, ["diagnose", str(bad), "--data",
                              "random:seed=0,low=-1,high=1,count=2,shape=x:1x8x16",
                              "--json", str(out)])
    assert res.exit_code == 1, res.output
    assert "FAIL" in res.output and "activation-ove" in res.output  # rich may wrap the cell
    data = json.loads(out.read_text())
    assert data["verdict"] == "fail" and data["findings"][0]["node"] == "ln/pow"
    good = _save(tmp_path, transformer_block(hot_value=1.0), "ok.onnx")
    res = runner.invoke(app, ["diagnose", str(good), "--data",
                              "random:seed=0,low=-1,high=1,count=2,shape=x:1x8x16", "-q"])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("PASS")


def test_refuses_to_overwrite_and_keep_option(tmp_path):
    model = _save(tmp_path, conv_bn())
    npy = tmp_path / "x.npy"
    np.save(npy, np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32))
    out = tmp_path / "r.json"
    out.write_text("keep me")
    res = runner.invoke(app, ["diagnose", str(model), "--data", str(npy), "--json", str(out)])
    assert res.exit_code == 2 and "--force" in res.output
    assert out.read_text() == "keep me"
    res = runner.invoke(app, ["diagnose", str(model), "--data", str(npy), "--keep", "bn",
                              "--json", str(out), "--force"])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["emulation"]["fp32_nodes"] == ["bn"]


def test_user_errors_exit_2_without_traceback(tmp_path):
    corrupt = tmp_path / "bad.onnx"
    corrupt.write_bytes(b"\x08\x07garbage-not-a-model")
    res = runner.invoke(app, ["diagnose", str(corrupt), "--data", "random:count=1"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    model = _save(tmp_path, conv_bn())
    npy = tmp_path / "wrong.npy"
    np.save(npy, np.zeros((1, 4, 8, 8), np.float32))
    res = runner.invoke(app, ["diagnose", str(model), "--data", str(npy)])
    assert res.exit_code == 2 and "x" in res.output
    res = runner.invoke(app, ["diagnose", str(model), "--data", "random:count=1",
                              "--keep", "no_such_node"])
    assert res.exit_code == 2 and "no_such_node" in res.output
    res = runner.invoke(app, ["diagnose", str(model), "--data", "random:count=1",
                              "--target", "fp4"])
    assert res.exit_code == 2 and "fp4" in res.output and "int8" in res.output
