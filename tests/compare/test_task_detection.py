"""Box IoU, greedy matching, VOC all-point AP and the two detection metrics."""

import json

import numpy as np
import pytest

from precision_doctor.compare.tasks.detection import (
    DetectionMatch,
    average_precision,
    box_iou,
    box_map,
    box_match,
    box_match_details,
)
from precision_doctor.errors import MetricError

A, B = [0, 0, 10, 10], [20, 20, 30, 30]


def dets(boxes, scores, labels=None):
    out = {"boxes": np.array(boxes, np.float32).reshape(-1, 4),
           "scores": np.array(scores, np.float32)}
    if labels is not None:
        out["labels"] = np.array(labels, np.int64)
    return out


def test_box_iou_hand_computed():
    iou = box_iou(np.array([[0, 0, 2, 2]]), np.array([[1, 1, 3, 3], [5, 5, 6, 6], [0, 0, 2, 2]]))
    assert np.allclose(iou, [[1 / 7, 0.0, 1.0]])
    assert box_iou(np.zeros((0, 4)), np.array([A])).shape == (0, 1)


def test_match_f1_and_ap_hand_computed():
    ref = dets([A, B], [0.9, 0.9])
    cand = dets([[0, 0, 10, 9], [21, 21, 31, 31], [50, 50, 60, 60]], [0.9, 0.8, 0.7])
    opts = {"boxes": "boxes", "scores": "scores"}
    # IoUs 0.9 and 81/119; one false alarm -> F1 = 2*2/(2+3); AP: TP,TP,FP -> 1.0
    assert box_match(ref, cand, **opts) == pytest.approx(0.8)
    assert box_map(ref, cand, **opts) == pytest.approx(1.0)
    (d,) = box_match_details(ref, cand, **opts)
    assert [(m[0], m[1]) for m in d.matches] == [(0, 0), (1, 1)]
    assert d.matches[1][2] == pytest.approx(81 / 119)
    assert d.unmatched_candidate == (2,) and d.unmatched_reference == ()
    # the false alarm ranked first: precision 0, 1/2, 2/3 -> envelope 2/3 -> AP = 2/3
    cand["scores"] = np.array([0.9, 0.8, 0.95], np.float32)
    assert box_map(ref, cand, **opts) == pytest.approx(2 / 3)


def test_average_precision_voc_all_point():
    # recall 1/3,1/3,2/3,2/3; precision 1,1/2,2/3,1/2 -> 1/3*1 + 1/3*2/3
    assert average_precision(np.array([0.9, 0.8, 0.7, 0.6]),
                             np.array([1, 0, 1, 0], bool), 3) == pytest.approx(5 / 9)
    assert average_precision(np.array([]), np.array([], bool), 2) == 0.0


def test_greedy_by_score_labels_and_iou_threshold():
    ref = dets([A], [1.0])
    cand = dets([[0, 0, 10, 6], [0, 0, 10, 9.5]], [0.9, 0.8])  # IoU 0.6 (higher score), 0.95
    (d,) = box_match_details(ref, cand, boxes="boxes", scores="scores")
    assert d.matches == ((0, 0, pytest.approx(0.6)),) and d.unmatched_candidate == (1,)
    (d,) = box_match_details(ref, cand, boxes="boxes", scores="scores", iou=0.7)
    assert d.matches == ((1, 0, pytest.approx(0.95)),)
    ref_l, cand_l = dets([A], [1.0], [3]), dets([A], [1.0], [4])
    opts = {"boxes": "boxes", "scores": "scores", "labels": "labels"}
    assert box_match(ref_l, cand_l, **opts) == 0.0
    # a class only the candidate produces gets AP 0: mean(AP_3 = 1, AP_4 = 0)
    cand_2 = dets([A, B], [1.0, 0.5], [3, 4])
    assert box_map(ref_l, cand_2, **opts) == pytest.approx(0.5)


def test_combined_layout_threshold_count_and_formats():
    # [N=2, K=3, 6] = x1 y1 x2 y2 score label, zero-padded
    ref = np.zeros((2, 3, 6), np.float32)
    ref[0, 0] = [*A, 0.9, 1]
    ref[1, 0] = [*B, 0.8, 2]
    ref[1, 1] = [*A, 0.2, 2]  # below score_threshold 0.3
    cand = ref.copy()
    cand[1, 1, 4] = 0.6  # now above threshold -> one false alarm
    details = box_match_details({"dets": ref}, {"dets": cand}, score_threshold=0.3)
    assert [(d.n_reference, d.n_candidate) for d in details] == [(1, 1), (1, 2)]
    assert box_match({"dets": ref}, {"dets": cand}, score_threshold=0.3) == pytest.approx(4 / 5)
    count = {"n": np.array([[1], [1]])}
    assert box_match({"dets": ref, **count}, {"dets": cand, **count}, count="n") == 1.0
    xywh = {"b": np.array([[0, 0, 10, 10]], np.float32)}
    xyxy_shifted = {"b": np.array([[0, 0, 10, 10]], np.float32)}
    assert box_match(xywh, xyxy_shifted, box_format="cxcywh") == 1.0
    with pytest.raises(MetricError, match="box_format"):
        box_match(xywh, xywh, box_format="yxyx")


def test_empty_cases_and_errors():
    empty = dets(np.zeros((0, 4)), [])
    assert box_match(empty, empty) == 1.0 and box_map(empty, empty) == 1.0
    assert box_map(empty, dets([A], [0.9])) == 0.0
    assert box_map(dets([A], [0.9]), empty) == 0.0
    with pytest.raises(MetricError, match="boxes must be"):
        box_match({"x": np.zeros(3)}, {"x": np.zeros(3)})
    with pytest.raises(MetricError, match="does not match boxes"):
        box_match(dets([A], [0.9]), {"boxes": np.zeros((1, 4)), "scores": np.zeros(2)},
                  scores="scores")


def test_detection_match_round_trips_json():
    ref = dets([A, B], [0.9, 0.9])
    cand = dets([[0, 0, 10, 9]], [0.5])
    (d,) = box_match_details(ref, cand)
    again = DetectionMatch.from_dict(json.loads(json.dumps(d.to_dict())))
    assert again == d and again.unmatched_reference == (1,)
