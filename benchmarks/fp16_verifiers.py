"""What ONNX Runtime CPU measures on an FP16 model ``fix`` writes, against the exact emulation
of the same written model (``runners.verify``: why ONNX Runtime CPU no longer verifies FP16).

For each model: BatchNorm folded and LayerNorm fused (``apply_rewrites``), written all-FP16
(``write_mixed_precision``), then the relative L2 error against the FP32 model (ONNX Runtime CPU)
of (a) ONNX Runtime CPU running the written model, (b) its exact emulation
(``WrittenEmulatorRunner``), (c) the plan's emulation (``EmulatorRunner``), on real inputs;
and the FP16 nodes ONNX Runtime CPU has no FP16 kernel for (``missing_kernels``).

    PYTHONPATH=src python benchmarks/fp16_verifiers.py [--samples 2]

Models and inputs: PP-OCRv4 det (full images at 640x640), rec and cls (text crops) from
``../shared``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import onnx

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "src"))
SHARED = Path(os.environ.get("PRECISION_DOCTOR_SHARED") or HERE.parent / "shared")

from precision_doctor.compare.metrics import relative_l2  # noqa: E402
from precision_doctor.formats import Precision  # noqa: E402
from precision_doctor.inputs.load import load_samples  # noqa: E402
from precision_doctor.precision.plan import PrecisionPlan  # noqa: E402
from precision_doctor.precision.rewrites import apply_rewrites  # noqa: E402
from precision_doctor.precision.writer import write_mixed_precision  # noqa: E402
from precision_doctor.runners.emulator import EmulatorRunner, WrittenEmulatorRunner  # noqa: E402
from precision_doctor.runners.kernels.registry import (  # noqa: E402
    describe_missing,
    missing_kernels,
)
from precision_doctor.runners.ort import OrtRunner  # noqa: E402

CASES = {"det": ("full_images", "ppocr-det:resize=fixed,size=640x640"),
         "rec": ("rec_crops/paddleocr", "ppocr-rec"),
         "cls": ("rec_crops/paddleocr", "ppocr-cls")}


def measure(name: str, samples: int) -> dict:
    data, preprocess = CASES[name]
    model = onnx.load(SHARED / f"models/ppocrv4/{name}.onnx")
    rewritten = apply_rewrites(model)[0]
    written = write_mixed_precision(rewritten, PrecisionPlan(Precision.FP16))[0]
    with OrtRunner(model) as r:
        meta = r.input_metadata()
    feeds = [s.feeds for s in load_samples(SHARED / "data/ocr" / data, meta, preprocess,
                                           max_samples=samples)]
    runners = {"ort-cpu (written model)": OrtRunner(written, ("cpu",)),
               "emulate-written": WrittenEmulatorRunner(written),
               "emulate (plan)": EmulatorRunner(rewritten, PrecisionPlan(Precision.FP16))}
    with OrtRunner(model) as r:
        reference = [r.run(f) for f in feeds]
    out_name = next(iter(reference[0]))
    row: dict = {"samples": len(feeds)}
    for label, runner in runners.items():
        with runner:
            got = [np.asarray(runner.run(f)[out_name], np.float32) for f in feeds]
        row[label] = relative_l2([x[out_name] for x in reference], got)
    missing = missing_kernels(written, precision=Precision.FP16)
    row["no_fp16_kernel_on_cpu"] = describe_missing(missing) if missing is not None else None
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results = {}
    for name in CASES:
        results[name] = row = measure(name, args.samples)
        print(f"{name}: ort-cpu {row['ort-cpu (written model)']:.3g}  emulate-written "
              f"{row['emulate-written']:.3g}  emulate (plan) {row['emulate (plan)']:.3g}  "
              f"({row['samples']} samples; no FP16 CPU kernel: {row['no_fp16_kernel_on_cpu']})",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
