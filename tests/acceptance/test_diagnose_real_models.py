"""Acceptance of ``diagnose`` on the real PP-OCRv4 models and images (needs ../shared)."""

import pytest

from precision_doctor.diagnosis.diagnose import diagnose
from precision_doctor.formats import Precision
from precision_doctor.graph import input_metadata, load_model
from precision_doctor.inputs import load_samples
from precision_doctor.layerwise.candidates import emulated
from precision_doctor.precision.plan import PrecisionPlan

pytestmark = pytest.mark.shared


def test_det_is_a_defect_of_one_batchnorm_explaining_the_error(det_fp16_at_480):
    """Assessment defect, the 9.8e7-variance BatchNorm as the only main finding
    (once), explained_share >= 0.9; the Conv near the FP16 max is a headroom warning (it did
    not overflow; it was once reported as activation-overflow)."""
    # the real images, at a smaller detection size so the test stays fast; the CLI's run, shared
    # with tests/report/test_terminal.py (tests/conftest.py)
    report = det_fp16_at_480
    assert len(report.samples) == 3
    assert report.verdict == "fail"
    assert report.assessment.kind == "defect"
    main = [f for f in report.findings if f.group == "main"]
    assert len(main) == 1
    bn = main[0]
    assert bn.kind == "parameter-out-of-range" and bn.op_type == "BatchNormalization"
    assert bn.evidence["max_abs"] > 9e7
    assert sum(f.node == bn.node for f in report.findings) == 1
    assert report.explained_share >= 0.9 and report.assessment.nodes == (bn.node,)
    conv = [f for f in report.findings if f.op_type == "Conv" and f.kind == "headroom"]
    assert conv and conv[0].evidence["headroom_bits"] < 2 and conv[0].group == "minor"
    assert not any(f.kind == "activation-overflow" for f in report.findings)
    lw = report.layerwise
    assert lw.first_divergence is not None
    assert lw.record("batch_norm_0.tmp_3").rel_l2 > 0.5  # the BatchNorm output is broken
    assert report.largest_jump == "batch_norm_0.tmp_3"  # where the error jumps
    assert "fold-batchnorm" in " ".join(report.rewritten["rewrites"])


def test_rec_decision_flips_on_the_paddleocr_crops(shared_dir):
    """The '7' of word_5 moves one CTC time step (text unchanged, margin ~0.998),
    word_401 flips a near tie (text changed); the flips carry most of the error."""
    model = load_model(shared_dir / "models/ppocrv4/rec.onnx")
    everything = load_samples(shared_dir / "data/ocr/rec_crops/paddleocr", input_metadata(model),
                              "ppocr-rec")
    wanted = {"imgs_words__en_word_5.png", "imgs_words_en__word_401.png"}
    samples = [s for s in everything if s.name in wanted] + [
        s for s in everything if s.name not in wanted][:2]
    assert len(samples) == 4
    report = diagnose(model, samples, Precision.FP16, emulated(PrecisionPlan(Precision.FP16)))
    a = report.assessment
    assert report.verdict == "fail" and a.kind == "decision-flips"
    flips = {f.sample: f for f in report.decision_flips}
    shift, tie = flips["imgs_words__en_word_5.png"], flips["imgs_words_en__word_401.png"]
    assert shift.task_changed is False and shift.fp32_margin > 0.9
    assert tie.task_changed is True and tie.fp32_margin < 0.05
    assert all(f.fp32_noise is not None and f.fp32_noise < 1e-3 for f in report.decision_flips)
    (d,) = report.decisions
    assert d.kind == "ctc" and d.flip_error_share > 0.9
    assert d.rel_l2_without_flips < report.outputs[0].metrics.rel_l2 / 3
    assert d.suggested_metric.startswith("ctc-string")
    assert sum(f.group == "main" for f in report.findings) <= 3  # no wall of 0% rows


def test_cls_is_never_a_defect(shared_dir):
    model = load_model(shared_dir / "models/ppocrv4/cls.onnx")
    samples = load_samples(shared_dir / "data/ocr/rec_crops/paddleocr", input_metadata(model),
                           "ppocr-cls")
    report = diagnose(model, samples, Precision.FP16, emulated(PrecisionPlan(Precision.FP16)))
    assert report.assessment.kind in ("within-tolerance", "rounding")
    (d,) = report.decisions
    assert d.kind == "class-probabilities" and d.suggested_metric == "top1"


def test_rec_passes_fp16_with_layernorm_hazards_measured(rec_fp16_on_six_crops):
    report = rec_fp16_on_six_crops  # six crops, no noise floor (tests/conftest.py)
    assert report.verdict == "pass", [o.reason for o in report.outputs]
    ln = [h for h in report.hazards if h.kind == "decomposed-layernorm"]
    assert len(ln) == 5
    for h in ln:
        rec = report.layerwise.record(h.tensor)
        assert rec is not None and rec.headroom_bits > 0  # measured, no overflow


def test_det_segments_give_the_records_of_one_marked_run(shared_dir):
    """15+ segments (each node once per precision) == the whole model with every
    tensor marked, tensor for tensor, on a real image."""
    from precision_doctor.layerwise.candidates import reference_factory
    from precision_doctor.layerwise.compare import compare_layerwise

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
