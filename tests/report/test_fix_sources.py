"""A fix of an ONNX model that carries the exporter's metadata names its FP32 nodes by module
and Python line: ``report["fp32_sources"]``, the terminal's ``Keep in FP32, by module``, the
code beside each plan row of the HTML (escaped)."""

from __future__ import annotations

from pathlib import Path

import onnx
from test_report_sources import _feeds, _model

import precision_doctor as pd
from precision_doctor.report.terminal.sources import fix_lines


def test_fix_names_its_fp32_nodes_by_module_and_line(tmp_path: Path) -> None:
    path = tmp_path / "net.onnx"
    onnx.save(_model(True), path)
    f = pd.fix(str(path), _feeds(), target="fp16", quiet=True)
    assert f.passed and f.report["fp32_sources"]
    assert {s["module"] for s in f.report["fp32_sources"].values()} == {"stats"}
    lines = fix_lines(f.result, None, 80)
    assert lines[0] == "Keep in FP32, by module: stats"
    assert lines[1].startswith("  stats at net.py:4: return (h * h)") and len(lines[1]) <= 80
    f.to_html(tmp_path / "fix.html")
    html = (tmp_path / "fix.html").read_text()
    assert '<code class="py">return (h * h).mean(-1) if n &lt; 4 else h</code>' in html
    assert "PyTorch recipe" not in html  # an ONNX model has none
