"""Why ONNX Runtime CPU does not verify an FP16 model (``runners.verify``): it opens it, but
runs every FP16 node it has no kernel for in FP32 and drops the rounding of its outputs. On
PP-OCRv4 cls written all-FP16, its error against FP32 is a small fraction of what the exact
emulation of the same written model measures (which agrees with ONNX Runtime CUDA,
BENCHMARKS.md), and ``fix`` verifies with the emulation instead."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from precision_doctor.compare.metrics import relative_l2
from precision_doctor.formats import Precision
from precision_doctor.inputs.load import load_samples
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.precision.rewrites import apply_rewrites
from precision_doctor.precision.writer import write_mixed_precision
from precision_doctor.runners.emulator import WrittenEmulatorRunner
from precision_doctor.runners.kernels.registry import missing_kernels
from precision_doctor.runners.ort import OrtRunner
from precision_doctor.runners.verify import verifying_runner


def test_ort_cpu_runs_an_fp16_model_mostly_in_fp32(shared_dir):
    model = onnx.load(shared_dir / "models/ppocrv4/cls.onnx")
    written = write_mixed_precision(apply_rewrites(model)[0], PrecisionPlan(Precision.FP16))[0]
    with OrtRunner(model) as r:
        meta = r.input_metadata()
    feeds = [s.feeds for s in load_samples(shared_dir / "data/ocr/rec_crops/paddleocr", meta,
                                           "ppocr-cls", max_samples=4)]
    with OrtRunner(model) as r:
        reference = [r.run(f) for f in feeds]
    name = next(iter(reference[0]))
    missing = missing_kernels(written, precision=Precision.FP16)
    if missing is not None and not missing:  # a future ONNX Runtime CPU with FP16 kernels
        pytest.skip("this ONNX Runtime CPU has an FP16 kernel for every node of the model")
    cpu = ort.InferenceSession(written.SerializeToString(), providers=["CPUExecutionProvider"])
    on_cpu = [cpu.run([name], f)[0].astype(np.float32) for f in feeds]
    with WrittenEmulatorRunner(written) as r:
        emulated = [r.run(f)[name] for f in feeds]
    ref = [x[name] for x in reference]
    assert relative_l2(ref, on_cpu) < 0.1 * relative_l2(ref, emulated)  # 1.1e-6 vs 6.1e-5
    runner = verifying_runner(written)
    with runner:
        assert runner.name == "emulate-written-fp16"
