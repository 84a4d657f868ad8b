"""Latency and throughput of FP32 / TF32 / FP16 / mixed models on ONNX Runtime CUDA.

Variants per model (all measured side by side in one run, same inputs):
  fp32  : the original model, CUDA EP use_tf32=0
  tf32  : the original model, CUDA EP use_tf32=1
  fp16  : precision-doctor's strongly typed all-FP16 model of the rewritten model
  mixed : the same with the plan found by `precision-doctor fix` (``--plans DIR`` holds
          ``<model>.plan.json`` files; without one, mixed = a plan keeping every
          LayerNormalization/Softmax in FP32, the classic safe mix)
Batch 1 and batch 8 (inputs repeated along the batch axis). Median of ``--iters`` runs after
``--warmup`` runs; session.run with numpy inputs (host<->device copies included).
Target: mixed keeps >= 95% of the pure-FP16 throughput wherever FP16 beats FP32.

Setup as in benchmarks/gpu_fidelity.py; run:
    PYTHONPATH=/tmp/site:$PWD/src python benchmarks/speed.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import default_assets, load_cases  # noqa: E402

from precision_doctor.formats import Precision  # noqa: E402
from precision_doctor.precision.plan import PrecisionPlan  # noqa: E402
from precision_doctor.precision.rewrites import apply_rewrites  # noqa: E402
from precision_doctor.precision.writer import write_mixed_precision  # noqa: E402
from precision_doctor.runners.ort import OrtRunner  # noqa: E402


def batch_of(feeds: dict, n: int) -> dict:
    return {k: np.concatenate([v] * n, axis=0) if v.ndim else v for k, v in feeds.items()}


def time_runner(runner: OrtRunner, feeds: dict, warmup: int, iters: int) -> float:
    with runner:
        for _ in range(warmup):
            runner.run(feeds)
        times = []
        for _ in range(iters):
            t = time.perf_counter()
            runner.run(feeds)
            times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


def mixed_plan(model, plans_dir: Path | None, name: str) -> PrecisionPlan:
    path = plans_dir / f"{name}.plan.json" if plans_dir else None
    if path and path.is_file():
        plan = PrecisionPlan.load(path)
        names = {n.name for n in model.graph.node}
        return PrecisionPlan(plan.default, {k: v for k, v in plan.overrides.items()
                                            if k in names})
    keep = [n.name for n in model.graph.node
            if n.op_type in ("LayerNormalization", "Softmax", "ReduceMean", "Pow")]
    return PrecisionPlan(Precision.FP16).keep_fp32(keep, "speed-benchmark")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--assets", type=Path, default=default_assets())
    ap.add_argument("--models", default="det,rec,minilm17")
    ap.add_argument("--plans", type=Path, default=None)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--provider", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    if args.provider == "cuda":
        import onnxruntime

        onnxruntime.preload_dlls()
    prov = ["cuda", "cpu"] if args.provider == "cuda" else ["cpu"]
    opts = (lambda t: [{"use_tf32": t}, {}]) if args.provider == "cuda" else (lambda t: None)
    rows = []
    for case in load_cases(args.assets, args.models.split(","), max_images=1):
        rewritten, _ = apply_rewrites(case.model)
        fp16, _ = write_mixed_precision(rewritten, PrecisionPlan(Precision.FP16))
        plan = mixed_plan(rewritten, args.plans, case.name)
        mixed, _ = write_mixed_precision(rewritten, plan)
        variants = {"fp32": (case.model, "0"), "tf32": (case.model, "1"), "fp16": (fp16, "0"),
                    "mixed": (mixed, "0")}
        for b in map(int, args.batches.split(",")):
            feeds = batch_of(case.samples[0].feeds, b)
            row = {"model": case.name, "batch": b,
                   "mixed_fp32_nodes": len(plan.fp32_nodes())}
            for v, (m, tf32) in variants.items():
                runner = OrtRunner(m, prov, opts(tf32), cpu_mem_arena=True)
                row[f"{v}_ms"] = time_runner(runner, feeds, args.warmup, args.iters)
            row["fp16_speedup"] = row["fp32_ms"] / row["fp16_ms"]
            row["mixed_vs_fp16_throughput"] = row["fp16_ms"] / row["mixed_ms"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "speed.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
