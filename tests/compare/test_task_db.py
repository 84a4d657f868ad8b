"""DB text-box agreement (``db-boxes``): the OCR client's own post-processing, compared exactly."""

import importlib.util
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from precision_doctor.compare.tasks.db import boxes_to_source, db_boxes, db_boxes_from_map
from precision_doctor.compare.tasks.registry import get_metric
from precision_doctor.errors import MetricError
from precision_doctor.search.objective import Objective

needs_client = pytest.mark.skipif(
    importlib.util.find_spec("rapidocr_onnxruntime") is None,
    reason="db-boxes runs RapidOCR's DBPostProcess: pip install '.[demo]'")


def _map(*rects: tuple[int, int, int, int], shape=(64, 128), value=0.9) -> np.ndarray:
    out = np.full((1, 1, *shape), 0.01, np.float32)
    for top, bottom, left, right in rects:
        out[0, 0, top:bottom, left:right] = value
    return out


def _client_boxes(prob: np.ndarray, source_size: tuple[int, int]) -> np.ndarray:
    """What RapidOCR 1.4.4 itself returns for this map (DBPostProcess, then its box filter)."""
    from rapidocr_onnxruntime.ch_ppocr_det.text_detect import TextDetector
    from rapidocr_onnxruntime.ch_ppocr_det.utils import DBPostProcess

    post = DBPostProcess(thresh=0.3, box_thresh=0.5, max_candidates=1000, unclip_ratio=1.6,
                         score_mode="fast", use_dilation=True)
    boxes, _ = post(prob, source_size)
    detector = TextDetector.__new__(TextDetector)
    return np.asarray(detector.filter_tag_det_res(boxes, source_size), np.int32).reshape(-1, 4, 2)


def _client_share(a: np.ndarray, b: np.ndarray) -> float:
    ref = {tuple(x.ravel()) for x in a}
    cand = {tuple(x.ravel()) for x in b}
    total = max(len(a), len(b))
    return 1.0 if total == 0 else len(ref & cand) / total


@needs_client
def test_identical_maps_score_one_and_so_do_two_maps_without_text():
    ref = _map((20, 40, 30, 90))
    assert db_boxes({"m": ref}, {"m": ref.copy()}) == 1.0
    empty = _map()
    assert db_boxes({"m": empty}, {"m": empty.copy()}) == 1.0
    assert len(db_boxes_from_map(ref)) == 1 and len(db_boxes_from_map(empty)) == 0


@needs_client
def test_one_flipped_corner_pixel_moves_the_box_although_mask_iou_is_near_one():
    ref = _map((20, 40, 30, 90))
    cand = ref.copy()
    cand[0, 0, 19, 89] = 0.9  # one pixel past the corner: 1 of ~1200 mask pixels
    assert get_metric("mask-iou:threshold=0.3")({"m": ref}, {"m": cand}) > 0.999
    assert db_boxes({"m": ref}, {"m": cand}) == 0.0  # the only box moved (as floats)
    assert db_boxes({"m": ref}, {"m": cand}, tolerance_px=2.0) == 1.0
    for source in [(64, 128), (16, 32), (640, 1280)]:  # the client's rounding decides
        expected = _client_share(_client_boxes(ref, source), _client_boxes(cand, source))
        assert db_boxes({"m": ref}, {"m": cand}, source_size=source) == expected


@needs_client
def test_missing_and_extra_boxes_both_count():
    two = _map((5, 20, 10, 60), (35, 55, 10, 110))
    one = _map((5, 20, 10, 60))
    assert db_boxes({"m": two}, {"m": one}) == 0.5
    assert db_boxes({"m": one}, {"m": two}) == 0.5
    nan = two.copy()
    nan[0, 0, 35:55, 10:110] = np.nan  # a NaN region reads as no text, not a crash
    assert db_boxes({"m": two}, {"m": nan}) == 0.5


@needs_client
def test_real_detector_boxes_equal_rapidocr_own_output(tmp_path):
    import onnxruntime as ort

    skimage_data = pytest.importorskip("skimage.data")
    from precision_doctor.graph.load import input_metadata, load_model
    from precision_doctor.inputs import load_samples
    from precision_doctor.workflows.demo import find_demo_model

    model_path = find_demo_model()
    Image.fromarray(np.asarray(skimage_data.text())).convert("RGB").save(tmp_path / "text.png")
    (sample,) = load_samples(tmp_path, input_metadata(load_model(model_path)), "ppocr-det")
    assert sample.source_size == (172, 448)
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    prob = session.run(None, sample.feeds)[0]
    # an engine's rounding of the map: FP16 output, and a 2% logit-scale change
    logit = np.log(prob / (1 - prob + 1e-12) + 1e-12)
    variants = [prob.astype(np.float16).astype(np.float32),
                (1 / (1 + np.exp(-1.02 * logit))).astype(np.float32)]
    ref_client = _client_boxes(prob, sample.source_size)
    ours = boxes_to_source(db_boxes_from_map(prob), prob.shape[-2:], sample.source_size)
    assert len(ref_client) >= 3 and np.array_equal(ours, ref_client)
    objective = Objective(metric=get_metric("db-boxes"), threshold=1.0).with_samples([sample])
    for cand in variants:
        expected = _client_share(ref_client, _client_boxes(cand, sample.source_size))
        score = objective.score({"m": [prob]}, {"m": [cand]})
        assert score.value == expected
        assert score.passed == (expected == 1.0)


def test_source_size_is_context_not_an_option(tmp_path):
    with pytest.raises(MetricError, match="no option 'source_size'"):
        get_metric("db-boxes:source_size=3")
    user = tmp_path / "metric.py"
    user.write_text("def seen(reference, candidate, *, source_size=None):\n"
                    "    return 0.0 if source_size is None else float(source_size[0])\n"
                    "def blind(reference, candidate):\n"
                    "    return 1.0\n")
    samples = [SimpleNamespace(source_size=(7, 9)), SimpleNamespace(source_size=None)]
    outputs = {"y": [np.zeros(2), np.zeros(2)]}
    seen = Objective(metric=get_metric(f"{user}:seen"), threshold=0.0).with_samples(samples)
    assert seen.score(outputs, outputs).detail["per_sample"] == [7.0, 0.0]
    blind = Objective(metric=get_metric(f"{user}:blind"), threshold=0.0).with_samples(samples)
    assert blind.score(outputs, outputs).detail["per_sample"] == [1.0, 1.0]


def test_worst_samples_rank_failing_samples_first():
    objective = Objective(metric=get_metric("top1"), threshold=1.0, exclude=frozenset({0}))
    score = SimpleNamespace(detail={"per_sample": [0.1, 1.0, 0.5, 0.9]})
    assert objective.worst_samples(score, 2, 4) == [2, 3]  # sample 0 is a near-tie
    assert Objective().worst_samples(score, 2, 4) == [0, 1]  # tolerance: first samples
