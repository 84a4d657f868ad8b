"""Issue 2 acceptance on the real PP-OCRv4 models and images (needs ../shared)."""

import pytest

from precision_doctor.analysis.candidates import emulated
from precision_doctor.analysis.diagnose import diagnose
from precision_doctor.formats import Precision
from precision_doctor.graph import input_metadata, load_model
from precision_doctor.inputs import load_samples
from precision_doctor.precision.plan import PrecisionPlan

pytestmark = pytest.mark.shared


def test_det_fails_fp16_naming_batchnorm_and_conv_headroom(shared_dir):
    model = load_model(shared_dir / "models/ppocrv4/det.onnx")
    # the real images, at a smaller detection size so the test stays fast
    samples = load_samples(shared_dir / "data/ocr/full_images", input_metadata(model),
                           "ppocr-det:resize=max-side,side=480")
    report = diagnose(model, samples, Precision.FP16, emulated(PrecisionPlan(Precision.FP16)),
                      measure_impact=False, noise=False)
    assert report.verdict == "fail"
    by_kind = {}
    for f in report.findings:
        by_kind.setdefault(f.kind, []).append(f)
    bn = by_kind["parameter-out-of-range"][0]
    assert bn.op_type == "BatchNormalization" and bn.evidence["max_abs"] > 9e7
    conv = [f for f in by_kind["activation-overflow"] if f.op_type == "Conv"]
    assert conv and conv[0].evidence["headroom_bits"] < 2
    lw = report.layerwise
    assert lw.first_divergence is not None
    assert lw.record("batch_norm_0.tmp_3").rel_l2 > 0.5  # the BatchNorm output is broken


def test_rec_passes_fp16_with_layernorm_hazards_measured(shared_dir):
    model = load_model(shared_dir / "models/ppocrv4/rec.onnx")
    samples = load_samples(shared_dir / "data/ocr/rec_crops/paddleocr", input_metadata(model),
                           "ppocr-rec", max_samples=6)
    report = diagnose(model, samples, Precision.FP16, emulated(PrecisionPlan(Precision.FP16)),
                      noise=False)
    assert report.verdict == "pass", [o.reason for o in report.outputs]
    ln = [h for h in report.hazards if h.kind == "decomposed-layernorm"]
    assert len(ln) == 5
    for h in ln:
        rec = report.layerwise.record(h.tensor)
        assert rec is not None and rec.headroom_bits > 0  # measured, no overflow


def test_det_segments_give_the_records_of_one_marked_run(shared_dir):
    """Issue 11: 15+ segments (each node once per precision) == the whole model with every
    tensor marked, tensor for tensor, on a real image."""
    from precision_doctor.analysis.candidates import reference_factory
    from precision_doctor.analysis.layerwise import compare_layerwise

    model = load_model(shared_dir / "models/ppocrv4/det.onnx")
    samples = load_samples(shared_dir / "data/ocr/full_images", input_metadata(model),
                           "ppocr-det:resize=fixed,size=320x320", max_samples=1)
    feeds = [s.feeds for s in samples]
    factory = emulated(PrecisionPlan(Precision.FP16)).factory
    marked = compare_layerwise(model, feeds, reference_factory, factory, Precision.FP16, 1e-2,
                               4 << 30, segments=False)
    segments = compare_layerwise(model, feeds, reference_factory, factory, Precision.FP16, 1e-2,
                                 8 << 20)
    assert marked.chunks == 1 and segments.mode == "segments" and segments.chunks >= 15
    assert segments.records == marked.records
    assert segments.first_divergence == marked.first_divergence
