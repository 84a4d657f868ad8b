"""Which ONNX op types ONNX Runtime CUDA has no BF16 (or FP16) kernel for, measured op by op.

The source of ``precision_doctor.runners.kernels.registry.CUDA_NO_BF16``. ONNX Runtime's kernel
registry (``get_all_opkernel_def``) cannot be read in the GPU machine's onnxruntime-gpu install
(it segfaults without the TensorRT EP library), so every op is tried instead:

1. Here (CPU, once): ``probes`` builds one small model per (op type, schema version in force
   at opsets 13..22, the opsets the strongly typed writer emits) from ONNX's own node test
   cases (``onnx.backend.test.case.node``: a valid node with real inputs): the op's float
   inputs and outputs that its schema lets be bfloat16 (float16) are made so, with FP32 graph
   inputs and outputs and Casts around the node, exactly how the writer writes a BF16 node
   (initializers converted); plus the FP32 original. Up to six test cases per op and version
   for BF16 (those with the most inputs first: Clip with ``min`` and ``max``), three for FP16; a
   test case that is not valid at the older opset (``onnx.checker`` full check, or
   ``onnx.version_converter`` down to it) is passed over for the next one of that op.

       python3 benchmarks/ort_cuda_bf16.py probes --out .gpu/probes

2. There (GPU machine, after the onnxruntime-gpu install of ``benchmarks/gpu_setup.sh``)::

       export PYTHONPATH=/tmp/site:$PWD/src
       python3 benchmarks/ort_cuda_bf16.py run .gpu/probes --out $OUT/ort_cuda_kernels.json

   For each probe: its FP32 model in an ONNX Runtime session with the CUDA execution provider
   alone and ``session.disable_cpu_ep_fallback=1`` (it fails when some node would run on the
   CPU) and one run on the test inputs; a case CUDA does not take even in FP32 (a 1-D or
   ``ceil_mode`` MaxPool) judges nothing. Then the BF16 (FP16) model the same way, and when
   it fails, with CUDA and CPU (whether it loads at all: ONNX Runtime places a node without a
   CUDA kernel on the CPU when the CPU has one; BF16 only for data movement). The summary
   lists, per precision, the op types and schema versions without a CUDA kernel: some case
   whose FP32 model runs on CUDA alone does not in BF16 (FP16).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ort_cuda_bf16_probes import probes  # noqa: E402

WORKERS = 8  # processes creating sessions at once on the GPU machine (16 cores)
NO_FALLBACK = "session.disable_cpu_ep_fallback"


# -- there: run ------------------------------------------------------------------------------

def _session(path: Path, providers: list, fallback: bool):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not fallback and providers != ["CPUExecutionProvider"]:
        options.add_session_config_entry(NO_FALLBACK, "1")
    return ort.InferenceSession(str(path), options, providers=providers)


def _try(path: Path, feeds: dict, providers: list, fallback: bool) -> str:
    return _outputs(path, feeds, providers, fallback)[0]


def _outputs(path: Path, feeds: dict, providers: list, fallback: bool
             ) -> tuple[str, list | None]:
    """``("ok", outputs)``, or ``("load: <why>" | "run: <why>", None)``."""
    try:
        session = _session(path, providers, fallback)
    except Exception as exc:  # noqa: BLE001 - the message is the measurement
        return "load: " + str(exc).strip().splitlines()[0][:300], None
    try:
        names = {i.name for i in session.get_inputs()}
        outs = session.run(None, {k: v for k, v in feeds.items() if k in names})
    except Exception as exc:  # noqa: BLE001
        return "run: " + str(exc).strip().splitlines()[0][:300], None
    return "ok", outs


def _rounded_inputs(path: Path) -> set[str]:
    """Graph inputs the low-precision probe casts to BF16/FP16 (directly or through FP32)."""
    import onnx

    graph = onnx.load(str(path)).graph
    inputs = {i.name for i in graph.input}
    return {n.input[0].removesuffix("__f32") for n in graph.node
            if n.op_type == "Cast" and n.output[0].endswith("__low")} & inputs


def _accuracy(low: list, exact: list) -> dict:
    """How far the low-precision kernel's outputs are from FP32 arithmetic on the same rounded
    inputs, rounded once (the engine model of ``precision.emulate``): in BF16 ulps."""
    import ml_dtypes

    worst, over = 0.0, 0
    count = 0
    for a, b in zip(low, exact):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype.kind != "f" or b.dtype.kind != "f" or a.shape != b.shape:
            continue
        b = b.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
        ok = np.isfinite(a) & np.isfinite(b)
        if not ok.any():
            continue
        spacing = np.spacing(np.maximum(np.abs(b[ok]), np.float32(2.0 ** -126))) * 2.0 ** 16
        ulps = np.abs(a[ok].astype(np.float64) - b[ok]) / spacing
        worst = max(worst, float(ulps.max()))
        over += int((ulps > 1).sum())
        count += int(ok.sum())
    return {"max_ulp": round(worst, 2), "share_over_1ulp": round(over / count, 4) if count
            else None}


RANDOM_OPS = frozenset({"Bernoulli", "Dropout", "Multinomial", "RandomNormal",
                        "RandomNormalLike", "RandomUniform", "RandomUniformLike"})


def summarize(rows: list[dict]) -> tuple[dict, dict, dict]:
    """``(gaps, unloadable, inexact)`` from the probe rows.

    gaps: precision -> op -> schema versions where a low-precision probe does not *load*
    ("load: ...") although its FP32 model does: with CUDA alone (no CUDA kernel), or only with
    the CPU fallback while the low one loads nowhere (no kernel at all: MaxPool-22). A probe
    that loads but fails to run (an attribute a kernel does not support, such as Resize's
    ``tf_crop_and_resize`` in FP16) is no kernel gap. unloadable: the second kind alone.
    inexact: ``op-version`` -> the largest BF16 ulp distance of a BF16 kernel's outputs from
    FP32 arithmetic on the same rounded inputs rounded once, where above 1 (random ops left
    out)."""
    gaps: dict[str, dict[str, list[int]]] = {}
    unloadable: dict[str, dict[str, list[int]]] = {}
    inexact: dict[str, float] = {}
    for row in rows:
        low = row.get("cuda", "")
        if low.startswith("load:"):
            if row["fp32_cuda"] == "ok":
                _add(gaps, row)
            elif row.get("fp32_with_cpu") == "ok" and row.get("with_cpu", "").startswith("load:"):
                _add(gaps, row)
                _add(unloadable, row)
        accuracy = row.get("accuracy")
        if accuracy and accuracy["max_ulp"] > 1 and row["op"] not in RANDOM_OPS:
            key = f"{row['op']}-{row['since']}"
            inexact[key] = max(inexact.get(key, 0.0), accuracy["max_ulp"])
    for table in (gaps, unloadable):
        for ops in table.values():
            for versions in ops.values():
                versions.sort()
    return gaps, unloadable, dict(sorted(inexact.items()))


def _add(table: dict, row: dict) -> None:
    versions = table.setdefault(row["dtype"], {}).setdefault(row["op"], [])
    if row["since"] not in versions:
        versions.append(row["since"])


def _init_worker() -> None:
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()


def _probe(folder: Path, probe: dict, cuda: list, both: list) -> dict:
    """One probe: its FP32 model on CUDA alone (a case CUDA does not take even in FP32, such as
    a MaxPool at opset 22, is tried with the CPU fallback), then the low-precision one; when
    that fails, with CPU. A BF16 probe that runs is compared with its FP32 model run on the
    rounded inputs, output rounded once (``_accuracy``)."""
    import ml_dtypes

    stem = probe["file"]
    feeds = dict(np.load(folder / f"{stem}.npz"))
    row = dict(probe, fp32_cuda=_try(folder / f"{stem}-fp32.onnx", feeds, cuda, False))
    if row["fp32_cuda"] != "ok":
        row["fp32_with_cpu"] = _try(folder / f"{stem}-fp32.onnx", feeds, both, True)
    row["cuda"], low = _outputs(folder / f"{stem}.onnx", feeds, cuda, False)
    if row["cuda"] != "ok":
        row["with_cpu"] = _try(folder / f"{stem}.onnx", feeds, both, True)
    elif probe["dtype"] == "bf16" and row["fp32_cuda"] == "ok":
        rounded = {k: (v.astype(ml_dtypes.bfloat16).astype(v.dtype)
                       if k in _rounded_inputs(folder / f"{stem}.onnx") and v.dtype.kind == "f"
                       else v) for k, v in feeds.items()}
        status, exact = _outputs(folder / f"{stem}-fp32.onnx", rounded, cuda, False)
        if status == "ok" and low is not None and exact is not None:
            row["accuracy"] = _accuracy(low, exact)
    return row


def run(folder: Path, out: Path, provider: str = "cuda") -> None:
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    cuda: list = [("CUDAExecutionProvider", {"use_tf32": "0"})]
    if provider == "cpu":  # a dry run of this script on a machine without a GPU
        cuda = ["CPUExecutionProvider"]
    both = [*cuda, "CPUExecutionProvider"]
    meta = json.loads((folder / "index.json").read_text())
    t0 = time.perf_counter()
    jobs = [(folder, probe, cuda, both) for probe in meta["probes"]]
    if provider == "cpu":
        rows = [_probe(*job) for job in jobs]
    else:  # session creation is mostly CPU work: several processes share the GPU
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        try:
            with ProcessPoolExecutor(WORKERS, mp_context=multiprocessing.get_context("spawn"),
                                     initializer=_init_worker) as pool:
                rows = list(pool.map(_probe, *zip(*jobs), chunksize=8))
        except Exception as exc:  # noqa: BLE001 - a worker died: one process, in order
            print(f"worker pool failed ({exc!r}); probing in this process", flush=True)
            rows = [_probe(*job) for job in jobs]
    gaps, unloadable, inexact = summarize(rows)
    result = {"onnxruntime": ort.__version__, "providers": ort.get_available_providers(),
              "seconds": round(time.perf_counter() - t0, 1), "no_cuda_kernel": gaps,
              "no_kernel_at_all": unloadable, "bf16_over_1ulp": inexact,
              "skipped": meta["skipped"], "rows": rows}
    out.write_text(json.dumps(result, indent=1))
    for label, ops in sorted(gaps.items()):
        print(label, "no CUDA kernel:", json.dumps(ops))
    print("bf16 over 1 ulp:", json.dumps(inexact))
    print(f"{len(rows)} probes in {result['seconds']} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("summary", help="here: the tables of a run's JSON, again")
    t.add_argument("json", type=Path)
    p = sub.add_parser("probes", help="here: one model per op type and schema version")
    p.add_argument("--out", type=Path, default=REPO / ".gpu/probes")
    r = sub.add_parser("run", help="there: which probes ONNX Runtime CUDA runs")
    r.add_argument("folder", type=Path)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--provider", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a dry run without a GPU (CPU alone, no fallback to disable)")
    args = ap.parse_args()
    if args.cmd == "summary":
        data = json.loads(args.json.read_text())
        gaps, unloadable, inexact = summarize(data["rows"])
        print(json.dumps({"onnxruntime": data["onnxruntime"], "no_cuda_kernel": gaps,
                          "no_kernel_at_all": unloadable, "bf16_over_1ulp": inexact},
                         indent=1))
    elif args.cmd == "probes":
        probes(args.out)
    else:
        run(args.folder, args.out, args.provider)


if __name__ == "__main__":
    main()
