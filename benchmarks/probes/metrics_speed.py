"""``compare.metrics.compute_metrics``: the one-pass version against the one it replaced.

Real outputs: PP-OCRv4 rec (``shared/models/ppocrv4/rec.onnx``) on the real text-line crops of
``shared/data/ocr/rec_crops/paddleocr`` (28 crops, ``ppocr-rec``), FP32 on ONNX Runtime CPU
against its FP16 emulation; the crops are repeated to ``--samples`` samples (default 256, the
size of ``gpu_pipeline.py``'s calib256 case: 256 x 1 x T x 6625 CTC scores), so the statistics
run at the size where they cost. Both versions run on the same arrays, side by side, 3 times
each (the first call pays page faults); the best time and the largest relative difference of
any statistic are printed. The version before is read from a worktree of commit aa5e532 (the
last one with whole-set concatenations), as ``diagnose_cost.py`` does:

    git worktree add /tmp/pd-before aa5e532
    PYTHONPATH=src python3 benchmarks/probes/metrics_speed.py --before /tmp/pd-before/src
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2] / "src"))

from precision_doctor.compare.metrics import compute_metrics  # noqa: E402

SHARED = HERE.parents[3] / "shared"


def compute_metrics_of(src: Path):
    """``compute_metrics`` of the tree ``src`` (its ``compare/metrics.py``, loaded apart)."""
    path = src / "precision_doctor" / "compare" / "metrics.py"
    spec = importlib.util.spec_from_file_location("metrics_before", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.compute_metrics


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
    parser.add_argument("--before", type=Path, required=True, help="src/ of the tree before")
    args = parser.parse_args()
    replaced = compute_metrics_of(args.before)
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
