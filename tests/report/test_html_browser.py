"""The HTML report in a real browser (headless Chromium): it loads, its script runs without
errors under its own Content-Security-Policy, nothing injected executes, and sorting works.

Skips when Chromium is not installed (Debian: ``apt-get install chromium``).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_html import SCRIPT_NODE, tiny_failing_report

from precision_doctor.report.html import render_html

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser",
                                                 "google-chrome"))), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--virtual-time-budget=3000"]


def dump_dom(html_file: Path, profile: Path) -> str:
    """The DOM after the page's scripts ran (``--dump-dom``)."""
    proc = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--dump-dom",
                           html_file.as_uri()], capture_output=True, text=True, timeout=90,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.fixture(scope="module")
def page() -> str:
    return render_html(tiny_failing_report(), command="precision-doctor diagnose tiny.onnx")


def test_report_renders_in_chromium(page: str, tmp_path: Path) -> None:
    path = tmp_path / "report.html"
    path.write_text(page, encoding="utf-8")
    dom = dump_dom(path, tmp_path / "profile")
    assert 'data-js="ready"' in dom  # the script ran to its end: the CSP hash matches
    box = re.search(r'<div id="js-errors"[^>]*>(.*?)</div>', dom, re.DOTALL)
    assert box is not None and box.group(1).strip() == ""
    assert re.search(r"<title>FAIL: .* in FP16 - precision-doctor</title>", dom)
    assert '<div class="big">FAIL</div>' in dom
    assert dom.count("<svg") >= 2
    assert re.search(r'<article class="finding sev-(error|warning)"', dom)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom  # the node name, shown as text
    assert len(re.findall(r"<script\b", dom)) == 1  # nothing injected became an element
    assert "<img" not in dom


def test_sorting_by_clicking_a_header(page: str, tmp_path: Path) -> None:
    """Click the rel. L2 header of the full layerwise table (probe script, CSP removed)."""
    probe = """<script>
    var t = document.querySelector('#all-layers table');
    var th = Array.prototype.find.call(t.tHead.rows[0].cells,
                                       function (c) { return c.textContent === 'rel. L2'; });
    th.click();
    var keys = Array.prototype.map.call(t.tBodies[0].rows, function (r) {
      return parseFloat(r.cells[th.cellIndex].getAttribute('data-sort')); });
    document.body.setAttribute('data-sorted', JSON.stringify(keys));
    document.body.setAttribute('data-dir', th.getAttribute('aria-sort'));
    </script></body>"""
    html = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page)
    path = tmp_path / "sort.html"
    path.write_text(html.replace("</body>", probe), encoding="utf-8")
    dom = dump_dom(path, tmp_path / "profile")
    # JSON.stringify writes Infinity (NaN/Inf tensors) as null
    keys = [math.inf if k is None else k for k in
            json.loads(re.search(r'data-sorted="([^"]*)"', dom).group(1))]
    assert keys == sorted(keys, reverse=True) and len(keys) >= 3
    assert 'data-dir="descending"' in dom
    assert SCRIPT_NODE not in dom


def test_csp_blocks_any_other_script(page: str, tmp_path: Path) -> None:
    """Defense in depth: even a script that escaped escaping would not run."""
    path = tmp_path / "injected.html"
    path.write_text(page.replace("<main>", "<main><script>document.body.setAttribute("
                                 "'data-pwned', '1')</script>"), encoding="utf-8")
    dom = dump_dom(path, tmp_path / "profile")
    assert 'data-js="ready"' in dom and 'data-pwned="1"' not in dom


@pytest.mark.shared
@pytest.mark.slow
def test_real_recognizer_report_in_chromium(shared_dir: Path, tmp_path: Path) -> None:
    """PP-OCRv4 rec on one real text crop: a passing report with plots, in the browser."""
    from precision_doctor.diagnosis.diagnose import diagnose
    from precision_doctor.formats import Precision
    from precision_doctor.graph.load import input_metadata, load_model
    from precision_doctor.inputs import load_samples
    from precision_doctor.layerwise.candidates import emulated
    from precision_doctor.precision.plan import PrecisionPlan

    model_path = shared_dir / "models/ppocrv4/rec.onnx"
    model = load_model(model_path)
    samples = load_samples(shared_dir / "data/ocr/rec_crops/paddleocr", input_metadata(model),
                           "ppocr-rec", 1)
    report = diagnose(model, samples, Precision.FP16, emulated(PrecisionPlan(Precision.FP16)),
                      noise=False, model_path=str(model_path))
    path = tmp_path / "rec.html"
    path.write_text(render_html(report, command="precision-doctor diagnose rec.onnx ..."),
                    encoding="utf-8")
    dom = dump_dom(path, tmp_path / "profile")
    assert 'data-js="ready"' in dom and '<div class="big">PASS</div>' in dom
    assert "<title>PASS: rec.onnx in FP16 - precision-doctor</title>" in dom
    assert dom.count("<svg") == 2 and f"All {len(report.layerwise.records)} tensors" in dom
