"""End-to-end OCR check of the FP16 detector written by ``precision-doctor fix``.

Runs the real RapidOCR 1.4.4 client (``pip install rapidocr_onnxruntime==1.4.4``, the ``demo``
extra) on every image of ``shared/data/ocr/full_images`` three times, changing only the detector:

(a) RapidOCR's own FP32 PP-OCRv4 det model (``shared/models/ppocrv4/det.onnx`` is the same file);
(b) the FP16 model written by ``precision_doctor.repair.pipeline.fix``; objective (``--metric``):
    ``db-boxes`` = 1 on every image (the client's own DBPostProcess on both maps, boxes rounded to
    each source image's pixels, all identical), every candidate plan evaluated with ONNX Runtime
    CPU (``--runner ort:cpu``, the engine RapidOCR runs); ``--metric mask-iou`` gives the looser
    target of binary mask IoU at 0.3 >= 0.99 (evaluated with the default emulator);
(c) a naive FP16 conversion: onnxconverter-common ``float16.convert_float_to_float16``
    (``keep_io_types=True``), the usual first attempt.

It compares the OCR results (boxes and strings, exactly) with (a), and the detector's binary mask
(``prob > 0.3``, RapidOCR's own pre-processed input captured at the session call) by IoU.
Acceptance: (b) gives identical boxes and strings on every image and mask IoU >= 0.99.

Usage (from the repo root; ``../shared`` must exist)::

    python3 benchmarks/ocr_end_to_end.py     # runs fix, writes $TMPDIR/pd-bench/ocr_e2e/
    python3 benchmarks/ocr_end_to_end.py --metric mask-iou   # the mask-IoU target instead
    python3 benchmarks/ocr_end_to_end.py --fixed det_fp16.onnx   # use an existing fixed model
    python3 benchmarks/ocr_end_to_end.py --extra autocast=autocast.onnx  # one more det model

Exit status 0 when the acceptance holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
MASK_THRESHOLD = 0.3  # DBPostProcess thresh (RapidOCR 1.4.4 config.yaml Det.thresh)
IOU_TARGET = 0.99


@dataclass
class OcrRun:
    """RapidOCR output on one image plus the detector's raw probability map."""

    boxes: list
    texts: list[str]
    scores: list[float]
    det_map: np.ndarray


class _Capture:
    """Wraps RapidOCR's ``OrtInferSession`` of the detector to keep its output map."""

    def __init__(self, session) -> None:
        self.session = session
        self.maps: list[np.ndarray] = []

    def __call__(self, x):
        out = self.session(x)
        self.maps.append(np.asarray(out[0], dtype=np.float32))
        return out

    def __getattr__(self, name):
        return getattr(self.session, name)


def run_rapidocr(det_model: Path, images: list[Path]) -> list[OcrRun]:
    """RapidOCR 1.4.4 with ``det_model`` (cls and rec: the package's own FP32 models)."""
    from rapidocr_onnxruntime import RapidOCR

    engine = RapidOCR(det_model_path=str(det_model))
    cap = _Capture(engine.text_det.infer)
    engine.text_det.infer = cap
    runs = []
    for img in images:
        cap.maps.clear()
        result, _ = engine(str(img))
        result = result or []
        runs.append(OcrRun(boxes=[np.asarray(r[0], dtype=np.float64).tolist() for r in result],
                           texts=[r[1] for r in result], scores=[float(r[2]) for r in result],
                           det_map=cap.maps[0] if cap.maps else np.zeros((1, 1, 1, 1))))
    return runs


def naive_fp16(model_path: Path, out: Path) -> Path:
    """onnxconverter-common's all-FP16 conversion with FP32 graph inputs/outputs."""
    from onnxconverter_common import float16

    model = float16.convert_float_to_float16(onnx.load(str(model_path)), keep_io_types=True)
    onnx.save(model, str(out))
    return out


def run_fix(model_path: Path, images: Path, out: Path, metric: str) -> tuple[Path, dict]:
    """``precision-doctor fix`` through the library, as the README's CLI example runs it."""
    from precision_doctor.compare.tasks.registry import get_metric
    from precision_doctor.formats import Precision
    from precision_doctor.graph.load import input_metadata, load_model
    from precision_doctor.inputs import load_samples
    from precision_doctor.repair.pipeline import fix
    from precision_doctor.runners.ort import OrtRunner
    from precision_doctor.search.objective import Objective

    model = load_model(model_path)
    samples = load_samples(images, input_metadata(model), "ppocr-det")
    runner = None
    if metric == "db-boxes":
        objective = Objective(metric=get_metric("db-boxes"), threshold=1.0)

        def runner(m):
            return OrtRunner(m, ("cpu",), name="ort-cpu")
    else:
        objective = Objective(metric=get_metric(f"mask-iou:threshold={MASK_THRESHOLD}"),
                              threshold=IOU_TARGET)
    t0 = time.perf_counter()
    result = fix(model, samples, Precision.FP16, objective, runner=runner)
    seconds = time.perf_counter() - t0
    onnx.save(result.model, str(out))
    info = {"seconds": round(seconds, 1), "evaluations": result.search.evaluations,
            "passed": result.passed, "fp32_share": result.share, "metric": metric,
            "kept": list(result.search.kept), "warnings": list(result.warnings),
            "score_ort_cpu": result.score_after.detail.get("per_sample"),
            "samples": [s.name for s in samples]}
    return out, info


def mask_iou(ref: np.ndarray, cand: np.ndarray) -> float:
    from precision_doctor.compare.tasks.image import mask_iou_per_sample

    if ref.shape != cand.shape:
        return float("nan")
    return float(mask_iou_per_sample(ref, cand, MASK_THRESHOLD)[0])


def compare(ref: OcrRun, cand: OcrRun) -> dict:
    """Exact comparison of one image's OCR result against the reference."""
    shift = (float(np.max(np.abs(np.asarray(ref.boxes) - np.asarray(cand.boxes))))
             if len(ref.boxes) == len(cand.boxes) and ref.boxes else
             (0.0 if len(ref.boxes) == len(cand.boxes) else float("nan")))
    return {"boxes": len(cand.boxes), "boxes_equal": cand.boxes == ref.boxes,
            "boxes_moved": sum(a != b for a, b in zip(ref.boxes, cand.boxes)),
            "max_shift_px": shift,
            "texts_equal": cand.texts == ref.texts,
            "texts_differ": sum(a != b for a, b in zip(ref.texts, cand.texts))
            + abs(len(ref.texts) - len(cand.texts)),
            "mask_iou": mask_iou(ref.det_map, cand.det_map),
            "nonfinite": int(np.count_nonzero(~np.isfinite(cand.det_map)))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shared", type=Path, default=SHARED)
    ap.add_argument("--fixed", type=Path, default=None, help="existing fixed det model")
    ap.add_argument("--metric", choices=("db-boxes", "mask-iou"), default="db-boxes",
                    help="fix objective (default: identical client boxes, ORT CPU)")
    ap.add_argument("--out", type=Path,
                    default=Path(tempfile.gettempdir()) / "pd-bench" / "ocr_e2e")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--extra", action="append", default=[], metavar="NAME=PATH",
                    help="another det model to compare (e.g. autocast=autocast.onnx)")
    args = ap.parse_args(argv)
    det = args.shared / "models/ppocrv4/det.onnx"
    image_dir = args.shared / "data/ocr/full_images"
    images = sorted(p for p in image_dir.iterdir() if p.suffix.lower() in
                    (".jpg", ".jpeg", ".png", ".bmp"))
    args.out.mkdir(parents=True, exist_ok=True)
    fix_info: dict = {}
    if args.fixed is None:
        fixed, fix_info = run_fix(det, image_dir, args.out / "det_fix_fp16.onnx", args.metric)
        print(f"fix: {fix_info['seconds']} s, {fix_info['evaluations']} evaluations, "
              f"FP32 {fix_info['fp32_share']['fp32_nodes']}/"
              f"{fix_info['fp32_share']['compute_nodes']} compute nodes {fix_info['kept']}, "
              f"{args.metric} (ORT CPU, ppocr-det preset) {fix_info['score_ort_cpu']}")
    else:
        fixed = args.fixed
    naive = naive_fp16(det, args.out / "det_naive_fp16.onnx")

    variants = {"fp32": det, "fix-fp16": fixed, "naive-fp16": naive}
    variants.update(dict(e.split("=", 1) for e in args.extra))
    runs = {k: run_rapidocr(p, images) for k, p in variants.items()}
    rows = []
    print(f"\n{'image':<28} {'variant':<11} {'boxes':>5} {'boxes==':>7} {'texts==':>7} "
          f"{'#diff':>5} {'moved':>5} {'shift px':>8} {'maskIoU':>8} {'nonfinite':>9}")
    for i, img in enumerate(images):
        for name in variants:
            c = compare(runs["fp32"][i], runs[name][i])
            rows.append({"image": img.name, "variant": name, **c})
            print(f"{img.name:<28} {name:<11} {c['boxes']:>5} {c['boxes_equal']!s:>7} "
                  f"{c['texts_equal']!s:>7} {c['texts_differ']:>5} {c['boxes_moved']:>5} "
                  f"{c['max_shift_px']:>8.3g} {c['mask_iou']:>8.4f} "
                  f"{c['nonfinite']:>9}")
    fixed_rows = [r for r in rows if r["variant"] == "fix-fp16"]
    ok = all(r["boxes_equal"] and r["texts_equal"] and r["mask_iou"] >= IOU_TARGET
             for r in fixed_rows)
    print(f"\nfirst texts (fp32): {runs['fp32'][0].texts[:3]}")
    print(f"acceptance (fix-fp16 identical OCR and mask IoU >= {IOU_TARGET} on every image): "
          f"{'PASS' if ok else 'FAIL'}")
    if args.json:
        args.json.write_text(json.dumps({"fix": fix_info, "rows": rows, "passed": ok,
                                         "texts": {k: [r.texts for r in v]
                                                   for k, v in runs.items()}},
                                        ensure_ascii=False, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    sys.exit(main())
