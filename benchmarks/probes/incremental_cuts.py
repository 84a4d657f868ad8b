"""What cutting a graph into the search's segments alone changes (``search.incremental``'s
``cut_error``, against its ``CUT_ERROR``), and what the shared CPU arena saves a plain run.

1. Per model, the all-FP32 plan on every sample (as ``incremental_scope`` checks it): the
   segment runs against one whole-model emulation, relative L2 of the worst output and sample
   (0 = the same bits), after ``fix``'s rewrites, and the seconds the check takes (its
   sessions as ``fix``'s search opens them).
   Models: PP-OCRv4 det and rec (``../shared``), the Whisper encoder (``.models/``,
   ``benchmarks/export_whisper.py``), MiniLM quantized by ``quantize_dynamic``
   (``.models/quantized/minilm17.onnx``, ``benchmarks/quantize_zoo.py``); absent ones skipped.
2. det's 3 images run by ``OrtRunner`` with its defaults (no CPU arena) and inside
   ``runners.sessions.cpu_arena.shared_cpu()`` (what ``layerwise.candidates.run_samples`` does),
   after one warm-up run each.

Usage (repo root)::

    python -m benchmarks run probes/incremental_cuts
"""

from __future__ import annotations

import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from precision_doctor.formats import Precision  # noqa: E402
from precision_doctor.graph.load import input_metadata, load_model  # noqa: E402
from precision_doctor.inputs import load_samples  # noqa: E402
from precision_doctor.inputs.feeds import Sample  # noqa: E402
from precision_doctor.precision.rewrites import apply_rewrites  # noqa: E402
from precision_doctor.runners.ort import OrtRunner  # noqa: E402
from precision_doctor.runners.sessions.cpu_arena import shared_cpu  # noqa: E402
from precision_doctor.search.incremental import CUT_ERROR, IncrementalEmulation  # noqa: E402

SHARED = REPO.parent / "shared"
MODELS = REPO / ".models"


def cases():
    det = SHARED / "models/ppocrv4/det.onnx"
    yield "det", det, SHARED / "data/ocr/full_images", "ppocr-det"
    yield "rec", SHARED / "models/ppocrv4/rec.onnx", SHARED / "data/ocr/rec_crops/*/*", "ppocr-rec"
    yield "whisper", MODELS / "whisper_enc_op14.onnx", MODELS / "whisper_data", None
    yield "minilm17-quantized", MODELS / "quantized/minilm17.onnx", \
        MODELS / "minilm_data/batch0.npz", None


def all_samples(model, data: Path, preprocess: str | None) -> list[Sample]:
    if data.suffix == ".npz":
        with np.load(data) as z:
            return [Sample(data.name, {k: z[k] for k in z.files})]
    return load_samples(str(data), input_metadata(model), preprocess)


def main() -> None:
    for name, path, data, preprocess in cases():
        if not path.exists():
            print(f"{name}: {path} absent, skipped")
            continue
        model = apply_rewrites(load_model(path))[0]
        samples = all_samples(model, data, preprocess)
        # as ``fix``'s search: inside ``shared_cpu()``, segment sessions on the CPU arena
        with shared_cpu(), IncrementalEmulation(model, Precision.FP16, samples,
                                                cpu_mem_arena=True) as inc:
            t0 = time.perf_counter()
            error = inc.cut_error()
            seconds = time.perf_counter() - t0
        print(f"{name}: cut error {error:.3g} over {len(samples)} sample(s) in {seconds:.2f} s "
              f"({len(inc.segments)} segments; {'within' if error <= CUT_ERROR else 'over'} "
              f"{CUT_ERROR:g})")
    model = load_model(SHARED / "models/ppocrv4/det.onnx")
    samples = load_samples(str(SHARED / "data/ocr/full_images"), input_metadata(model),
                           "ppocr-det")
    for label, scope in (("default, no arena", nullcontext), ("shared_cpu()", shared_cpu)):
        with scope(), OrtRunner(model) as runner:
            runner.run(samples[0].feeds)
            t0 = time.perf_counter()
            for s in samples:
                runner.run(s.feeds)
            print(f"det, 3 images, OrtRunner {label}: {time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
