"""Why a run of the switched emulation is slow on CUDA.

``benchmarks/ort_ledger.py`` on an H200 (2026-11-26, ``gpu_pipeline_2026-11-26_h200_ledger_*``)
put most of a GPU diagnosis of PP-OCRv4 rec in the runs of the shared switched emulation
session (``runners.sessions.switched``): 99 runs, 43.8 s on the 28 real crops (0.44 s a run),
where ONNX Runtime CPU runs the per-plan emulation in 34 ms. Here one CUDA session at a time,
for each model variant and session setting: its creation, its first run, the median of the
runs after it, GPU 0's peak memory (NVML, 5 ms) above the level before, and with ``--profile``
ONNX Runtime's own per-node profile of one later run (seconds by execution provider and op
type; nodes ONNX Runtime placed on the CPU, and the copies between host and device).

Models: ``fp32`` (the model), ``plan`` (``precision.emulate.emulate`` of the all-FP16 plan),
``switched`` (``precision.emulate_switch``, every switch off = the same plan). Settings:
``heur`` / ``exh`` (cuDNN's algorithm search: the heuristic, or exhaustive with the 32 MiB
workspace cap, the package's choice since 2026-11-27, ``runners.device``), ``+shrink`` (the run
option that gives the arena back after each run, as the switched session has it), ``+flip``
(switched only: every run another plan, each node's switch drawn at random with probability
0.1, seeded, as a search's or an attribution's evaluations feed it), ``+alt`` (every other run
on the batch's first 2 samples: two input shapes in turn, as a diagnosis's stages feed one
shared session). Batches: rec, 6 of the
256 strips (48x320) and det, 3 images at 640x640.

There (GPU machine, after ``benchmarks/gpu_setup.sh`` and ``.gpu/pipe`` copied to
``/tmp/pipe`` as ``benchmarks/gpu_pipeline.py`` says)::

    export PYTHONPATH=/tmp/site:$PWD/src
    python3 benchmarks/probes/gpu_switched_runs.py --assets /tmp/pipe --profile --out $OUT/sw.json
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from gpu_pipeline import GpuMemory  # noqa: E402
from gpu_segment_memory import load_batch  # noqa: E402

SETTINGS = ("heur", "heur+shrink", "exh", "exh+shrink")
SWITCH_INPUT = "pd_keep_fp32"  # precision.emulate_switch.SWITCH_INPUT (checked in main)


def run_setting(proto, feeds: dict, setting: str, repeat: int, profile: bool) -> dict:
    """One session of ``proto`` under ``setting``: times, peak memory, optional profile."""
    import onnxruntime as ort

    from precision_doctor.runners import device

    cuda = device.Device("cuda", 0)
    provider_options = cuda.provider_options()
    if setting.startswith("heur"):
        provider_options[0] = {**provider_options[0], "cudnn_conv_algo_search": "HEURISTIC"}
        del provider_options[0]["cudnn_conv_use_max_workspace"]
    options = ort.SessionOptions()
    options.log_severity_level = 3
    folder = tempfile.mkdtemp() if profile else None
    if folder:
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder, "p"))
    run_options = None
    if "shrink" in setting:
        run_options = ort.RunOptions()
        run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "gpu:0")
    gc.collect()
    time.sleep(0.2)
    rng = np.random.default_rng(0)
    switch = feeds.get(SWITCH_INPUT)
    small = {k: v[:2] if k != SWITCH_INPUT else v for k, v in feeds.items()}
    times = []
    with GpuMemory(interval=0.005) as peak:
        t = time.perf_counter()
        session = ort.InferenceSession(proto.SerializeToString(), options,
                                       providers=cuda.providers(),
                                       provider_options=provider_options)
        create = time.perf_counter() - t
        names = [o.name for o in session.get_outputs()]
        for _ in range(repeat):
            if "flip" in setting and switch is not None:
                feeds = {**feeds, SWITCH_INPUT: rng.random(switch.shape) < 0.1}
            fed = small if "alt" in setting and len(times) % 2 else feeds
            t = time.perf_counter()
            session.run(names, fed, run_options)
            times.append(time.perf_counter() - t)
        trace = session.end_profiling() if folder else None
        del session
    row = {"setting": setting, "create_s": round(create, 3), "first_run_s": round(times[0], 4),
           "run_s": round(float(np.median(times[1:])), 4), "peak_mib": round(peak.mib or 0.0),
           "times_s": [round(x, 4) for x in times]}
    if trace:
        row["profile"] = summarize(json.loads(Path(trace).read_text()), repeat)
    return row


def summarize(events: list[dict], repeat: int) -> dict:
    """Seconds of the last run's node events by provider and op type; the CPU-placed nodes."""
    runs = [e for e in events if e.get("name") == "model_run"]
    if not runs:
        return {}
    last = runs[-1]
    t0, t1 = last["ts"], last["ts"] + last["dur"]
    by = defaultdict(float)
    cpu_nodes = set()
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        if not t0 <= e["ts"] <= t1:
            continue
        args = e.get("args", {})
        provider = args.get("provider", "?").replace("ExecutionProvider", "")
        by[f"{provider}:{args.get('op_name', '?')}"] += e["dur"] / 1e6
        if provider == "CPU":
            cpu_nodes.add(e["name"][: -len("_kernel_time")])
    top = sorted(by.items(), key=lambda kv: -kv[1])[:12]
    return {"model_run_s": last["dur"] / 1e6, "nodes_s": round(sum(by.values()), 4),
            "by_op": {k: round(v, 4) for k, v in top}, "cpu_nodes": len(cpu_nodes),
            "cpu_examples": sorted(cpu_nodes)[:8]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--assets", type=Path, default=Path("/tmp/pipe"))
    ap.add_argument("--cases", default="rec,det")
    ap.add_argument("--models", default="fp32,plan,switched")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--repeat", type=int, default=8)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    import onnxruntime as ort

    ort.preload_dlls()
    from precision_doctor.formats import Precision
    from precision_doctor.precision import emulate_switch
    from precision_doctor.precision.emulate import emulate
    from precision_doctor.precision.emulate_switch import emulate_switchable
    from precision_doctor.precision.plan import PrecisionPlan
    from precision_doctor.runners import device

    assert emulate_switch.SWITCH_INPUT == SWITCH_INPUT
    device.cuda_devices()  # the CUDA context before any measurement
    rows = []
    for case in args.cases.split(","):
        model, feeds = load_batch(args.assets, case)
        plan = PrecisionPlan(Precision.FP16)
        for kind in args.models.split(","):
            t = time.perf_counter()
            if kind == "fp32":
                proto, extra = model, {}
            elif kind == "plan":
                proto, extra = emulate(model, plan)[0], {}
            else:
                built = emulate_switchable(model, Precision.FP16)
                proto, extra = built.model, {SWITCH_INPUT: built.flags(plan)}
            build = time.perf_counter() - t
            for setting in args.settings.split(","):
                row = {"case": case, "model": kind, "build_s": round(build, 3),
                       "nodes": len(proto.graph.node),
                       **run_setting(proto, {**feeds, **extra}, setting, args.repeat,
                                     args.profile)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "rows": rows},
                                       indent=1))


if __name__ == "__main__":
    main()
