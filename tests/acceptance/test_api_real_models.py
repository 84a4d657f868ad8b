"""Acceptance: the public API on the real PP-OCRv4 models (needs ../shared).

Kept fast: six recognition crops, two full images at a reduced detection size; the diagnosis
and the fix are the session fixtures of tests/conftest.py, shared with
test_diagnose_real_models.py and test_fix_real_models.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

import precision_doctor as pd

pytestmark = pytest.mark.shared


def test_diagnose_rec_on_crops(rec_fp16_on_six_crops):
    d = rec_fp16_on_six_crops  # pd.diagnose(rec.onnx, crops, max_samples=6, noise=False)
    assert d.verdict == "pass"  # the recognizer survives FP16 (rel. L2 ~4e-3)
    assert d.outputs[0].metrics.rel_l2 < 1e-2 and len(d.samples) == 6


def test_fix_det_and_save(det_fix_mask_iou_480, tmp_path: Path):
    f = det_fix_mask_iou_480  # pd.fix(det.onnx, 2 images at 480, mask-iou:threshold=0.3 >= 0.99)
    assert f.passed and f.report["score_after"]["value"] >= 0.99
    assert not list(tmp_path.iterdir())
    written = f.save(tmp_path / "det_fp16.onnx")
    onnx.checker.check_model(str(written["model"]))
    assert json.loads(written["report"].read_text())["verdict"] == "pass"


def test_diagnose_in_memory_bf16(shared_dir: Path):
    """A proto and a feed dict held in memory (as in a notebook)."""
    from precision_doctor.graph import input_metadata
    from precision_doctor.inputs import load_samples

    proto = onnx.load(str(shared_dir / "models/ppocrv4/cls.onnx"))
    sample = load_samples(shared_dir / "data/ocr/rec_crops/paddleocr", input_metadata(proto),
                          "ppocr-cls", max_samples=1)[0]
    name, arr = next(iter(sample.feeds.items()))
    d = pd.diagnose(proto, [{name: arr}], target="bf16", noise=False, quiet=True)
    assert d.target == "bf16" and d.samples[0]["name"] == "data[0]"
    assert d.verdict in ("pass", "fail") and d.layerwise is not None
