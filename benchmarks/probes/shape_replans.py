"""How often the switched emulation changes input shape in a GPU diagnosis, counted on the CPU.

ONNX Runtime's CUDA convolution rebuilds its cuDNN plan whenever its input shape differs from
the run before (``runners.sessions.switched``), so what a GPU diagnosis pays there depends on
the order of the shapes its stages feed the shared switched session. That order is the same
whatever runs the sessions; this script reproduces it without a GPU: ``diagnose`` (or ``fix``)
runs with ``--device cuda``'s control flow (batching of equal shapes, the switched scope), but
every session on ONNX Runtime CPU. It prints, per input-shape signature, the switched
session's runs and those that followed a run of another shape (a re-plan on the GPU), and the
answer (fix: the FP32 nodes; diagnose: the verdict) to compare two versions. Not a timing:
the CPU runs the switched graph several times slower than its per-plan emulation.

    python benchmarks/probes/shape_replans.py ../shared/models/ppocrv4/det.onnx \\
        ../shared/data/ocr/full_images --preprocess ppocr-det:resize=fixed,size=640x640
"""

from __future__ import annotations

import argparse
import json
from collections import Counter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("data")
    ap.add_argument("--preprocess", default=None)
    ap.add_argument("--max-samples", type=int, default=None)
    ap.add_argument("--task", default="diagnose", choices=("diagnose", "fix"))
    args = ap.parse_args()

    import precision_doctor as pd
    from precision_doctor.layerwise.resident import value_shape
    from precision_doctor.runners import device
    from precision_doctor.runners.ort import OrtRunner

    # CUDA's control flow, the CPU's sessions
    device.cuda_devices = lambda: (1, "")
    device.Device.providers = lambda self: [device.CPU_PROVIDER]
    device.Device.provider_options = lambda self: [{}]
    device._device_memory = lambda ordinal: 80 << 30

    runs: Counter = Counter()
    changes: Counter = Counter()
    last: dict[int, tuple] = {}

    def counted(method):
        def wrapper(runner, feeds, *a, **kw):
            if runner.name.endswith("-switched"):
                key = tuple(sorted((k, value_shape(v)) for k, v in feeds.items()))
                label = ", ".join(f"{k}{list(s)}" for k, s in key if k != "pd_keep_fp32")
                runs[label] += 1
                if last.get(id(runner), key) != key:
                    changes[label] += 1
                last[id(runner)] = key
            return method(runner, feeds, *a, **kw)
        return wrapper

    OrtRunner.run = counted(OrtRunner.run)
    OrtRunner.run_resident = counted(OrtRunner.run_resident)
    kw = {"preprocess": args.preprocess, "device": "cuda"}
    if args.max_samples:
        kw["max_samples"] = args.max_samples
    result = (pd.diagnose if args.task == "diagnose" else pd.fix)(args.model, args.data, **kw)
    # the answer, to compare two versions' control flows
    answer = ({"fp32_nodes": sorted(result.fp32_nodes), "passed": result.passed}
              if args.task == "fix" else {"verdict": result.verdict})
    rows = [{"shapes": label, "runs": runs[label], "after_a_change": changes[label]}
            for label in sorted(runs)]
    print(json.dumps({"answer": answer, "runs": sum(runs.values()),
                      "after_a_change": sum(changes.values()),
                      "by_shape": rows}, indent=1))


if __name__ == "__main__":
    main()
