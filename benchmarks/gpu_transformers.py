"""GPU fidelity and speed on the real transformers: emulated vs ONNX Runtime CUDA.

Cases (assets packed by ``--pack`` on the CPU machine into ``.gpu/tr/``, git-ignored):

- ``whisper14``: Whisper tiny.en encoder at opset 14 (decomposed LayerNorm), 4 real clips;
- ``whisper17``: the same after precision-doctor's rewrites (``fuse-layernorm`` ->
  LayerNormalization with stash_type=1), i.e. what ``fix`` writes;
- ``rec``: PP-OCRv4 rec (SVTR, opset 12), 8 real crops.

For each: relative L2 of the output vs ONNX Runtime CPU FP32 for FP16 and BF16, emulated
(``EmulatorRunner`` on the effective plan the writer applied) and real (ONNX Runtime CUDA on the
strongly typed model written by precision-doctor), and per layer for FP16 (first sample: every
float activation of the original graph, median emulated/real ratio and the share within 2x,
tensors with real error > 1e-5). Speed: whisper at batch 8 (the 9 clips' first 8), median of 30
``session.run`` calls after 5 warm-up (host copies included), FP32 (use_tf32=0), TF32, naive
FP16 (whisper14 all-FP16), fixed FP16 (whisper14 after ``fix``'s rewrites, 0 FP32 nodes).

    python3 benchmarks/gpu_transformers.py --pack                 # here: writes .gpu/tr/
    PYTHONPATH=/tmp/site:$PWD/src python3 benchmarks/gpu_transformers.py --out $OUT   # there
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from precision_doctor.compare.metrics import relative_l2  # noqa: E402
from precision_doctor.formats import Precision  # noqa: E402
from precision_doctor.graph.load import load_model  # noqa: E402
from precision_doctor.graph.outputs import float_activations, mark_outputs  # noqa: E402
from precision_doctor.layerwise.candidates import run_samples  # noqa: E402
from precision_doctor.precision.plan import PrecisionPlan  # noqa: E402
from precision_doctor.precision.rewrites import apply_rewrites  # noqa: E402
from precision_doctor.precision.writer import write_mixed_precision  # noqa: E402
from precision_doctor.runners.emulator import EmulatorRunner  # noqa: E402
from precision_doctor.runners.ort import OrtRunner  # noqa: E402

PACK = REPO / ".gpu" / "tr"
# ../shared beside the checkout (a worktree under /work/wt has it two levels up)
SHARED = next((p for p in (REPO.parent / "shared", REPO.parents[1] / "shared") if p.is_dir()),
              REPO.parent / "shared")


class Sample:
    def __init__(self, name: str, feeds: dict) -> None:
        self.name, self.feeds = name, feeds


def pack() -> None:
    """Copy whisper op14 + 4 clips + 9-clip batch, rec + 8 preprocessed crops into .gpu/tr."""
    import shutil

    from precision_doctor.graph.load import input_metadata
    from precision_doctor.inputs import load_samples

    PACK.mkdir(parents=True, exist_ok=True)
    models = REPO / ".models"
    shutil.copy(models / "whisper_enc_op14.onnx", PACK / "whisper14.onnx")
    clips = [np.load(models / "whisper_data" / f"sample{i}.npz")["input_features"]
             for i in range(9)]
    np.savez(PACK / "whisper_feeds.npz", **{f"s{i}": c for i, c in enumerate(clips[:4])})
    np.savez(PACK / "whisper_b8.npz", input_features=np.concatenate(clips[:8]))
    rec = SHARED / "models" / "ppocrv4" / "rec.onnx"
    shutil.copy(rec, PACK / "rec.onnx")
    model = load_model(rec)
    samples = load_samples(str(SHARED / "data/ocr/rec_crops/*/*"),
                           input_metadata(model), "ppocr-rec")[:8]
    name = model.graph.input[0].name
    np.savez(PACK / "rec_feeds.npz", **{f"s{i}": s.feeds[name] for i, s in enumerate(samples)})
    print(f"packed {sum(p.stat().st_size for p in PACK.iterdir()) / 2**20:.1f} MiB in {PACK}")


def cases() -> list[tuple[str, object, list[Sample]]]:
    w = load_model(PACK / "whisper14.onnx")
    wf = np.load(PACK / "whisper_feeds.npz")
    ws = [Sample(k, {"input_features": wf[k]}) for k in sorted(wf.files)]
    w17, _ = apply_rewrites(w)
    r = load_model(PACK / "rec.onnx")
    rf = np.load(PACK / "rec_feeds.npz")
    rs = [Sample(k, {r.graph.input[0].name: rf[k]}) for k in sorted(rf.files)]
    return [("whisper14", w, ws), ("whisper17", w17, ws), ("rec", r, rs)]


def cuda(model, tf32: str = "0") -> OrtRunner:
    return OrtRunner(model, ("cuda", "cpu"), ({"use_tf32": tf32}, {}), name="ort-cuda")


def err(ref: dict, out: dict) -> float:
    return max(relative_l2(ref[k], out[k]) for k in ref)


def per_layer(model, written, plan, sample: Sample) -> dict:
    names = [s.name for s in float_activations(model)]
    with OrtRunner(mark_outputs(model, names)) as r:
        ref = r.run(sample.feeds, names)
    with cuda(mark_outputs(written, names)) as r:
        real = r.run(sample.feeds, names)
    with EmulatorRunner(mark_outputs(model, names), plan) as r:
        emu = r.run(sample.feeds, names)
    ratios = []
    for n in names:
        if n not in real or n not in emu:
            continue
        e_real = relative_l2(ref[n], np.asarray(real[n], np.float32))
        e_emu = relative_l2(ref[n], np.asarray(emu[n], np.float32))
        if np.isfinite(e_real) and np.isfinite(e_emu) and e_real > 1e-5:
            ratios.append(e_emu / e_real)
    within = sum(1 for x in ratios if 0.5 <= x <= 2.0)
    return {"tensors": len(ratios), "median_ratio": statistics.median(ratios) if ratios else None,
            "within_2x": within / len(ratios) if ratios else None}


def fidelity(name: str, model, samples: list[Sample]) -> dict:
    outs = [o.name for o in model.graph.output]
    ref = run_samples(OrtRunner(model), samples, outs)
    row: dict = {"model": name, "samples": len(samples),
                 "fp32_real": err(ref, run_samples(cuda(model), samples, outs)),
                 "tf32_real": err(ref, run_samples(cuda(model, "1"), samples, outs))}
    for p in (Precision.FP16, Precision.BF16):
        written, report = write_mixed_precision(model, PrecisionPlan(p))
        plan = report.effective_plan()
        row[f"{p.value}_emulate"] = err(ref, run_samples(EmulatorRunner(model, plan), samples,
                                                         outs))
        try:
            row[f"{p.value}_real"] = err(ref, run_samples(cuda(written), samples, outs))
        except Exception as exc:  # noqa: BLE001 - e.g. a kernel ORT CUDA lacks in BF16
            row[f"{p.value}_real"] = None
            row[f"{p.value}_error"] = str(exc).splitlines()[0][:300]
        if p is Precision.FP16:
            row["fp16_layers"] = per_layer(model, written, plan, samples[0])
    return row


def latency_ms(model, feeds: dict, tf32: str = "0", runs: int = 30) -> float:
    import onnxruntime as ort

    so = ort.SessionOptions()
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=[
        ("CUDAExecutionProvider", {"use_tf32": tf32}), "CPUExecutionProvider"])
    for _ in range(5):
        sess.run(None, feeds)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def speed() -> dict:
    w = load_model(PACK / "whisper14.onnx")
    feeds = {"input_features": np.load(PACK / "whisper_b8.npz")["input_features"]}
    fixed_src, _ = apply_rewrites(w)
    naive, _ = write_mixed_precision(w, PrecisionPlan(Precision.FP16))
    fixed, _ = write_mixed_precision(fixed_src, PrecisionPlan(Precision.FP16))
    out = {"batch": int(feeds["input_features"].shape[0]),
           "fp32_ms": latency_ms(w, feeds), "tf32_ms": latency_ms(w, feeds, "1"),
           "fp16_naive_ms": latency_ms(naive, feeds), "fp16_fixed_ms": latency_ms(fixed, feeds)}
    out["fixed_vs_fp16_throughput"] = out["fp16_naive_ms"] / out["fp16_fixed_ms"]
    out["fixed_vs_fp32_speedup"] = out["fp32_ms"] / out["fp16_fixed_ms"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pack", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    if args.pack:
        pack()
        return
    import onnxruntime

    onnxruntime.preload_dlls()
    result: dict = {"onnxruntime": onnxruntime.__version__,
                    "providers": onnxruntime.get_available_providers(), "fidelity": []}
    for name, model, samples in cases():
        row = fidelity(name, model, samples)
        result["fidelity"].append(row)
        print(json.dumps(row), flush=True)
    result["speed"] = speed()
    print(json.dumps(result["speed"]), flush=True)
    (args.out / "gpu_transformers.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
