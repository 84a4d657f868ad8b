"""What one layerwise segment run holds in GPU memory, beyond the outputs it returns.

A GPU run of 2026-11-26 found layerwise on a GPU taking about 3x the bytes of the outputs its runs
return (``benchmarks/probes/gpu_memory_probe.py``: two reference runs of 6 PP-OCRv4 rec strips
returned 2.3 GiB and took 7.4 GiB). Here one ONNX Runtime CUDA session at a time runs a batch a few
times, in variants of how the session is set up; for each: GPU 0's used memory (NVML, polled every 5
ms) above the level before the session was created, the bytes of the outputs one run returns, and
the time of a run after the first. Variants:

* ``plain``: the model as it is (only its own outputs);
* ``marked``: every floating tensor marked as an output (what a layerwise segment is), outputs
  copied to the host (``session.run``);
* ``bound``: the same with I/O binding, outputs left on the device (``layerwise.resident``);
* ``bound-nopattern``: ``bound`` with ``SessionOptions.enable_mem_pattern = False``;
* ``bound-basic``: ``bound`` with basic graph optimizations only;
* ``bound-nopattern-basic``: both;
* ``bound-pow2``: ``bound`` with ONNX Runtime's default arena growth (``kNextPowerOfTwo``);
* ``plain-ws32`` / ``marked-ws32``: cuDNN's convolution workspace limited to 32 MiB
  (``cudnn_conv_use_max_workspace=0``);
* ``plain-b1``: the plain model on one sample of the batch;
* ``...-default`` / ``...-exhaustive``: ``cudnn_conv_algo_search=DEFAULT`` (cuDNN's implicit
  precomputed GEMM for every convolution) / ``EXHAUSTIVE`` instead of the package's
  ``HEURISTIC``.

``--bisect``: the plain model cut after 10%, 20%, ... of its nodes (Constants not counted;
``onnx.utils.Extractor``, the cut node's first output as the only output), each cut's peak:
where the memory comes from.

There (GPU machine, after ``benchmarks/gpu_setup.sh``, ``.gpu/pipe`` copied to ``/tmp/pipe``
as ``benchmarks/gpu_pipeline.py`` says)::

    export PYTHONPATH=/tmp/site:$PWD/src
    python3 benchmarks/probes/gpu_segment_memory.py --assets /tmp/pipe --out $OUT/seg.json
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from gpu_pipeline import GpuMemory  # noqa: E402

VARIANTS = ("plain", "marked", "bound", "bound-nopattern", "bound-basic",
            "bound-nopattern-basic", "bound-pow2", "plain-ws32", "marked-ws32", "plain-b1",
            "plain-default", "bound-default", "plain-exhaustive")
CASES = {"rec": ("models/ppocrv4/rec.onnx", "data/calib256", "ppocr-rec", 6),
         "det": ("models/ppocrv4/det.onnx", "data/ocr/full_images",
                 "ppocr-det:resize=fixed,size=640x640", 3)}


def load_batch(assets: Path, case: str) -> tuple:
    """``CASES[case]``'s model and its batch of real samples (one feed dict, joined on axis 0)."""
    from precision_doctor.graph.load import load_model
    from precision_doctor.inputs import load as inputs
    from precision_doctor.runners.ort import OrtRunner

    path, data, pre, batch = CASES[case]
    model = load_model(assets / path)
    with OrtRunner(model, ("cpu",)) as r:
        meta = r.input_metadata()
    samples = inputs.load_samples(assets / data, meta, pre, max_samples=batch)
    return model, {k: np.concatenate([s.feeds[k] for s in samples]) for k in samples[0].feeds}


def run_variant(variant: str, model, marked, feeds: dict, repeat: int) -> dict:
    import onnxruntime as ort

    from precision_doctor.runners import device

    cuda = device.Device("cuda", 0)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if "nopattern" in variant:
        options.enable_mem_pattern = False
    if "basic" in variant:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    provider_options = cuda.provider_options()
    if "ws32" in variant:
        provider_options[0] = {**provider_options[0], "cudnn_conv_use_max_workspace": "0"}
    for search in ("default", "exhaustive"):
        if variant.endswith(f"-{search}"):
            provider_options[0] = {**provider_options[0],
                                   "cudnn_conv_algo_search": search.upper()}
    if "b1" in variant:
        feeds = {k: v[:1] for k, v in feeds.items()}
    if "pow2" in variant:
        provider_options[0] = {k: v for k, v in provider_options[0].items()
                               if k != "arena_extend_strategy"}
    proto = model if variant.startswith("plain") else marked
    gc.collect()
    time.sleep(0.2)
    times, out_bytes = [], 0
    with GpuMemory(interval=0.005) as peak:
        session = ort.InferenceSession(proto.SerializeToString(), options,
                                       providers=cuda.providers(),
                                       provider_options=provider_options)
        names = [o.name for o in session.get_outputs()]
        for _ in range(repeat):
            t = time.perf_counter()
            if variant.startswith("bound"):
                binding = session.io_binding()
                for k, v in feeds.items():
                    binding.bind_cpu_input(k, v)
                for n in names:
                    binding.bind_output(n, "cuda", 0)
                session.run_with_iobinding(binding)
                values = binding.get_outputs()
                out_bytes = sum(int(np.prod(v.shape())) * 4 for v in values)
                del binding, values
            else:
                values = session.run(names, feeds)
                out_bytes = sum(v.nbytes for v in values)
                del values
            times.append(time.perf_counter() - t)
        del session
    mib = round(peak.mib or 0.0, 1)
    return {"variant": variant, "peak_mib": mib, "outputs_mib": round(out_bytes / 2**20, 1),
            "ratio": round(mib / max(out_bytes / 2**20, 1e-9), 2),
            "run_s": round(float(np.median(times[1:])), 4), "outputs": len(names)}


def bisect(case: str, model, feeds: dict, repeat: int) -> list[dict]:
    """Peak of the model cut after each tenth of its nodes (see the module docstring)."""
    import onnx.utils

    from precision_doctor.graph.outputs import float_activations

    floats = {s.name for s in float_activations(model, {k: v.shape
                                                        for k, v in feeds.items()})}
    typed = onnx.shape_inference.infer_shapes(model)
    floats &= {v.name for v in typed.graph.value_info}  # the Extractor needs their types
    extractor = onnx.utils.Extractor(typed)
    nodes = [n for n in model.graph.node if n.op_type != "Constant"]
    rows = []
    for tenth in range(1, 11):
        k = max(0, len(nodes) * tenth // 10 - 1)
        while k > 0 and nodes[k].output[0] not in floats:
            k -= 1
        out = nodes[k].output[0]
        cut = extractor.extract_model(list(feeds), [out])
        row = {"case": case, "cut_after": k, "node": nodes[k].name, "op": nodes[k].op_type,
               **run_variant("plain", cut, cut, feeds, repeat)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--assets", type=Path, default=Path("/tmp/pipe"))
    ap.add_argument("--cases", default="rec,det")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--bisect", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    import onnxruntime as ort

    ort.preload_dlls()
    from precision_doctor.graph.outputs import float_activations, mark_outputs
    from precision_doctor.runners import device

    device.cuda_devices()  # the CUDA context before any measurement
    results = []
    for case in args.cases.split(","):
        batch = CASES[case][3]
        model, feeds = load_batch(args.assets, case)
        shapes = {k: v.shape for k, v in feeds.items()}
        marked = mark_outputs(model, [s.name for s in float_activations(model, shapes)])
        for variant in args.variants.split(","):
            row = {"case": case, "batch": batch, **run_variant(variant, model, marked, feeds,
                                                                args.repeat)}
            results.append(row)
            print(json.dumps(row), flush=True)
        if args.bisect:
            results.extend(bisect(case, model, feeds, args.repeat))
    if args.out:
        args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "rows": results},
                                       indent=1))


if __name__ == "__main__":
    main()
