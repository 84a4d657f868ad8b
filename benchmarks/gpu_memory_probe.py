"""Where GPU memory goes in a device-resident layerwise comparison (issue 21).

Measures the GPU's used memory (NVML) while ``compare_layerwise`` runs PP-OCRv4 rec on the
calibration strips with the statistics on the device (``layerwise.resident``), in variants:

* ``stats``: the statistics session alone, fed device tensors of many sizes in turn;
* ``host``: layerwise with every tensor copied to the host (the path before ``resident``);
* ``resident``: segments with I/O binding, boundary tensors kept on the device;
* ``resident-host-boundaries``: outputs on the device, boundary tensors copied to the host
  (no device tensor outlives the session that made it).

There (GPU machine, after ``benchmarks/gpu_setup.sh``, with ``.gpu/pipe`` copied to
``/tmp/pipe`` as ``benchmarks/gpu_pipeline.py`` says)::

    export PYTHONPATH=/tmp/site:$PWD/src
    python3 benchmarks/gpu_memory_probe.py --assets /tmp/pipe --samples 64
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1] / "src"))
sys.path.insert(0, str(HERE.parent))

from gpu_pipeline import GpuMemory  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--assets", type=Path, default=Path("/tmp/pipe"))
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--variants", default="stats,host,resident,resident-host-boundaries")
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
    from precision_doctor.layerwise import engines
    from precision_doctor.layerwise.candidates import emulated, reference_factory
    from precision_doctor.layerwise.compare import compare_layerwise
    from precision_doctor.layerwise.resident import stats_model, to_host
    from precision_doctor.precision.plan import PrecisionPlan
    from precision_doctor.runners import device
    from precision_doctor.runners.ort import OrtRunner

    if True:
        with mem, device.use(cuda):
            if variant == "stats":
                rng = np.random.default_rng(0)
                with OrtRunner(stats_model(FORMATS[Precision.FP16])) as s:
                    for _ in range(200):
                        n = int(10 ** rng.uniform(3, 7.3))
                        r = ort.OrtValue.ortvalue_from_numpy(
                            rng.standard_normal(n).astype(np.float32), "cuda", 0)
                        s.run_resident({"r": r, "c": r})["s"].numpy()
                        del r
            else:
                if variant == "resident-host-boundaries":
                    def host_keep(seg, store, outputs):
                        keep(seg, store, {k: to_host(v) for k, v in outputs.items()
                                          if k in seg.carry})
                    engines._keep = host_keep
                lw = compare_layerwise(model, samples, reference_factory,
                                       emulated(PrecisionPlan(Precision.FP16)).factory,
                                       Precision.FP16, 1e-2, resident=variant != "host")
                print(variant, "segments", lw.chunks, "records", len(lw.records), flush=True)


if __name__ == "__main__":
    main()
