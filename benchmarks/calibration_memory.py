"""Peak memory of INT8 calibration against the size of the calibration set: 64 vs 1024 images.

``diagnose --target int8`` on PP-OCRv4 cls (../shared), evaluated on 8 real text crops
(``rec_crops/paddleocr``, the first 8 by name), calibrated on 64 or 1024 images, each run in its
own process (peak RSS of that process, interpreter and imports included). The calibration
images are synthetic but seeded: random sub-crops (80-100% of each side) of the remaining 27
real crops with a brightness factor in [0.7, 1.3], written as PNG (the shared data holds 35
crops, not 1024). Two ways to hand them over:

* ``streamed``: the folder as ``calibration=`` (``--calibration-data``): images decoded one at
  a time (``inputs.LazySamples``), each sample's activations folded into the histograms;
* ``held``: the same images loaded first as a list of samples (``as_samples``), what the
  calibration held before it streamed.

Usage::

    python -m benchmarks run calibration_memory [--sizes 64,1024]

Writes ``benchmarks/results/calibration_memory_<date>_<machine>.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from common import REPO, measure_process, results_path, write_results  # noqa: E402

SHARED = REPO.parent / "shared"
MODEL = SHARED / "models" / "ppocrv4" / "cls.onnx"
CROPS = SHARED / "data" / "ocr" / "rec_crops"
EVALUATED = 8
SEED = 0


def make_images(folder: Path, count: int, sources: list[Path]) -> None:
    """``count`` seeded variations of ``sources`` as PNG files in ``folder``."""
    from PIL import Image, ImageEnhance

    rng = np.random.default_rng(SEED)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        image = Image.open(sources[i % len(sources)]).convert("RGB")
        w, h = image.size
        cw, ch = int(w * rng.uniform(0.8, 1.0)), int(h * rng.uniform(0.8, 1.0))
        left, top = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        image = image.crop((left, top, left + cw, top + ch))
        image = ImageEnhance.Brightness(image).enhance(float(rng.uniform(0.7, 1.3)))
        image.save(folder / f"cal_{i:04d}.png")


def child(calibration: str, evaluation: str, mode: str) -> None:
    """One diagnosis; prints its calibration summary as one JSON line."""
    sys.path.insert(0, str(REPO / "src"))
    import precision_doctor as pd
    from precision_doctor.api.options import as_model, as_samples

    cal: object = calibration
    if mode == "held":
        cal = as_samples(calibration, as_model(MODEL)[0], "ppocr-cls")
    d = pd.diagnose_quantized(MODEL, evaluation, preprocess="ppocr-cls", target="int8",
                              calibration=cal, quiet=True).to_dict()
    first = sorted(d["calibration"]["tensors"])[0]
    print(json.dumps({"calibration": {k: d["calibration"][k] for k in
                                      ("samples", "source", "disjoint")},
                      "evaluation": d["evaluation"], "passed": d["passed"],
                      "score": d["score"], "seconds": d["seconds"],
                      "amax_first_tensor": [first, d["calibration"]["tensors"][first]["amax"]]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,1024")
    parser.add_argument("--modes", default="streamed,held")
    parser.add_argument("--child", nargs=3, metavar=("CALIBRATION", "EVALUATION", "MODE"))
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    crops = sorted((CROPS / "paddleocr").iterdir())
    rest = crops[EVALUATED:] + sorted((CROPS / "rapidocr").iterdir())
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        evaluation = Path(tmp) / "evaluation"
        evaluation.mkdir()
        for f in crops[:EVALUATED]:
            (evaluation / f.name).write_bytes(f.read_bytes())
        for size in sizes:
            folder = Path(tmp) / f"calibration_{size}"
            make_images(folder, size, rest)
            for mode in args.modes.split(","):
                log = Path(tmp) / f"{size}_{mode}.log"
                info = measure_process([sys.executable, __file__, "--child", str(folder),
                                        str(evaluation), mode], log=log)
                lines = log.read_text().strip().splitlines()
                got = json.loads(lines[-1]) if info["returncode"] == 0 else {"log": lines[-5:]}
                rows.append({"calibration_images": size, "mode": mode, **info, **got})
                print(f"{size:5d} {mode:8s} peak RSS {info['peak_rss_mb']} MB, "
                      f"{info['wall_s']} s", flush=True)
    ratios = {}
    for mode in args.modes.split(","):
        rss = {r["calibration_images"]: r["peak_rss_mb"] for r in rows if r["mode"] == mode}
        if len(sizes) == 2 and all(rss.get(s) for s in sizes):
            ratios[mode] = round(rss[sizes[1]] / rss[sizes[0]], 3)
    print("peak RSS ratio", ratios)
    write_results(results_path("calibration_memory"), {
        "model": "PP-OCRv4 cls (../shared/models/ppocrv4/cls.onnx), INT8, calibrator max",
        "evaluation": f"the first {EVALUATED} crops of rec_crops/paddleocr (real)",
        "calibration": "seeded synthetic variations (sub-crop, brightness) of the other 27 "
                       f"real crops, seed {SEED}",
        "rows": rows, "peak_rss_ratio": ratios})


if __name__ == "__main__":
    main()
