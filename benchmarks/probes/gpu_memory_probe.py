"""Where GPU memory goes in a device-resident layerwise comparison.

Measures the GPU's used memory (NVML) and the time while ``compare_layerwise`` runs PP-OCRv4
rec on the calibration strips on a CUDA device, with the statistics on the device
(``layerwise.resident``), in variants (one per process: run the script once per variant):

* ``plain``: as the package does it;
* ``host``: every tensor copied to the host and reduced there (the path before ``resident``);
* ``shrink``: every session gives its free device arena back after each run
  (``OrtRunner(arena_shrinkage=True)``: ONNX Runtime's run option
  ``memory.enable_memory_arena_shrinkage``), the statistics graph's included;
* ``ref-vs-ref``: the reference against itself (no emulation graph);
* ``serial``: the candidate's runs after the reference's, not beside them on a thread;
* ``ws32``: cuDNN's convolution workspace limited to 32 MiB (the CUDA EP option
  ``cudnn_conv_use_max_workspace=0``; its default lets cuDNN pick algorithms that need more);
* ``half``: the GPU segment budget halved (``runners.device.GPU_SEGMENT_BUDGET``);
* ``stats``: the statistics session alone, fed device tensors of many sizes in turn.

Variants combine with ``+`` (``serial+ws32``). There (GPU machine, after
``benchmarks/gpu_setup.sh``, with ``.gpu/pipe`` copied to ``/tmp/pipe`` as
``benchmarks/gpu_pipeline.py`` says)::

    export PYTHONPATH=/tmp/site:$PWD/src
    for v in plain shrink ws32 host half ref-vs-ref serial; do
        python3 benchmarks/probes/gpu_memory_probe.py --assets /tmp/pipe --samples 256 --variants $v
    done

Results of 2026-11-25 (before the statistics were sliced):
``benchmarks/results/gpu_memory_probe_2026-11-25_h100.log``; of 2026-11-26:
``gpu_memory_probe_2026-11-26_h200.log`` (its ``shrink`` then patched the I/O-bound runs only:
every run of a layerwise comparison on a GPU).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2] / "src"))
sys.path.insert(0, str(HERE.parents[1]))  # gpu_pipeline

from gpu_pipeline import GpuMemory  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--assets", type=Path, default=Path("/tmp/pipe"))
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--variants", default="plain")
    args = ap.parse_args()
    import onnxruntime as ort

    ort.preload_dlls()
    from precision_doctor.graph.load import load_model
    from precision_doctor.inputs import load as inputs
    from precision_doctor.layerwise import engines
    from precision_doctor.runners import device
    from precision_doctor.runners.ort import OrtRunner

    cuda = device.Device("cuda", 0)
    model = load_model(args.assets / "models/ppocrv4/rec.onnx")
    with OrtRunner(model) as r:
        meta = r.input_metadata()
    samples = [s.feeds for s in inputs.load_samples(args.assets / "data/calib256", meta,
                                                    "ppocr-rec", max_samples=args.samples)]
    keep = engines._keep
    for variant in args.variants.split(","):
        gc.collect()
        t = time.perf_counter()
        try:
            _variant(variant, args, mem := GpuMemory(), cuda, model, samples, keep)
        except Exception as exc:  # noqa: BLE001 - e.g. out of GPU memory: say so, go on
            print(variant, "failed:", str(exc).splitlines()[-1][:300], flush=True)
        finally:
            engines._keep = keep
        print(f"{variant}: {time.perf_counter() - t:.1f} s, GPU peak {mem.mib:.0f} MiB above "
              f"the start", flush=True)


def _variant(variant, args, mem, cuda, model, samples, keep) -> None:
    import onnxruntime as ort

    from precision_doctor.formats import FORMATS, Precision
    from precision_doctor.layerwise import compare as lw_compare
    from precision_doctor.layerwise import engines
    from precision_doctor.layerwise.candidates import emulated, reference_factory
    from precision_doctor.layerwise.compare import compare_layerwise
    from precision_doctor.layerwise.resident import stats_model
    from precision_doctor.precision.plan import PrecisionPlan
    from precision_doctor.runners import device
    from precision_doctor.runners.ort import OrtRunner

    parts = set(variant.split("+"))
    if "shrink" in parts:  # every session gives its device arena back after each run
        enter = OrtRunner.__enter__

        def shrinking(self):
            self.arena_shrinkage = True
            return enter(self)
        OrtRunner.__enter__ = shrinking
    if "serial" in parts:
        engines.side_thread = lw_compare.side_thread = lambda: None
    if "ws32" in parts:
        device.CUDA_SESSION_OPTIONS = {**device.CUDA_SESSION_OPTIONS,
                                       "cudnn_conv_use_max_workspace": "0"}
    if "half" in parts:
        device.GPU_SEGMENT_BUDGET //= 2
    with mem, device.use(cuda):
        if "stats" in parts:
            rng = np.random.default_rng(0)
            with OrtRunner(stats_model(FORMATS[Precision.FP16])) as s:
                for _ in range(200):
                    n = int(10 ** rng.uniform(3, 7.3))
                    r = ort.OrtValue.ortvalue_from_numpy(
                        rng.standard_normal(n).astype(np.float32), "cuda", 0)
                    s.run_resident({"r": r, "c": r, "lo": np.array([0]),
                                    "hi": np.array([n])})["s"].numpy()
                    del r
            return
        candidate = (reference_factory if "ref-vs-ref" in parts
                     else emulated(PrecisionPlan(Precision.FP16)).factory)
        lw = compare_layerwise(model, samples, reference_factory, candidate,
                               Precision.FP16, 1e-2, resident="host" not in parts)
        print(variant, "segments", lw.chunks, "records", len(lw.records), flush=True)

if __name__ == "__main__":
    main()
