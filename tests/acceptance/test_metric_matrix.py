"""Every built-in task metric end to end: ``fix --metric`` (CLI) and ``diagnose(metric=...)``
(API), on image inputs (with their per-sample context) and on array inputs, each on a tiny
model of the metric's kind. A metric that crashes anywhere on this path cannot ship
(a regression: ``box-map`` raised "unexpected keyword argument 'source_size'" on every image input
while its unit tests called the function directly)."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
from onnx import TensorProto, helper
from PIL import Image
from tiny_models import make_model, tensor, yolo_head
from typer.testing import CliRunner

import precision_doctor as pd
from precision_doctor.cli import app
from precision_doctor.compare.tasks.registry import BUILTINS

SIDE = 16
RNG = np.random.default_rng(7)


def _conv(name, cin, cout, x, y):
    w = RNG.normal(0, 0.4, (cout, cin, 1, 1))
    return (helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [y], name=name),
            [tensor(f"{name}_w", w), tensor(f"{name}_b", RNG.normal(0, 0.1, cout))])


def _io(out_shape, name="y"):
    return ([helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, SIDE, SIDE])],
            [helper.make_tensor_value_info(name, TensorProto.FLOAT, out_shape)])


def classifier():
    conv, inits = _conv("conv", 3, 8, "x", "h")
    nodes = [conv, helper.make_node("GlobalAveragePool", ["h"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], name="fc", transB=1),
             helper.make_node("Softmax", ["logits"], ["y"], name="softmax", axis=-1)]
    inits += [tensor("fc_w", RNG.normal(0, 1, (10, 8))), tensor("fc_b", np.zeros(10))]
    return make_model(nodes, *_io([1, 10]), inits)


def sigmoid_map():
    conv, inits = _conv("conv", 3, 1, "x", "h")
    return make_model([conv, helper.make_node("Sigmoid", ["h"], ["y"], name="sig")],
                      *_io([1, 1, SIDE, SIDE]), inits)


def image_to_image():
    conv, inits = _conv("conv", 3, 3, "x", "y")
    return make_model([conv], *_io([1, 3, SIDE, SIDE]), inits)


def ctc():
    conv, inits = _conv("conv", 3, 6, "x", "h")  # [1, 6, 16, 16] -> T=16 steps, C=6 classes
    nodes = [conv, helper.make_node("ReduceMean", ["h"], ["r"], name="pool_h", axes=[2],
                                    keepdims=0),
             helper.make_node("Transpose", ["r"], ["t"], name="to_ntc", perm=[0, 2, 1]),
             helper.make_node("Softmax", ["t"], ["y"], name="softmax", axis=-1)]
    return make_model(nodes, *_io([1, SIDE, 6]), inits,
                      metadata={"character": "a\nb\nc\nd"})


def audio_like():
    """A signal out of the image: conv, then its 768 values as one waveform [1, 768]."""
    conv, inits = _conv("conv", 3, 3, "x", "h")
    nodes = [conv, helper.make_node("Reshape", ["h", "flat"], ["y"], name="to_signal")]
    inits.append(helper.make_tensor("flat", TensorProto.INT64, [2], [1, -1]))
    return make_model(nodes, *_io([1, 3 * SIDE * SIDE]), inits)


MODELS = {"top1": classifier, "top5": classifier, "mask-iou": sigmoid_map,
          "db-boxes": sigmoid_map, "box-match": yolo_head, "box-map": yolo_head,
          "ctc-string": ctc, "ctc-char": ctc, "psnr": image_to_image, "ssim": image_to_image,
          "coco-map-drop": yolo_head, "accuracy-drop": classifier, "lsd": audio_like}
# a pass mark each tiny model meets in FP16 (what is tested is that the path runs end to end)
THRESHOLDS = {"psnr": 20.0, "coco-map-drop": 0.05, "accuracy-drop": 0.0, "top1": 0.5,
              "top5": 0.5, "mask-iou": 0.5, "db-boxes": 0.5, "box-match": 0.5, "box-map": 0.5,
              "ctc-string": 0.5, "ctc-char": 0.5, "ssim": 0.5, "lsd": 1.0}
LABELLED = ("coco-map-drop", "accuracy-drop")
PREPROCESS = f"resize=fixed,size={SIDE}x{SIDE},scale=1/255"


def test_matrix_covers_every_builtin():
    assert set(MODELS) == set(BUILTINS) and set(THRESHOLDS) == set(BUILTINS)


def _needs(metric):
    if metric == "db-boxes" and importlib.util.find_spec("rapidocr_onnxruntime") is None \
            and importlib.util.find_spec("rapidocr") is None:
        pytest.skip("db-boxes needs rapidocr (the demo extra)")
    if metric == "coco-map-drop" and importlib.util.find_spec("pycocotools") is None:
        pytest.skip("coco-map-drop needs pycocotools (the detect extra)")
    if metric in ("box-match", "box-map", "coco-map-drop") and \
            importlib.util.find_spec("cv2") is None:
        pytest.skip("raw detection heads need OpenCV for NMS (the detect extra)")


def _data(tmp_path, kind, model):
    folder = tmp_path / kind
    folder.mkdir()
    if kind == "images":
        import skimage.data

        for name in ("astronaut", "coffee"):
            Image.fromarray(getattr(skimage.data, name)()).save(folder / f"{name}.png")
        return str(folder), PREPROCESS
    for i in range(2):
        np.save(folder / f"s{i}.npy", RNG.uniform(0, 1, (1, 3, SIDE, SIDE)).astype(np.float32))
    return str(folder), None


def _labels(tmp_path, metric, model, data, preprocess):
    """Labels made from the FP32 model's own answers (the path is under test, not the
    model): class of each sample, or its boxes in source pixels."""
    import os

    samples = sorted(os.listdir(data))
    fp32 = pd.diagnose(model, data, preprocess=preprocess, layerwise=False, noise=False,
                       quiet=True, target="fp32")
    assert fp32.verdict == "pass"
    if metric == "accuracy-drop":
        path = tmp_path / "labels.csv"
        path.write_text("file,class\n" + "".join(f"{s},{i % 10}\n" for i, s in
                                                   enumerate(samples)))
        return str(path)
    images = [{"id": i + 1, "file_name": s, "width": 512, "height": 512}
              for i, s in enumerate(samples)]
    anns = [{"id": i + 1, "image_id": i + 1, "category_id": 0, "bbox": [100, 100, 200, 200],
             "area": 40000, "iscrowd": 0} for i in range(len(samples))]
    path = tmp_path / "labels.json"
    path.write_text(json.dumps({"images": images, "annotations": anns,
                                "categories": [{"id": 0, "name": "a"}]}))
    return str(path)


@pytest.mark.parametrize("kind", ["images", "arrays"])
@pytest.mark.parametrize("metric", sorted(MODELS))
def test_fix_cli_and_diagnose_api(tmp_path, metric, kind):
    _needs(metric)
    model = MODELS[metric]()
    model_path = tmp_path / "m.onnx"
    model_path.write_bytes(model.SerializeToString())
    data, preprocess = _data(tmp_path, kind, model)
    labels = (_labels(tmp_path, metric, str(model_path), data, preprocess)
              if metric in LABELLED else None)
    threshold = THRESHOLDS[metric]

    d = pd.diagnose(str(model_path), data, preprocess=preprocess, metric=metric,
                    threshold=threshold, layerwise=False, noise=False, quiet=True,
                    labels=labels)
    assert d.task is not None and metric in d.task["metric"]
    assert len(d.task["per_sample"]) == 2 and d.task["passed"], d.task

    out = tmp_path / "fixed.onnx"
    args = ["fix", str(model_path), "-o", str(out), "--data", data, "--metric", metric,
            "--threshold", str(threshold), "--max-evals", "20", "-q"]
    args += ["-p", preprocess] if preprocess else []
    args += ["--labels", labels] if labels else []
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.with_suffix(".report.json").read_text())
    assert report["verdict"] == "pass" and metric in report["objective"]
    if labels:
        assert set(report["accuracy"]["runs"]) == {"fp32", "fp16", "fixed"}
