"""How often the switched emulation changes input shape in a GPU diagnosis, counted on the CPU.

ONNX Runtime's CUDA convolution rebuilds its cuDNN plan whenever its input shape differs from
the run before (``runners.sessions.switched``), so what a GPU diagnosis pays there depends on
the order of the shapes its stages feed the shared switched session. That order is the same
whatever runs the sessions; this script reproduces it without a GPU: ``diagnose`` (or ``fix``)
runs with ``--device cuda``'s control flow (batching of equal shapes, the switched scope,
``ShapeSessions``), but every session on ONNX Runtime CPU. It prints, per input-shape
signature, the runs, the re-plans of the shared session and whether the signature got a
session of its own (``REPLANS_FOR_SESSION``). Not a timing: the CPU runs the switched graph
several times slower than its per-plan emulation.

    python benchmarks/shape_replans.py ../shared/models/ppocrv4/det.onnx \\
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
    ap.add_argument("--replans-for-session", type=int, default=None,
                    help="override runners.sessions.switched.REPLANS_FOR_SESSION (a large "
                         "value counts every re-plan of the shared session)")
    args = ap.parse_args()

    import precision_doctor as pd
    from precision_doctor.runners import device
    from precision_doctor.runners.sessions import switched

    # CUDA's control flow, the CPU's sessions
    device.cuda_devices = lambda: (1, "")
    device.Device.providers = lambda self: [device.CPU_PROVIDER]
    device.Device.provider_options = lambda self: [{}]
    device._device_memory = lambda ordinal: 80 << 30

    runs: Counter = Counter()
    own_runs: Counter = Counter()
    opened: list[str] = []
    route = switched.ShapeSessions._for

    def counting(self, feeds):
        key = tuple(sorted((k, switched._shape(v)) for k, v in feeds.items()))
        label = ", ".join(f"{k}{list(s)}" for k, s in key if k != "pd_keep_fp32")
        before = set(self._own)
        runner = route(self, feeds)
        runs[label] += 1
        if key in self._own:
            own_runs[label] += 1
            if key not in before:
                opened.append(label)
        return runner

    switched.ShapeSessions._for = counting
    if args.replans_for_session is not None:
        switched.REPLANS_FOR_SESSION = args.replans_for_session
    replans: dict[str, int] = {}
    exit_ = switched.ShapeSessions.__exit__

    def keep_counts(self, *exc):
        for key, n in self._replans.items():
            label = ", ".join(f"{k}{list(s)}" for k, s in key if k != "pd_keep_fp32")
            replans[label] = replans.get(label, 0) + n
        exit_(self, *exc)

    switched.ShapeSessions.__exit__ = keep_counts
    kw = {"preprocess": args.preprocess, "device": "cuda"}
    if args.max_samples:
        kw["max_samples"] = args.max_samples
    (pd.diagnose if args.task == "diagnose" else pd.fix)(args.model, args.data, **kw)
    rows = [{"shapes": label, "runs": runs[label], "replans": replans.get(label, 0),
             "own_session_runs": own_runs[label]} for label in sorted(runs)]
    print(json.dumps({"own_sessions_opened": opened, "total_runs": sum(runs.values()),
                      "total_replans": sum(replans.values()), "by_shape": rows}, indent=1))


if __name__ == "__main__":
    main()
