"""Transformer headroom and stress factor of the real transformers, CPU only.

Models (see benchmarks/MODELS.md for provenance and licences):

- ``rec``: PP-OCRv4 rec (SVTR-LCNet: 2 transformer blocks + 1 in the neck, decomposed LayerNorm,
  opset 12), shipped in the ``rapidocr_onnxruntime`` wheel (``shared/models/ppocrv4/rec.onnx``);
  ``rec17`` = the same with its LayerNorms fused by ``fuse-layernorm`` (opset 17). Inputs: the
  28 + 4 real crops of ``shared/data/ocr/rec_crops`` (``ppocr-rec``).
- ``minilm14`` / ``minilm17``: all-MiniLM-L6-v2 (``benchmarks/export_minilm.py``), 16 sentences.
- ``whisper14`` / ``whisper17``: Whisper tiny.en encoder (``benchmarks/export_whisper.py``), 9
  real 30 s clips.

For each: ``analyze_transformer`` on every sample, then the stress probe on the first sample.
Writes ``benchmarks/results/transformers_<date>_<machine>.json`` and prints a Markdown table.

    python -m benchmarks run transformer_headroom [--models rec,whisper14]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from precision_doctor.diagnosis.headroom.probe import analyze_transformer
from precision_doctor.diagnosis.headroom.stress import stress_probe
from precision_doctor.graph.load import input_metadata, load_model
from precision_doctor.inputs import load_samples
from precision_doctor.precision.rewrites import apply_rewrites

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from common import results_path, write_results  # noqa: E402

# ../shared beside the checkout (a worktree under /work/wt has it two levels up)
SHARED = next((p for p in (REPO.parent / "shared", REPO.parents[1] / "shared") if p.is_dir()),
              REPO.parent / "shared")
MODELS = REPO / ".models"
CASES = {
    "rec": (SHARED / "models/ppocrv4/rec.onnx", SHARED / "data/ocr/rec_crops/*/*", "ppocr-rec",
            False),
    "rec17": (SHARED / "models/ppocrv4/rec.onnx", SHARED / "data/ocr/rec_crops/*/*",
              "ppocr-rec", True),
    "minilm14": (MODELS / "minilm_op14.onnx", MODELS / "minilm_data", None, False),
    "minilm17": (MODELS / "minilm_op17.onnx", MODELS / "minilm_data", None, False),
    "whisper14": (MODELS / "whisper_enc_op14.onnx", MODELS / "whisper_data", None, False),
    "whisper17": (MODELS / "whisper_enc_op17.onnx", MODELS / "whisper_data", None, False),
}


def load(name: str):
    path, data, preprocess, fuse = CASES[name]
    model = load_model(path)
    if fuse:
        model, _ = apply_rewrites(model, ["fuse-layernorm"])
    samples = load_samples(str(data), input_metadata(model), preprocess)
    return model, [dict(s.feeds) for s in samples]


def _min(values) -> float | None:
    vals = [v for v in values if v is not None]
    return min(vals) if vals else None


def run(name: str) -> dict:
    model, feeds = load(name)
    t0 = time.perf_counter()
    report = analyze_transformer(model, feeds)
    assert report is not None, f"{name}: no LayerNorm or attention found"
    t1 = time.perf_counter()
    stress = stress_probe(model, feeds, report)
    t2 = time.perf_counter()
    ln = report.layernorms
    return {
        "model": name, "samples": len(feeds), "blocks": len(report.blocks),
        "layernorms": len(ln), "layernorm_kind": sorted({s.kind for s in ln}),
        "attention": len(report.attention),
        "min_residual_headroom": _min(s.input_headroom for s in ln),
        "min_variance_headroom": _min(s.variance_headroom for s in ln),
        "variance_limiting_node": min(ln, key=lambda s: s.variance_headroom).node if ln else None,
        "min_scores_headroom": _min(a.scores_headroom for a in report.attention),
        "fp16_stats_overflows": [s.node for s in ln if s.fp16_stats_overflow],
        "worst_fp16_stats_rel_l2": max((s.fp16_stats_rel_l2 for s in ln), default=None),
        "worst_fp32_stats_rel_l2": max((s.fp32_stats_rel_l2 for s in ln), default=None),
        "stress": stress.to_dict(), "seconds": {"analysis": round(t1 - t0, 1),
                                                "stress": round(t2 - t1, 1)},
        "transformer": report.to_dict(),
    }


def fmt(x, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return "inf"
    return f"{x:.{digits}g}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(CASES))
    ap.add_argument("--out", type=Path, default=results_path("transformers"))
    args = ap.parse_args()
    rows = []
    for name in args.models.split(","):
        row = run(name)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "transformer"}, default=str),
              flush=True)
    write_results(args.out, {"rows": rows})
    print("\n| model | blocks | LN (kind) | attn | min residual headroom | min variance headroom "
          "(FP16 stats) | min QK^T headroom | FP16-stats overflow | stress factor (node, kind, "
          "checked) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s = r["stress"]
        stress = (f"{fmt(s['factor'])} (`{s['node']}`, {s['kind']}, emulator inf: {s['verified']})"
                  if s["factor"] is not None else f"none up to {fmt(s['max_factor'])}")
        kinds = "/".join(r["layernorm_kind"])
        print(f"| {r['model']} | {r['blocks']} | {r['layernorms']} ({kinds}) "
              f"| {r['attention']} | {fmt(r['min_residual_headroom'])} | "
              f"{fmt(r['min_variance_headroom'])} | {fmt(r['min_scores_headroom'])} | "
              f"{len(r['fp16_stats_overflows'])} (worst rel L2 {fmt(r['worst_fp16_stats_rel_l2'])})"
              f" | {stress} |")


if __name__ == "__main__":
    main()
