"""All rewrites on the real PP-OCRv4 models with real images: FP32 outputs unchanged.

Inputs are real images from ../shared/data/ocr, preprocessed as PaddleOCR does (det: ImageNet
mean/std at 640x640; rec/cls: (x/255 - 0.5)/0.5 at 48x320 / 48x192). Random inputs are not used
for det: on N(0, 1) noise its sigmoid output is ~1e-4 everywhere and the FP32 output already moves
by ~3e-3 relative between ONNX Runtime's own optimization levels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from real_inputs import real_image

from precision_doctor.precision.rewrites import apply_rewrites

pytestmark = pytest.mark.shared





def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _rewrite_and_compare(shared_dir: Path, name: str):
    model = onnx.load(str(shared_dir / "models" / "ppocrv4" / f"{name}.onnx"))
    out, report = apply_rewrites(model)
    onnx.checker.check_model(out, full_check=True)
    assert [o.name for o in out.graph.output] == [o.name for o in model.graph.output]
    assert list(out.metadata_props) == list(model.metadata_props)
    x = real_image(shared_dir, name)
    before, after = _run(model, x), _run(out, x)
    rel = float(np.linalg.norm(after.astype(np.float64) - before) / np.linalg.norm(before))
    assert rel < 1e-5, f"{name}: relative L2 {rel:.3g}"
    return out, report


def test_det_all_batchnorms_folded(shared_dir: Path) -> None:
    out, report = _rewrite_and_compare(shared_dir, "det")
    assert report.counts()["fold-batchnorm"] == {"applied": 3, "skipped": 0}
    assert report.counts()["fold-bias-add"] == {"applied": 2, "skipped": 0}
    assert "BatchNormalization" not in {n.op_type for n in out.graph.node}
    big = [r for r in report.applied("fold-batchnorm") if r.details["bn_var_over_fp16_max"]]
    assert [r.nodes[1] for r in big] == ["p2o.BatchNormalization.1"]
    assert big[0].details["bn_var_max"] > 9e7
    assert big[0].details["weight_absmax_after"] < 65504


def test_rec_layernorms_fused_at_opset17(shared_dir: Path) -> None:
    out, report = _rewrite_and_compare(shared_dir, "rec")
    assert report.counts()["fuse-layernorm"] == {"applied": 5, "skipped": 0}
    assert report.counts()["fold-batchnorm"] == {"applied": 6, "skipped": 0}
    assert (report.opset_before, report.opset_after) == (12, 17)
    ops = [n.op_type for n in out.graph.node]
    assert ops.count("LayerNormalization") == 5 and "ReduceMean" not in ops


def test_cls_batchnorms_and_bias_adds_folded(shared_dir: Path) -> None:
    _, report = _rewrite_and_compare(shared_dir, "cls")
    assert report.counts()["fold-batchnorm"] == {"applied": 35, "skipped": 0}
    assert report.counts()["fold-bias-add"]["applied"] == 18  # SE offsets folded by fold-constants
