"""Acceptance: ``fix`` on the real PP-OCRv4 det and rec models (needs ../shared).

Kept fast: two full images at a reduced detection size, and three recognition crops. The full
benchmark (all images, all crops, RapidOCR end to end, other tools) is benchmarks/search.py and
benchmarks/ocr_end_to_end.py.
"""

import numpy as np
import onnx
import pytest

from precision_doctor.compare.tasks.image import mask_iou_per_sample
from precision_doctor.compare.tasks.registry import get_metric
from precision_doctor.compare.tolerance import default_tolerance
from precision_doctor.formats import Precision
from precision_doctor.graph import input_metadata, load_model
from precision_doctor.inputs import load_samples
from precision_doctor.repair.pipeline import fix
from precision_doctor.runners.ort import OrtRunner
from precision_doctor.search.objective import Objective

pytestmark = pytest.mark.shared


def _io_names(model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    inits = {t.name for t in model.graph.initializer}
    return ([i.name for i in model.graph.input if i.name not in inits],
            [o.name for o in model.graph.output])


def test_fix_det_meets_mask_iou_with_few_fp32_nodes(shared_dir, det_fix_mask_iou_480):
    model = load_model(shared_dir / "models/ppocrv4/det.onnx")
    samples = load_samples(shared_dir / "data/ocr/full_images", input_metadata(model),
                           "ppocr-det:resize=max-side,side=480", max_samples=2)
    # fix(model, samples, FP16, mask-iou:threshold=0.3 >= 0.99), by pd.fix (tests/conftest.py)
    result = det_fix_mask_iou_480.result
    assert result is not None and "mask-iou:threshold=0.3 >= 0.99" in result.objective

    assert result.score_before.value < 0.9  # naive FP16 breaks the detector
    assert result.passed and result.score_after.value >= 0.99
    assert result.share["nodes"] <= 0.05
    written = result.model
    onnx.checker.check_model(written, full_check=True)
    assert _io_names(written) == _io_names(model)
    # the written file itself, run by ONNX Runtime CPU, meets the IoU on every image
    out = model.graph.output[0].name
    with OrtRunner(model) as ref, OrtRunner(written) as cand:
        for s in samples:
            iou = mask_iou_per_sample(ref.run(s.feeds)[out], cand.run(s.feeds)[out], 0.3)
            assert iou[0] >= 0.99, s.name


def test_fix_rec_keeps_charset_and_most_nodes_fp16(shared_dir):
    path = shared_dir / "models/ppocrv4/rec.onnx"
    model = load_model(path)
    samples = load_samples(shared_dir / "data/ocr/rec_crops/paddleocr", input_metadata(model),
                           "ppocr-rec", max_samples=3)
    objective = Objective(metric=get_metric(f"ctc-string:charset={path}"), threshold=1.0)
    result = fix(model, samples, Precision.FP16, objective)

    assert result.passed
    assert result.share["nodes"] <= 0.05  # >= 95 % of compute nodes in FP16
    meta = {p.key: p.value for p in result.model.metadata_props}
    original = {p.key: p.value for p in model.metadata_props}
    assert meta.get("character") == original["character"]
    onnx.checker.check_model(result.model)
    assert _io_names(result.model) == _io_names(model)


def test_fix_det_gives_the_ocr_client_identical_boxes(shared_dir):
    pytest.importorskip("rapidocr_onnxruntime", reason="db-boxes needs the demo extra")
    from rapidocr_onnxruntime.ch_ppocr_det.utils import DBPostProcess

    model = load_model(shared_dir / "models/ppocrv4/det.onnx")
    # all 3 images at 640 px: FP16 moves boxes there (at 480 px all-FP16 happens to pass)
    samples = load_samples(shared_dir / "data/ocr/full_images", input_metadata(model),
                           "ppocr-det:resize=max-side,side=640")
    objective = Objective(metric=get_metric("db-boxes"), threshold=1.0)

    def ort_cpu(m):
        return OrtRunner(m, ("cpu",), name="ort-cpu")

    result = fix(model, samples, Precision.FP16, objective, runner=ort_cpu)

    assert result.score_before.value < 1.0 and result.search.kept  # the search was needed
    assert result.passed and result.share["nodes"] <= 0.05
    # the client's own post-processing on both maps gives the same boxes on every image
    post = DBPostProcess(thresh=0.3, box_thresh=0.5, max_candidates=1000, unclip_ratio=1.6,
                         score_mode="fast", use_dilation=True)
    out = model.graph.output[0].name
    with OrtRunner(model) as ref, OrtRunner(result.model) as cand:
        for s in samples:
            ref_boxes, _ = post(ref.run(s.feeds)[out], s.source_size)
            cand_boxes, _ = post(cand.run(s.feeds)[out], s.source_size)
            assert len(ref_boxes) > 3 and np.array_equal(ref_boxes, cand_boxes), s.name


def test_fix_bf16_cls_on_the_cpu_is_written_and_verified_by_its_emulation(shared_dir):
    """BF16: ONNX Runtime CPU has no BF16 Conv kernel; the written model is verified by
    emulating it exactly, and that equals the plan emulator's result on the real crops."""
    model = load_model(shared_dir / "models/ppocrv4/cls.onnx")
    samples = load_samples(shared_dir / "data/ocr/rec_crops/paddleocr", input_metadata(model),
                           "ppocr-cls", max_samples=4)
    result = fix(model, samples, Precision.BF16,
                 Objective(tolerances={"*": default_tolerance(Precision.BF16)}))
    assert result.passed
    assert result.verification["runner"] == "emulate-written-bf16"
    assert any("Conv(22)" in s["reason"] for s in result.verification["skipped"])
    out = model.graph.output[0].name
    assert result.after[out]["rel_l2"] == pytest.approx(result.after_emulated[out]["rel_l2"],
                                                        rel=1e-9)
    written = result.model
    onnx.checker.check_model(written, full_check=True)
    assert any(t.data_type == onnx.TensorProto.BFLOAT16 for n in written.graph.node
               if n.op_type == "Constant" for a in n.attribute for t in [a.t])
    assert max(o.version for o in written.opset_import if o.domain in ("", "ai.onnx")) == 22
