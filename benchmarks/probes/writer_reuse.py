"""What ``PlanWriter`` (``precision.writer``) saves when one model is written under many plans,
as ``fix``'s search does with a real engine (``--runner``: one written model per evaluation).

1. PP-OCRv4 det and rec: ``--plans`` FP16 plans, each with 5% of the nodes drawn at random in
   FP32 (seeded), written without validation as the search writes them: by
   ``write_mixed_precision`` each on its own, and by one ``PlanWriter``; milliseconds per write
   (median) and whether every written model is the same bytes.
2. ``--fix``: ``fix`` on det (its 3 images at max side 640, ``db-boxes`` threshold 1.0, the search
   run on ONNX Runtime CPU: ``tests/acceptance/test_fix_real_models.py``'s case) with the
   writer shared and not shared (every plan written on its own), alternating ``--repeat``
   times: wall seconds, search seconds, evaluations and the FP32 nodes kept.

Usage (repo root, ``../shared`` present)::

    python -m benchmarks run probes/writer_reuse [--plans 20] [--fix] [--repeat 2] [--save]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "src"), str(REPO / "benchmarks")]

import numpy as np  # noqa: E402
from common import save_probe  # noqa: E402

from precision_doctor.formats import Precision  # noqa: E402
from precision_doctor.graph.load import input_metadata, load_model  # noqa: E402
from precision_doctor.precision.plan import PrecisionPlan  # noqa: E402
from precision_doctor.precision.writer import PlanWriter, write_mixed_precision  # noqa: E402

SHARED = REPO.parent / "shared"


class _OnItsOwn:
    """``PlanWriter``'s interface, every plan written by ``write_mixed_precision`` alone."""

    def __init__(self, model) -> None:
        self.model = model

    def __call__(self, plan, keep_io_types=True, validate=True):
        return write_mixed_precision(self.model, plan, keep_io_types, validate)


def writes(name: str, plans: int) -> dict:
    model = load_model(SHARED / "models/ppocrv4" / f"{name}.onnx")
    nodes = [n.name for n in model.graph.node]
    rng = np.random.default_rng(0)
    chosen = [PrecisionPlan(Precision.FP16).keep_fp32(
        rng.choice(nodes, size=len(nodes) // 20, replace=False).tolist(), "probe")
        for _ in range(plans)]
    write_mixed_precision(model, chosen[0], validate=False)  # imports and first-use costs
    alone, shared, same = [], [], True
    writer = PlanWriter(model)
    for plan in chosen:
        t = time.perf_counter()
        a = write_mixed_precision(model, plan, validate=False)[0]
        alone.append(time.perf_counter() - t)
        t = time.perf_counter()
        b = writer(plan, validate=False)[0]
        shared.append(time.perf_counter() - t)
        same = same and a.SerializeToString() == b.SerializeToString()
    return {"model": name, "plans": plans, "alone_ms": 1e3 * statistics.median(alone),
            "shared_ms": 1e3 * statistics.median(shared),
            "first_shared_ms": 1e3 * shared[0], "same_bytes": same}


def fix_det(share: bool) -> dict:
    from precision_doctor.compare.tasks.registry import get_metric
    from precision_doctor.inputs import load_samples
    from precision_doctor.repair import stages
    from precision_doctor.repair.pipeline import fix
    from precision_doctor.runners.ort import OrtRunner
    from precision_doctor.search.objective import Objective

    model = load_model(SHARED / "models/ppocrv4/det.onnx")
    samples = load_samples(SHARED / "data/ocr/full_images", input_metadata(model),
                           "ppocr-det:resize=max-side,side=640")
    stages.PlanWriter = PlanWriter if share else _OnItsOwn  # type: ignore[misc]
    try:
        t = time.perf_counter()
        result = fix(model, samples, Precision.FP16,
                     Objective(metric=get_metric("db-boxes"), threshold=1.0),
                     runner=lambda m: OrtRunner(m, ("cpu",), name="ort-cpu"))
        wall = time.perf_counter() - t
    finally:
        stages.PlanWriter = PlanWriter  # type: ignore[misc]
    return {"shared": share, "wall_s": wall, "search_s": result.seconds["search"],
            "evaluations": result.search.evaluations, "kept": list(result.search.kept)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", type=int, default=20)
    ap.add_argument("--fix", action="store_true")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--save", action="store_true",
                    help="also write benchmarks/results/NAME_<date>_<machine>.json")
    args = ap.parse_args(argv)
    out: dict = {"writes": [writes(name, args.plans) for name in ("det", "rec")]}
    if args.fix:
        out["fix_det"] = [fix_det(share) for _ in range(args.repeat) for share in (False, True)]
    print(json.dumps(out, indent=1))
    if args.save:
        save_probe("writer_reuse", argv, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
