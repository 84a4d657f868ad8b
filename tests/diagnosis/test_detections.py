"""A detection head is read as boxes, never as argmax decisions (diagnosis/detections.py)."""

import numpy as np
import pytest
from tiny_models import yolo_head

import precision_doctor as pd
from precision_doctor.diagnosis.detections import class_names, find_head

pytest.importorskip("cv2")


def test_raw_yolo_head_is_read_as_boxes_with_its_names():
    model = yolo_head()
    assert class_names(model) == {0: "a", 1: "b"}
    x = np.random.default_rng(0).uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)
    d = pd.diagnose(model, [x, x * 0.5], layerwise=False, noise=False, quiet=True)
    [summary] = d.decisions
    assert summary.kind == "detection-yolov8" and summary.suggested_metric == "box-map:head=yolov8"
    assert not any(s.kind.startswith("class") for s in d.decisions)
    assert summary.positions > 0 and summary.task_metric == "box-match"


def test_plain_tensor_is_not_a_head():
    model = yolo_head()
    assert find_head(model, {"y": np.zeros((1, 3, 4), np.float32)}) is None


def test_heads_with_nms_are_found_by_names_or_structure():
    from onnx import helper

    empty = helper.make_model(helper.make_graph([], "g", [], []))
    efficient = {"num_dets": np.array([[1]], np.int32),
                 "det_boxes": np.zeros((1, 100, 4), np.float32),
                 "det_scores": np.zeros((1, 100), np.float32),
                 "det_classes": np.zeros((1, 100), np.int32)}
    spec = find_head(empty, efficient)
    assert spec is not None and (spec.kind, spec.count) == ("nms", "num_dets")
    paddle = {"rows": np.zeros((3, 6), np.float32), "count": np.array([3], np.int32)}
    assert find_head(empty, paddle).kind == "paddle"
    assert find_head(empty, {"y": np.zeros((1, 12, 6), np.float32)}) is None  # could be anything


def test_changed_boxes_read_as_near_tie_or_damage():
    from precision_doctor.diagnosis.detections import read_detections

    model = yolo_head()
    ref = np.zeros((1, 6, 64), np.float32)
    ref[0, :4] = [[8], [8], [4], [4]]
    ref[0, :4, 0], ref[0, 4, 0] = [3, 3, 4, 4], 0.253  # 0.003 above 0.25: a near-tie
    ref[0, :4, 1], ref[0, 5, 1] = [12, 12, 4, 4], 0.9
    cand = ref.copy()
    cand[0, 4, 0] = 0.247  # vanishes within sqrt(u) x score (FP16: 5.6e-3)
    cand[0, 5, 1] = 0.1  # vanishes by 0.65: damage
    summaries, flips, covered = read_detections(model, {"y": [ref]}, {"y": [cand]}, ["s"],
                                                resolution=2 ** -5.5)
    assert covered == {"y"} and summaries[0].near_ties == 1 and summaries[0].damage == 1
    assert sorted(f.reading for f in flips) == ["damage", "near-tie"]
