"""Peak memory of the search's incremental evaluation (``search.incremental``) on PP-OCRv4 det:
kept states and idle sessions per segment, with and without the search's shared CPU arena.

One configuration per process (peak RSS is the process's): 14 plans, every other one 5
consecutive convolutions in FP32 at a seeded place, the 3 images of ``full_images`` at
``ppocr-det``'s size. Prints the peak RSS, the kept states' bytes and the counts.

Usage (repo root, ``../shared`` present)::

    for cfg in "256 1 1" "1024 2 1" "0 2 1" "0 2 0" "256 1 0"; do
        python benchmarks/probes/incremental_memory.py $cfg; done   # MiB, idle sessions, arena
"""

from __future__ import annotations

import contextlib
import random
import resource
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from precision_doctor.formats import Precision  # noqa: E402
from precision_doctor.graph.load import input_metadata, load_model  # noqa: E402
from precision_doctor.inputs import load_samples  # noqa: E402
from precision_doctor.precision.plan import PrecisionPlan  # noqa: E402
from precision_doctor.runners.sessions.cpu_arena import shared_cpu  # noqa: E402
from precision_doctor.search import incremental as inc  # noqa: E402

SHARED = REPO.parent / "shared"


def main() -> None:
    cache, idle, arena = int(sys.argv[1]) << 20, int(sys.argv[2]), sys.argv[3] == "1"
    inc.SESSIONS_PER_SEGMENT = idle
    model = load_model(SHARED / "models/ppocrv4/det.onnx")
    samples = load_samples(SHARED / "data/ocr/full_images", input_metadata(model), "ppocr-det")
    convs = [n.name for n in model.graph.node if n.op_type == "Conv"]
    rng = random.Random(0)
    with shared_cpu() if arena else contextlib.nullcontext(), inc.IncrementalEmulation(
            model, Precision.FP16, samples, cache_bytes=cache, cpu_mem_arena=arena) as e:
        kept: list[str] = []
        for t in range(14):
            k = rng.randrange(len(convs))
            kept = convs[k:k + 5] if t % 2 else kept
            with e.runner(PrecisionPlan(Precision.FP16).keep_fp32(kept, "probe")) as r:
                for i, s in enumerate(samples):
                    r.run_sample(i, s.feeds)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10
        print(f"states {sys.argv[1]} MiB, {idle} idle sessions, shared arena {arena}: peak "
              f"{peak} MB, states {e._state_bytes >> 20} MiB, {e.counts}")


if __name__ == "__main__":
    main()
