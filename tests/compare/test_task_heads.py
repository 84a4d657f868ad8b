"""Detection heads as exported: shapes guessed, decoded, NMS by OpenCV; labels and COCO mAP."""

import json
import math

import numpy as np
import pytest

from precision_doctor.compare.tasks.coco import coco_map, coco_map_drop, to_source
from precision_doctor.compare.tasks.detection import box_map, extract_detections
from precision_doctor.compare.tasks.heads import HeadSpec, ImageDetections, infer_head
from precision_doctor.compare.tasks.labels import ImageLabels, accuracy_drop, load_labels
from precision_doctor.compare.tasks.registry import evaluate_metric, get_metric
from precision_doctor.errors import InputError, MetricError

pytest.importorskip("cv2")


def yolov8(n_anchor=100, classes=3):
    """[1, 4+C, A]: two real objects (each seen by 3 overlapping anchors) and background."""
    a = np.zeros((1, 4 + classes, n_anchor), np.float32)
    a[0, :4] = [[50], [50], [10], [10]]
    a[0, 4:, :] = 0.01
    for k, (cx, cls, s) in enumerate([(20, 0, 0.9), (20.5, 0, 0.8), (21, 0, 0.7),
                                      (80, 2, 0.6), (80.5, 2, 0.5), (81, 1, 0.55)]):
        a[0, :4, k] = [cx, 30, 10, 10]
        a[0, 4 + cls, k] = s
    return a


def test_yolov8_decodes_thresholds_and_class_aware_nms():
    out = {"output0": yolov8()}
    assert infer_head(out).kind == "yolov8"
    det = extract_detections(out)[0]
    # class 0: one box after NMS; class 2 and class 1 overlap but NMS is per class
    assert sorted(det.labels.tolist()) == [0, 1, 2]
    np.testing.assert_allclose(det.boxes[np.argmax(det.scores)], [15, 25, 25, 35])
    assert det.scores.max() == pytest.approx(0.9)
    assert len(extract_detections(out, score_threshold=0.58)[0].scores) == 2
    assert len(extract_detections(out, nms_iou=0.99)[0].scores) == 6
    transposed = {"o": np.swapaxes(yolov8(), 1, 2)}  # [N, A, 4+C] exports
    assert sorted(extract_detections(transposed, head="yolov8")[0].labels.tolist()) == [0, 1, 2]


def test_yolov5_objectness_times_class_score():
    a = np.zeros((1, 1200, 8), np.float32)  # 3 classes; <= 2 would read as rows after NMS
    a[0, :, :4] = [300, 300, 20, 20]
    a[0, 0] = [100, 100, 40, 40, 0.9, 0.5, 0.1, 0]  # score 0.45, class 0
    a[0, 1] = [300, 300, 40, 40, 0.2, 0.1, 0.9, 0]  # score 0.18 < 0.25: dropped
    out = {"output0": a}
    assert infer_head(out).kind == "yolov5"
    assert infer_head({"o": a[..., :7]}).kind == "nms"  # ambiguous: say head=yolov5
    assert extract_detections({"o": a[..., :7]}, head="yolov5")[0].labels.tolist() == [0]
    det = extract_detections(out)[0]
    assert det.scores.tolist() == pytest.approx([0.45]) and det.labels.tolist() == [0]


def test_detr_sigmoid_softmax_and_topk():
    q = np.zeros((1, 300, 8), np.float32)  # ultralytics RT-DETR: normalized cxcywh + scores
    q[0, :, :4] = [0.5, 0.5, 0.1, 0.1]
    q[0, 0, :6] = [0.25, 0.25, 0.1, 0.1, 0.95, 0.02]
    q[0, 1, :6] = [0.75, 0.75, 0.1, 0.1, 0.05, 0.60]
    out = {"o": q}
    assert infer_head(out).kind == "detr"
    det = extract_detections(out)[0]
    assert det.normalized and det.labels.tolist() == [0, 1]
    np.testing.assert_allclose(det.boxes[0], [0.2, 0.2, 0.3, 0.3], rtol=1e-6)
    assert len(extract_detections(out, max_det=1)[0].scores) == 1
    logits = np.full((1, 100, 3), -5.0, np.float32)  # DETR: softmax, last class = no object
    logits[0, :, 2] = 5.0
    logits[0, 3] = [4.0, -5.0, 0.0]
    boxes = np.tile(np.float32([0.5, 0.5, 0.2, 0.2]), (1, 100, 1))
    pair = {"pred_boxes": boxes, "pred_logits": logits}
    det = extract_detections(pair, head="detr", boxes="pred_boxes", scores="pred_logits",
                             box_format="cxcywh", activation="softmax")[0]
    assert det.labels.tolist() == [0] and det.scores[0] == pytest.approx(0.982, abs=1e-3)


def test_ssd_boxes_and_softmax_scores_drop_background():
    boxes = np.tile(np.float32([0.1, 0.1, 0.2, 0.2]), (1, 200, 1))
    scores = np.tile(np.float32([0.99, 0.01]), (1, 200, 1))
    boxes[0, 5], scores[0, 5] = [0.5, 0.5, 0.7, 0.7], [0.1, 0.9]
    boxes[0, 6], scores[0, 6] = [0.51, 0.5, 0.71, 0.7], [0.2, 0.8]  # suppressed by box 5
    out = {"boxes": boxes, "conf": scores}
    spec = infer_head(out)
    assert (spec.kind, spec.boxes, spec.scores) == ("ssd", "boxes", "conf")
    det = extract_detections(out)[0]
    assert det.labels.tolist() == [1] and det.normalized and det.scores[0] == pytest.approx(0.9)
    assert len(extract_detections(out, background=-1)[0].scores) > 1  # background kept


def test_heads_with_nms_efficientnms_and_paddle():
    out = {"num_dets": np.array([[1]], np.int32),
           "det_boxes": np.array([[[1, 2, 3, 4], [5, 6, 7, 8]]], np.float32),
           "det_scores": np.array([[0.9, 0.8]], np.float32),
           "det_classes": np.array([[3, 4]], np.int32)}
    spec = infer_head(out)
    assert spec.kind == "nms" and spec.count == "num_dets"
    det = extract_detections(out)[0]
    assert det.labels.tolist() == [3] and det.boxes.tolist() == [[1, 2, 3, 4]]
    rows = np.array([[2, 0.9, 1, 1, 5, 5], [1, 0.7, 2, 2, 6, 6], [-1, 0, 0, 0, 0, 0]],
                    np.float32)
    paddle = {"multiclass_nms3_0.tmp_0": rows, "multiclass_nms3_0.tmp_2": np.array([2, 1])}
    assert infer_head(paddle).kind == "paddle"
    images = extract_detections(paddle)
    assert [d.labels.tolist() for d in images] == [[2, 1], []]
    assert images[0].boxes[0].tolist() == [1, 1, 5, 5]


def test_bad_head_options_raise():
    with pytest.raises(MetricError, match="head='yolo'"):
        extract_detections({"o": yolov8()}, head="yolo")
    with pytest.raises(MetricError, match="no option 'nms'"):
        get_metric("box-map:nms=0.5")
    assert get_metric("box-map:head=detr,activation=softmax").params == (
        ("activation", "softmax"), ("head", "detr"))


def test_box_metric_takes_image_context_without_crashing():
    # the reported crash: the sample's context was forwarded into the detection options
    metric = get_metric("box-map")
    out = {"output0": yolov8()}
    assert evaluate_metric(metric, out, out, {"source_size": (480, 640),
                                              "input_size": (320, 320)}) == 1.0
    assert box_map(out, out, head="yolov8") == 1.0


def test_coco_map_by_pycocotools_and_the_drop(tmp_path):
    pytest.importorskip("pycocotools")
    truth = ImageLabels("detection", "a.png", 1, 640, 480, ((100.0, 50.0, 200.0, 100.0),),
                        (0,), (0,))
    exact = ImageDetections(np.array([[50.0, 50.0, 150.0, 100.0]]), np.array([0.9]),
                            np.array([0]))  # input pixels of a 320x320 input
    np.testing.assert_allclose(to_source(exact, (480, 640), (320, 320)),
                               [[100, 75, 300, 150]])
    # letterbox 480x640 -> 320x320: the image is 240x320 at top 40 (ultralytics LetterBox)
    np.testing.assert_allclose(to_source(exact, (480, 640), (320, 320), (40, 0, 240, 320)),
                               [[100, 20, 300, 120]])
    unit = ImageDetections(np.array([[0.25, 0.25, 0.5, 0.5]]), np.array([0.9]),
                           np.array([0]), normalized=True)
    np.testing.assert_allclose(to_source(unit, (480, 640), (320, 320), (40, 0, 240, 320)),
                               [[160, 80, 320, 240]])
    hit = coco_map([exact], [truth], [(None, None)])
    assert hit["map50"] == 0.0 and hit["objects"] == 1  # in the wrong pixels without sizes
    right = ImageDetections(np.array([[100.0, 50.0, 300.0, 150.0]]), np.array([0.9]),
                            np.array([0]))
    assert coco_map([right], [truth], [(None, None)])["map"] == pytest.approx(1.0)
    shifted = ImageDetections(np.array([[110.0, 50.0, 310.0, 150.0]]), np.array([0.9]),
                              np.array([0]))
    partial = coco_map([shifted], [truth], [(None, None)])["map"]  # IoU 0.905: 9 of 10
    assert partial == pytest.approx(0.9, abs=1e-6)
    ref = {"o": np.array([[[100, 50, 300, 150, 0.9, 0]]], np.float32)}
    cand = {"o": np.array([[[110, 50, 310, 150, 0.9, 0]]], np.float32)}
    drop = coco_map_drop(ref, cand, ground_truth=truth)
    assert drop == pytest.approx(0.1, abs=1e-6)
    assert get_metric("coco-map-drop").higher_is_better is False
    with pytest.raises(MetricError, match="--labels"):
        coco_map_drop(ref, cand)
    empty = ImageLabels("detection", "b.png", 2, 10, 10)
    assert coco_map_drop(ref, ref, ground_truth=empty) == 0.0
    assert math.isnan(coco_map([right], [empty], [(None, None)])["map"])


def test_labels_files(tmp_path):
    coco = tmp_path / "l.json"
    coco.write_text(json.dumps({
        "images": [{"id": 7, "file_name": "dir/a.png", "width": 4, "height": 3}],
        "annotations": [{"image_id": 7, "category_id": 18, "bbox": [1, 1, 2, 1]}],
        "categories": [{"id": 18, "name": "dog"}]}))
    labels = load_labels(coco)
    assert labels.kind == "detection" and labels.images["a.png"].categories == (18,)
    mapped = labels.with_class_names({0: "cat", 1: "Dog"})
    assert mapped.images["a.png"].categories == (1,) and mapped.categories == {1: "dog"}
    assert labels.with_class_names({0: "cat"}) is labels  # not every name found: unchanged
    assert labels.for_samples(["x/a.png", "b.png"])[1] is None
    with pytest.raises(InputError, match="no sample has labels.*'b.png'"):
        labels.for_samples(["b.png"])
    csv_path = tmp_path / "l.csv"
    csv_path.write_text("file,class\na.png,2\nb.png,0\n")
    table = load_labels(csv_path)
    truth = table.images["a.png"]
    ref, wrong = {"p": np.array([[0.1, 0.2, 0.7]])}, {"p": np.array([[0.8, 0.1, 0.1]])}
    assert accuracy_drop(ref, wrong, ground_truth=truth) == 1.0
    assert accuracy_drop(wrong, ref, ground_truth=truth) == -1.0
    (tmp_path / "bad.csv").write_text("a.png,two\nb.png,x\n")
    with pytest.raises(InputError, match="line 2"):
        load_labels(tmp_path / "bad.csv")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(InputError, match="not a COCO detection JSON"):
        load_labels(tmp_path / "bad.json")


def test_head_spec_options_name_the_outputs():
    assert HeadSpec("yolov8", "output0").options() == "head=yolov8"
    assert HeadSpec("ssd", "boxes", "conf").options() == "head=ssd,boxes=boxes,scores=conf"
