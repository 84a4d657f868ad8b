"""``precision-doctor demo``: the real PP-OCRv4 detector (``demo`` extra) on bundled photos."""

import importlib.util
import io
import json
import re
import sys

import pytest
from rich.console import Console

from precision_doctor.errors import BackendUnavailable, OutputExistsError
from precision_doctor.workflows import demo
from precision_doctor.workflows.demo import INSTALL_HINT, run_demo

_MISSING = [m for m in ("rapidocr_onnxruntime", "skimage") if importlib.util.find_spec(m) is None]
if "rapidocr_onnxruntime" in _MISSING and importlib.util.find_spec("rapidocr") is not None:
    _MISSING.remove("rapidocr_onnxruntime")  # its successor ships the same model file
needs_extra = pytest.mark.skipif(
    bool(_MISSING), reason=f"the demo extra is not installed ({', '.join(_MISSING)} missing): "
                           f"{INSTALL_HINT}")


def _console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=120, force_terminal=False), buffer


@pytest.mark.slow
@needs_extra
def test_quick_demo_diagnoses_fail_and_fixes_pass(tmp_path):
    console, buffer = _console()
    assert run_demo(tmp_path, console, quick=True) == 0
    out = buffer.getvalue()
    paths = demo.demo_paths(tmp_path)
    for path in paths.values():
        assert path.is_file(), path
    diagnosis = json.loads(paths["diagnosis_json"].read_text())
    assert diagnosis["verdict"] == "fail" and diagnosis["findings"]
    assert len(diagnosis["samples"]) == len(demo.DEMO_IMAGES)
    fixed = json.loads(paths["model report"].read_text())
    assert fixed["verdict"] == "pass" and fixed["score_after"]["passed"] is True
    assert "<html" in paths["diagnosis_html"].read_text().lower()
    assert "root cause:" in out and "open " in out and "diagnosis.html" in out
    # fix.html: headlined by the objective the demo set (mask IoU >= 0.99), before/after, and
    # the BatchNorm the fix folded listed as removed, never as the fixed model's main cause
    assert "PASS FP16 fix against the objective: mask-iou:threshold=0.3 >= 0.99" in out
    page = paths["fix_html"].read_text()
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", re.sub(
        r"<style.*?</style>|<script.*?</script>|<svg.*?</svg>", "", page, flags=re.S)))
    assert "<title>PASS: ch_PP-OCRv4_det_infer.onnx" in page
    head = text.split("Fixed model against the default tolerance")[0]
    assert "PASS ch_PP-OCRv4_det_infer.onnx fixed for FP16" in head
    assert "judged against the objective you set: mask-iou:threshold=0.3 &gt;= 0.99" in head
    assert "original model, naive FP16 (emulated)" in head
    assert "fixed model (its exact emulation on ONNX Runtime CPU)" in head
    assert re.search(r"BatchNormalization p2o\.BatchNormalization\.1 : removed by the "
                     r"fold-batchnorm rewrite", head)
    assert "Main cause" not in text
    # A second run refuses to touch the first run's files before doing any work.
    before = paths["model"].stat().st_mtime_ns
    with pytest.raises(OutputExistsError, match="--force"):
        run_demo(tmp_path, _console()[0], quick=True)
    assert paths["model"].stat().st_mtime_ns == before


@pytest.mark.parametrize("modules", [("rapidocr_onnxruntime", "rapidocr"), ("skimage",)])
def test_missing_extra_names_the_install_command(monkeypatch, tmp_path, modules):
    for module in modules:  # find_spec -> None, import -> ImportError
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(BackendUnavailable) as info:
        run_demo(tmp_path, _console()[0], quick=True)
    assert INSTALL_HINT in str(info.value)
    assert not any(tmp_path.iterdir())  # nothing written


def test_demo_paths_cover_every_output(tmp_path):
    paths = demo.demo_paths(tmp_path)
    names = {p.relative_to(tmp_path).as_posix() for p in paths.values()}
    assert {"inputs/text.png", "inputs/page.png", "diagnosis.json", "diagnosis.html",
            "det_fp16.onnx", "det_fp16.plan.json", "fix.html"} <= names
