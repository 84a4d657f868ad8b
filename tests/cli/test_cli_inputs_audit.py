import json

import numpy as np
from typer.testing import CliRunner

from precision_doctor.cli import app

runner = CliRunner()


def test_inputs_names_channel_swap(tmp_path):
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:48, 0:64]
    img = np.stack([xx / 64, yy / 48, (xx + yy) / 112], 0)[None].astype(np.float32)
    img += rng.normal(0, 0.01, img.shape).astype(np.float32)
    np.save(tmp_path / "a.npy", img)
    np.save(tmp_path / "b.npy", img[:, ::-1].copy())
    out = tmp_path / "f.json"
    res = runner.invoke(app, ["inputs", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"),
                              "--json", str(out)])
    assert res.exit_code == 1, res.output
    data = json.loads(out.read_text())
    assert data["findings"][0]["kind"] == "channel-order"


def test_audit_command_on_a_built_layer_file(tmp_path):
    layers = {"Layers": [
        {"Name": "conv1", "LayerType": "CaskConvolution",
         "Inputs": [{"Name": "x", "Format/Datatype": "Row major linear FP32"}],
         "Outputs": [{"Name": "y", "Format/Datatype": "Row major linear FP32"}],
         "TacticName": "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc"},
        {"Name": "ln", "LayerType": "Normalization",
         "Inputs": [{"Name": "y", "Format/Datatype": "Half"}],
         "Outputs": [{"Name": "z", "Format/Datatype": "Half"}]}],
        "Bindings": ["x", "z"]}
    path = tmp_path / "layers.json"
    path.write_text(json.dumps(layers))
    out = tmp_path / "audit.json"
    res = runner.invoke(app, ["audit", str(path), "--expect-fp32", "ln", "--json", str(out)])
    assert res.exit_code == 1, res.output  # the FP32 request for ln was not honored
    kinds = {f["kind"] for f in json.loads(out.read_text())["audit"]["findings"]}
    assert {"fp32-not-honored", "tf32-tactic"} <= kinds


def test_inputs_at_80_columns(tmp_path, monkeypatch):
    from rich.console import Console

    from precision_doctor import cli

    rng = np.random.default_rng(0)
    img = rng.normal(0, 1, (1, 3, 24, 32)).astype(np.float32)
    np.save(tmp_path / "a.npy", img)
    np.save(tmp_path / "b.npy", img[:, ::-1].copy())
    out = tmp_path / "f.json"
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(cli, "console", Console())
    res = runner.invoke(app, ["inputs", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"),
                              "--json", str(out)], env={"COLUMNS": "80"})
    assert res.exit_code == 1, res.output
    assert "…" not in res.output
    assert all(len(line.rstrip()) <= 80 for line in res.output.splitlines())
    assert "#1  channel-order" in res.output  # the narrow layout: one block per finding
