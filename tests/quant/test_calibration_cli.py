"""``--calibration-data`` on the command line, and the share of MACs in INT8 in the fix report
and its terminal output."""

from __future__ import annotations

import json

import numpy as np
import onnx
import quant_models
from typer.testing import CliRunner

from precision_doctor.cli import app


def _feeds(scale: float, n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": (rng.uniform(-1, 1, (1, 64, 32)) * scale).astype(np.float32)}
            for _ in range(n)]


def test_cli_calibration_data_and_the_share_of_macs_in_int8(tmp_path):
    model, _ = quant_models.deep_chain(layers=8)
    src = tmp_path / "m.onnx"
    onnx.save(model, str(src))
    for name, feeds in (("cal", _feeds(1.0, 2, 3)), ("ev", _feeds(1.0, 3, 4))):
        (tmp_path / name).mkdir()
        for i, f in enumerate(feeds):
            np.savez(tmp_path / name / f"{i}.npz", **f)
    out = tmp_path / "m_q.onnx"
    res = CliRunner().invoke(app, ["fix", str(src), "-o", str(out), "--target", "int8",
                                   "--data", str(tmp_path / "ev"), "--calibration-data",
                                   str(tmp_path / "cal"), "--tolerance", "rel_l2=0.02",
                                   "--holdout", "0"], terminal_width=200)
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "m_q.report.json").read_text())
    cal, share = report["calibration"], report["quantized_share"]
    assert cal["samples"] == 2 and cal["source"] == str(tmp_path / "cal") and cal["disjoint"]
    assert report["evaluation"]["samples"] == 3
    left = len(report["unquantized"])
    assert 0 < left < 8 and share["mac_layers"] == 8  # eight equal MatMuls
    assert share["quantized_layers"] == 8 - left and share["macs"] == (8 - left) / 8
    text = " ".join(res.output.split())
    assert "calibrated on 2 samples (" in text and "), evaluated on 3: disjoint" in text
    assert f"{(8 - left) / 8:.0%} of the MACs" in text
