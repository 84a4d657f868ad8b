"""What one emulated evaluation of PP-OCRv4 det costs against a plain run, and where it goes.

On det's 3 full images (``ppocr-det``), in one process, after a warm-up of each:

1. a plain FP32 run of the 3 images (ONNX Runtime session with its default CPU arena);
2. the all-FP16 plan's emulation (``precision.emulate.emulate``): the Python build, the session
   open and the run of the 3 images (CPU arena on, as in ``fix``'s search);
3. ONNX Runtime's own profile of both runs: kernel time per op type (the Casts the emulation
   adds, their count per sample).

``--fix`` also times ``fix`` on det with and without building the next plan's runner ahead
(``repair.stages`` prefetch; about 100 s each).

Usage (repo root, ``../shared`` present)::

    python -m benchmarks run probes/emulation_cost [--fix]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

import onnxruntime as ort  # noqa: E402

from precision_doctor.formats import Precision  # noqa: E402
from precision_doctor.graph.load import input_metadata, load_model  # noqa: E402
from precision_doctor.inputs import load_samples  # noqa: E402
from precision_doctor.precision.emulate import emulate  # noqa: E402
from precision_doctor.precision.plan import PrecisionPlan  # noqa: E402

SHARED = REPO.parent / "shared"
DET = SHARED / "models/ppocrv4/det.onnx"
IMAGES = SHARED / "data/ocr/full_images"


def _session(blob: bytes, profile: str | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = profile
    return ort.InferenceSession(blob, options, providers=["CPUExecutionProvider"])


def _kernel_ms(blob: bytes, samples, folder: str) -> tuple[float, dict[str, float], int]:
    """(kernel ms, ms per op type, Cast kernels) of one profiled run of every sample."""
    session = _session(blob, os.path.join(folder, "p"))
    for s in samples:
        session.run(None, s.feeds)
    events = json.loads(Path(session.end_profiling()).read_text())
    per: collections.Counter = collections.Counter()
    casts = 0
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per[e["args"]["op_name"]] += e["dur"] / 1e3
            casts += e["args"]["op_name"] == "Cast"
    return sum(per.values()), dict(per.most_common(5)), casts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fix", action="store_true")
    args = ap.parse_args(argv)
    model = load_model(DET)
    samples = load_samples(str(IMAGES), input_metadata(model), "ppocr-det")
    plain = model.SerializeToString()
    emulate(model, PrecisionPlan(Precision.FP16))  # warm-up
    builds = []
    for _ in range(5):
        t = time.perf_counter()
        emulated, info = emulate(model, PrecisionPlan(Precision.FP16))
        builds.append(time.perf_counter() - t)
    build = sorted(builds)[2]
    blob = emulated.SerializeToString()
    for name, b in (("plain", plain), ("emulated", blob)):
        t = time.perf_counter()
        session = _session(b)
        opened = time.perf_counter() - t
        runs = []
        for _ in range(2):
            t = time.perf_counter()
            for s in samples:
                session.run(None, s.feeds)
            runs.append(time.perf_counter() - t)
        print(f"{name}: session opened in {opened:.2f} s, 3 images run in "
              f"{runs[0]:.2f} / {runs[1]:.2f} s")
    print(f"emulation build (Python, median of 5): {build * 1e3:.0f} ms, "
          f"{info.rounded_activations} rounded activations")
    with tempfile.TemporaryDirectory() as folder:
        for name, b in (("plain", plain), ("emulated", blob)):
            total, top, casts = _kernel_ms(b, samples, folder)
            top_ms = json.dumps({k: round(v) for k, v in top.items()})
            print(f"{name} kernels: {total:.0f} ms; top {top_ms}; "
                  f"{casts // len(samples)} Casts per sample")
    if args.fix:
        import precision_doctor as pd
        from precision_doctor.repair import stages

        ahead = stages.small_in_memory
        for prefetch in (True, False, True, False):
            stages.small_in_memory = ahead if prefetch else (lambda m: False)
            f = pd.fix(str(DET), str(IMAGES), preprocess="ppocr-det", quiet=True)
            print(f"fix det, next runner built ahead {prefetch}: search "
                  f"{f.report['seconds']['search']:.1f} s, {f.report['search']['evaluations']} "
                  f"evaluations, kept {f.report['search']['kept']}")
        stages.small_in_memory = ahead
    return 0


if __name__ == "__main__":
    sys.exit(main())
