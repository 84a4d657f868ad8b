"""``compare.metrics.compute_metrics``: the one-pass version against the one it replaced.

Real outputs: PP-OCRv4 rec (``shared/models/ppocrv4/rec.onnx``) on the real text-line crops of
``shared/data/ocr/rec_crops/paddleocr`` (28 crops, ``ppocr-rec``), FP32 on ONNX Runtime CPU
against its FP16 emulation; the crops are repeated to ``--samples`` samples (default 256, the
size of ``gpu_pipeline.py``'s calib256 case: 256 x 1 x T x 6625 CTC scores), so the statistics
run at the size where they cost. Both versions run on the same arrays, side by side, 3 times
each (the first call pays page faults); the best time and the largest relative difference of
any statistic are printed.

    PYTHONPATH=src python3 benchmarks/metrics_speed.py [--samples 256]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1] / "src"))

from precision_doctor.compare.metrics import (  # noqa: E402
    OutputMetrics,
    _argmax_applicable,
    compute_metrics,
    l2_ratio,
)

SHARED = HERE.parents[2] / "shared"


def replaced(reference, candidate) -> OutputMetrics:
    """``compute_metrics`` as it was before 2026-11-26 (whole-set float64 concatenations)."""
    r = np.concatenate([np.asarray(a, np.float64).ravel() for a in reference])
    c = np.concatenate([np.asarray(a, np.float64).ravel() for a in candidate])
    ref_nonfinite = int((~np.isfinite(r)).sum())
    nan, inf = int(np.isnan(c).sum()), int(np.isinf(c).sum())
    ok = np.isfinite(r) & np.isfinite(c)
    rf, cf = r[ok], c[ok]
    e = np.abs(cf - rf)
    ref_norm2 = float(np.dot(rf, rf))
    err_norm2 = float(np.dot(cf - rf, cf - rf))
    rel_l2 = l2_ratio(err_norm2, ref_norm2, nan + inf)
    cand_norm2 = float(np.dot(cf, cf))
    cosine = (float(np.dot(cf, rf)) / math.sqrt(cand_norm2 * ref_norm2)
              if cand_norm2 > 0 and ref_norm2 > 0 else float(cand_norm2 == ref_norm2))
    snr = math.inf if err_norm2 == 0 else (10 * math.log10(ref_norm2 / err_norm2)
                                            if ref_norm2 > 0 else -math.inf)
    agreement = None
    if reference and _argmax_applicable(reference[0].shape):
        agree = total = 0
        for ra, ca in zip(reference, candidate):
            a, b = np.argmax(ra, axis=-1), np.argmax(ca, axis=-1)
            agree += int((a == b).sum())
            total += a.size
        agreement = agree / total if total else None
    has = e.size > 0
    return OutputMetrics(
        numel=int(r.size), max_abs=float(e.max()) if has else 0.0,
        mean_abs=float(e.mean()) if has else 0.0,
        median_abs=float(np.median(e)) if has else 0.0,
        p99_abs=float(np.quantile(e, 0.99)) if has else 0.0,
        rel_l2=rel_l2, cosine=cosine, snr_db=snr,
        ref_max_abs=float(np.abs(rf).max()) if rf.size else 0.0,
        nan=nan, inf=inf, ref_nonfinite=ref_nonfinite, argmax_agreement=agreement)


def outputs(samples: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    from precision_doctor.formats import Precision
    from precision_doctor.graph import input_metadata, load_model
    from precision_doctor.inputs import load_samples
    from precision_doctor.precision.plan import PrecisionPlan
    from precision_doctor.runners.emulator import EmulatorRunner
    from precision_doctor.runners.ort import OrtRunner

    model = load_model(SHARED / "models/ppocrv4/rec.onnx")
    crops = load_samples(SHARED / "data/ocr/rec_crops/paddleocr", input_metadata(model),
                         preprocess="ppocr-rec")
    ref, cand = [], []
    with OrtRunner(model) as fp32, EmulatorRunner(model, PrecisionPlan(Precision.FP16)) as fp16:
        for s in crops:
            ref.append(next(iter(fp32.run(s.feeds).values())))
            cand.append(next(iter(fp16.run(s.feeds).values())))
    reps = -(-samples // len(ref))
    return (ref * reps)[:samples], (cand * reps)[:samples]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=256)
    args = parser.parse_args()
    ref, cand = outputs(args.samples)
    numel = sum(r.size for r in ref)
    print(f"{len(ref)} samples, {numel:,} elements ({ref[0].shape} ...)")
    times, results = {}, {}
    for name, fn in (("replaced", replaced), ("one-pass", compute_metrics)):
        best = math.inf
        for _ in range(3):
            t = time.perf_counter()
            results[name] = fn(ref, cand)
            best = min(best, time.perf_counter() - t)
        times[name] = best
        print(f"{name:9s} {best:6.2f} s")
    a, b = results["replaced"].to_dict(), results["one-pass"].to_dict()
    diff = max((abs(a[k] - b[k]) / max(abs(a[k]), 1e-300) for k in a
                if isinstance(a[k], float) and a[k] != b[k]), default=0.0)
    print(f"speedup {times['replaced'] / times['one-pass']:.2f}x, "
          f"largest relative difference of a statistic {diff:.1e}")


if __name__ == "__main__":
    main()
