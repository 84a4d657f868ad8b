"""The protocol of ``quant_anchors``: which models, which samples, which metric, and the FP32
model and sample files every tool reads.

Each model's samples are split once, deterministically, into a calibration set and an
evaluation set, disjoint (:func:`split`: a permutation seeded with ``SPLIT_SEED``; the first
quarter, rounded up and at least 2, calibrates, the rest evaluates; each part in file order).
Every tool sees the calibration set only: ORT and ModelOpt calibrate on it, precision-doctor
calibrates and searches on it. The evaluation set is run only on the written models. The
results file states the seed, the counts and the names of both sets per model.

* ``cls``: PP-OCRv4 text-direction classifier (``shared/models/ppocrv4/cls.onnx``), the 32
  crops of ``shared/data/ocr/rec_crops/*/`` (8 calibrate, 24 evaluate), ``ppocr-cls``
  preprocessing ([1, 3, 48, 192]); task metric ``top1`` (identical class on every crop).
* ``rec``: PP-OCRv4 recognizer, the same crops and split, ``ppocr-rec:max-width=320``
  ([1, 3, 48, 320]: fixed so every tool can stack them); ``ctc-string`` (CTC greedy string
  agreement, >= 0.95 on every crop, the metric's default).
* ``det``: PP-OCRv4 DB text detector, the 5 images of ``shared/data/ocr/full_images`` and
  ``misc`` (2 calibrate, 3 evaluate) resized to 640x640 (``ppocr-det:resize=fixed,size=640x640``);
  ``mask-iou:threshold=0.3`` (DBPostProcess's binary mask, IoU >= 0.95 on every image);
  ``db-boxes`` is reported too.
* ``minilm``: all-MiniLM-L6-v2 at opset 17 (``.models/minilm_op17.onnx``, exported by
  ``benchmarks/export_minilm.py``), its 16 sentences (``.models/minilm_data/batch*.npz``) as 16
  samples of batch 1 x 128 tokens (4 calibrate, 12 evaluate);
  ``benchmarks/transformer_metrics.py:min_cosine`` >= 0.99 (every token's hidden vector).
* ``yolo``: YOLOv8n (``nudenet==3.4.2``'s ``320n.onnx``, see ``tests/real_detectors.py``), its 6
  photos (2 calibrate, 4 evaluate), ``ultralytics:size=320x320``; ``box-map`` (mAP@0.5 against
  FP32's boxes, >= 0.95).

Every tool gets the FP32 model with its nodes named (``api.options.as_model``), so that the
layers each one leaves unquantized can be compared by name.
"""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
MODELS = {
    "cls": {"model": SHARED / "models/ppocrv4/cls.onnx", "data": "ocr-crops",
            "preprocess": "ppocr-cls", "metric": "top1", "threshold": 0.99},
    "rec": {"model": SHARED / "models/ppocrv4/rec.onnx", "data": "ocr-crops",
            "preprocess": "ppocr-rec:max-width=320", "metric": "ctc-string:charset={model}",
            "threshold": 0.95},
    "det": {"model": SHARED / "models/ppocrv4/det.onnx", "data": "ocr-full",
            "preprocess": "ppocr-det:resize=fixed,size=640x640",
            "metric": "mask-iou:threshold=0.3", "threshold": 0.95,
            "extra_metrics": {"db-boxes": 1.0}},
    "minilm": {"model": REPO / ".models/minilm_op17.onnx", "data": "minilm",
               "metric": str(REPO / "benchmarks/transformer_metrics.py") + ":min_cosine",
               "threshold": 0.99},
    "yolo": {"model": "nudenet", "data": "photos", "preprocess": "ultralytics:size=320x320",
             "metric": "box-map", "threshold": 0.95},
}
DEFAULT_MODELS = ("cls", "rec", "det", "minilm")
SPLIT_SEED = 0


# ----------------------------------------------------------------------------- samples

def _ocr_files(kind: str) -> list[Path]:
    root = SHARED / "data" / "ocr"
    if kind == "ocr-crops":
        return sorted(p for p in (root / "rec_crops").glob("*/*") if p.is_file())
    return sorted(p for d in ("full_images", "misc") for p in (root / d).iterdir() if p.is_file())


def split(n: int, seed: int = SPLIT_SEED) -> tuple[list[int], list[int]]:
    """Split ``n`` >= 3 samples into (calibration, evaluation) indices, disjoint: a permutation
    of ``range(n)`` by ``numpy.random.default_rng(seed)``, its first ``max(2, ceil(n / 4))``
    indices calibrate, the others evaluate; each list ascending. The quarter is a choice (more
    samples for the reported evaluation, at least two to calibrate on), not a measurement."""
    import numpy as np

    if n < 3:
        raise ValueError(f"{n} samples cannot be split into calibration and evaluation")
    order = np.random.default_rng(seed).permutation(n)
    k = max(2, math.ceil(n / 4))
    return sorted(int(i) for i in order[:k]), sorted(int(i) for i in order[k:])


def prepare(name: str, folder: Path) -> dict:
    """Write the named FP32 model and its samples (one .npz each, plus the calibration samples
    stacked on the batch axis for ModelOpt) under ``folder``; return the spec the workers read:
    ``calibration`` (the files every tool calibrates on) and ``samples`` (the evaluation files,
    no tool sees them)."""
    import numpy as np
    import onnx

    from precision_doctor.api.options import as_model, as_samples

    spec = dict(MODELS[name])
    folder.mkdir(parents=True, exist_ok=True)
    if spec["model"] == "nudenet":
        sys.path.insert(0, str(REPO / "tests"))
        import real_detectors as rd

        found = rd.nudenet_path()
        if found is None:
            raise RuntimeError(f"YOLOv8n needs the nudenet wheel: {rd.INSTALL}")
        spec["model"] = found
    source = Path(spec["model"])
    if not source.is_file():
        raise RuntimeError(f"{source} is missing")
    model, _ = as_model(source)
    if spec["data"] in ("ocr-crops", "ocr-full"):
        images = folder / "images"
        images.mkdir(exist_ok=True)
        for p in _ocr_files(spec["data"]):
            shutil.copy(p, images / f"{p.parent.name}__{p.name}")
        samples = as_samples(str(images), model, spec["preprocess"])
    elif spec["data"] == "photos":
        samples = as_samples(str(rd.write_photos(folder / "photos")), model, spec["preprocess"])
    else:  # minilm: two batches of 8 sentences -> 16 samples of batch 1
        feeds = []
        for f in sorted((REPO / ".models" / "minilm_data").glob("batch*.npz")):
            batch = dict(np.load(f))
            n = len(next(iter(batch.values())))
            feeds += [{k: v[i:i + 1] for k, v in batch.items()} for i in range(n)]
        samples = as_samples(feeds, model)
    fp32 = folder / "fp32.onnx"
    onnx.save(model, str(fp32))
    (folder / "samples").mkdir(exist_ok=True)
    files = []
    for i, s in enumerate(samples):
        files.append(str(folder / "samples" / f"{i:03d}.npz"))
        np.savez(files[-1], **s.feeds)
    calibration, evaluation = split(len(samples))
    stacked = {k: np.concatenate([samples[i].feeds[k] for i in calibration])
               for k in samples[0].feeds}
    np.savez(folder / "calib.npz", **stacked)
    spec.update(name=name, model=str(fp32), source=str(source),
                calibration=[files[i] for i in calibration],
                samples=[files[i] for i in evaluation],
                split={"seed": SPLIT_SEED, "rule": "numpy default_rng(seed).permutation(n): "
                       "the first max(2, ceil(n/4)) calibrate, the rest evaluate",
                       "calibration_samples": len(calibration),
                       "evaluation_samples": len(evaluation), "disjoint": True,
                       "calibration": [samples[i].name for i in calibration],
                       "evaluation": [samples[i].name for i in evaluation]},
                sample_names=[samples[i].name for i in evaluation],
                calib=str(folder / "calib.npz"), metric=spec["metric"].format(model=source))
    return spec

