"""What the compiled layerwise statistics (``layerwise.fused``) cost and save against numpy.

1. In fresh subprocesses: numba's first compile of the kernel (an empty ``NUMBA_CACHE_DIR``),
   then its load from that cache (import and machine code), each with the process's peak RSS
   before and after (the package and ONNX Runtime already imported).
2. In this process: ``_Accumulator.add`` with the numpy path and with the kernel, in ns per
   (reference, candidate) element pair, on ReLU-like float32 tensors (half exact zeros) of
   128 Ki and 2 Mi elements, and on a 100-element tensor (the fixed cost per tensor, in us);
   best of ``--repeat``.

Usage (repo root)::

    python -m benchmarks run probes/stats_kernel [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

import numpy as np  # noqa: E402

from precision_doctor.graph.outputs import TensorSite  # noqa: E402
from precision_doctor.layerwise import fused  # noqa: E402
from precision_doctor.layerwise.stats import _Accumulator  # noqa: E402

CHILD = r"""
import json, resource, time
import onnxruntime, precision_doctor.api
from precision_doctor.layerwise import fused
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t = time.perf_counter()
assert fused.kernel() is not None
print(json.dumps({"seconds": time.perf_counter() - t, "rss_before_mb": before,
                  "rss_after_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def load_cost() -> dict:
    out = {}
    with tempfile.TemporaryDirectory(prefix="pd-numba-cache-") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache, "PYTHONPATH": str(REPO / "src")}
        for label in ("first_compile", "cached_load"):
            run = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                                 text=True, check=True)
            out[label] = json.loads(run.stdout.strip().splitlines()[-1])
    return out


def fold_speed(repeat: int) -> dict:
    rng = np.random.default_rng(0)
    site = TensorSite("t", "n", "Op", 0, None)
    out: dict = {}
    for n in (100, 1 << 17, 1 << 21):
        r = np.maximum(rng.standard_normal(n).astype(np.float32), 0)
        c = (r * (1 + 1e-3 * rng.standard_normal(n))).astype(np.float32)
        loops = max(3, (1 << 22) // n) if n > 100 else 20000
        for compiled in (False, True):
            acc, best = _Accumulator(site), float("inf")
            for _ in range(repeat):
                t = time.perf_counter()
                for _ in range(loops):
                    acc.add(r, c, 65504.0, 2.0 ** -24, 2.0 ** -14, None, compiled)
                best = min(best, (time.perf_counter() - t) / loops)
            key = f"{n}_{'kernel' if compiled else 'numpy'}"
            out[key] = round(best * 1e6, 2) if n == 100 else round(best / n * 1e9, 3)
    return {"us_per_tensor_of_100": {k: v for k, v in out.items() if k.startswith("100_")},
            "ns_per_pair": {k: v for k, v in out.items() if not k.startswith("100_")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    result = {"load": load_cost()}
    fused.kernel()
    result.update(fold_speed(args.repeat))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
