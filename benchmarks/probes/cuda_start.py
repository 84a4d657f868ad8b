"""Where a fresh process's first seconds on ONNX Runtime CUDA go.

One fresh process per measurement set, on the real PP-OCRv4 det model and its 3 real images at
640x640 (the ``det`` case of ``benchmarks/gpu_pipeline.py``). Times, in order, in one process:

* ``import``: ``import onnxruntime``;
* ``preload``: ``onnxruntime.preload_dlls()`` (loads CUDA/cuDNN/cuBLAS from the nvidia wheels);
* ``probe``: the one-node Identity session ``runners.device`` opens to confirm CUDA;
* per session (FP32 model, the FP16 emulation model with the default CPU threads and with one,
  the switched FP16 emulation (``precision.emulate_switch``), the FP32 model again): create,
  first run (cuDNN/cuBLAS handles, algorithm choice, arena growth), second and third run;
* the same on the CPU execution provider (all cores).

Also the device memory in use after each step (NVML), and with ``--variants`` the CUDA
options that bound memory (``cudnn_conv_use_max_workspace=0``, ``gpu_mem_limit``).

There (GPU machine, after ``benchmarks/gpu_setup.sh``; ``.gpu/pipe`` copied to ``/tmp/pipe``)::

    export PYTHONPATH=/tmp/site:$PWD/src
    python3 benchmarks/probes/cuda_start.py --assets /tmp/pipe --out $OUT/cuda_start.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
VARIANTS = {
    "default": {},  # runners.device.CUDA_SESSION_OPTIONS
    "no-max-workspace": {"cudnn_conv_use_max_workspace": "0"},
    "mem-limit-2g": {"gpu_mem_limit": str(2 << 30)},
}


def _used() -> float | None:
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return pynvml.nvmlDeviceGetMemoryInfo(h).used / 2**20
    except Exception:  # noqa: BLE001 - no GPU
        return None


def one(assets: Path, variant: str) -> dict:
    """All timings of one fresh process (this one)."""
    out: dict = {"variant": variant, "mib_before": _used()}
    t = time.perf_counter()
    import onnxruntime as ort
    out["import_s"] = time.perf_counter() - t
    t = time.perf_counter()
    ort.preload_dlls()
    out["preload_s"] = time.perf_counter() - t
    sys.path.insert(0, str(HERE.parents[2] / "src"))
    from precision_doctor.formats import Precision
    from precision_doctor.graph.load import load_model
    from precision_doctor.inputs import load as inputs
    from precision_doctor.precision.emulate import emulate
    from precision_doctor.precision.plan import PrecisionPlan
    from precision_doctor.runners import device

    t = time.perf_counter()
    ok = device._session_on_cuda(0)
    out["probe_s"], out["probe_ok"] = time.perf_counter() - t, ok
    model = load_model(assets / "models/ppocrv4/det.onnx")
    t = time.perf_counter()
    emulated, _ = emulate(model, PrecisionPlan(Precision.FP16))
    out["emulate_build_s"] = time.perf_counter() - t
    from precision_doctor.precision.emulate_switch import SWITCH_INPUT, emulate_switchable
    t = time.perf_counter()
    built = emulate_switchable(model, Precision.FP16)
    out["switched_build_s"] = time.perf_counter() - t
    flags = built.flags(PrecisionPlan(Precision.FP16))
    from precision_doctor.runners.ort import OrtRunner
    with OrtRunner(model, ("cpu",)) as r:
        meta = r.input_metadata()
    samples = inputs.load_samples(assets / "data/ocr/full_images", meta,
                                  "ppocr-det:resize=fixed,size=640x640")
    feeds = [s.feeds for s in samples]
    cuda_opts = {"device_id": "0", **device.CUDA_SESSION_OPTIONS, **VARIANTS[variant]}
    steps = []
    cuda = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    for label, proto, providers, opts, threads in (
            ("cuda-fp32", model, cuda, [cuda_opts, {}], 0),
            ("cuda-emulate-fp16", emulated, cuda, [cuda_opts, {}], 0),
            ("cuda-emulate-fp16-1thread", emulated, cuda, [cuda_opts, {}], 1),
            ("cuda-switched-fp16", built.model, cuda, [cuda_opts, {}], 0),
            ("cuda-fp32-again", model, cuda, [cuda_opts, {}], 0),
            ("cpu-fp32", model, ["CPUExecutionProvider"], [{}], 0),
            ("cpu-emulate-fp16", emulated, ["CPUExecutionProvider"], [{}], 0),
            ("cpu-switched-fp16", built.model, ["CPUExecutionProvider"], [{}], 0)):
        row: dict = {"step": label, "threads": threads}
        blob = proto.SerializeToString()
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        t = time.perf_counter()
        s = ort.InferenceSession(blob, options, providers=providers, provider_options=opts)
        row["create_s"] = time.perf_counter() - t
        extra = {SWITCH_INPUT: flags} if "switched" in label else {}
        for k in range(3):
            t = time.perf_counter()
            for f in feeds:
                s.run(None, {**f, **extra})
            row[f"run{k}_s"] = time.perf_counter() - t
        row["mib_after"] = _used()
        del s
        row["mib_closed"] = _used()
        steps.append(row)
    out["steps"] = steps
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--assets", type=Path, default=Path("/tmp/pipe"))
    ap.add_argument("--variants", default="default,no-max-workspace,mem-limit-2g")
    ap.add_argument("--one")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.assets, args.one)))
        return
    results = []
    for variant in args.variants.split(","):
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, str(HERE), "--assets", str(args.assets),
                               "--one", variant], capture_output=True, text=True)
        if proc.returncode:
            results.append({"variant": variant, "error": proc.stderr[-2000:]})
        else:
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            r["process_s"] = time.perf_counter() - t
            results.append(r)
        print(json.dumps(results[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
