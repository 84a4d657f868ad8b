"""Where a layerwise comparison's time goes, per phase, on PP-OCRv4 det and rec and MiniLM.

For each model, in one process: the two plain runs as ``diagnose`` runs them (the FP32
reference and the FP16 emulation over every sample), then ``compare_layerwise`` as
``diagnose`` calls it, with every phase timed by wrapping the functions that do it:

* ``plan``: cutting the graph (``plan_segments``, ``cut_like``) and type inference
  (``infer_types``);
* ``segment_model``: building each segment's sub-model (both runners);
* ``session``: ``OrtRunner.__enter__`` (session creation), per thread;
* ``ort_run``: ``OrtRunner.run`` (the segment runs), per thread;
* ``stats``: ``_Accumulator.add`` (the statistics), per thread; ``stats_wait``: the main
  thread waiting in ``StatsPool.add``/``flush`` for the previous call's statistics;
* ``both``: the main thread in ``_run_both`` (the reference run plus waiting for the
  candidate's).

Phases are keyed ``phase@main`` or ``phase@side`` (any other thread: the candidate's, the
statistics workers, the one opening the next segment); times are wall (``phases_s``) and CPU
(``phases_cpu_s``, the thread's own) seconds inside the call. The main thread's phases add up
to the layerwise wall time (``other_main_s`` is the rest). ``busy_threads_share``: the
share of the wall time during which 0, 1, 2, 3+ threads were working (not waiting) in a timed
phase. ``--cprofile N`` prints the top N functions of the main thread by cumulative time.
``--no-stats`` folds nothing (the records are then empty): what the comparison costs without
its statistics.

Usage (repo root, ``../shared`` present)::

    python benchmarks/probes/layerwise_profile.py [--models det,rec,minilm] [--repeat 3]
        [--no-stats] [--cprofile 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import json
import os
import pstats
import resource
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "src")]

from precision_doctor.formats import Precision  # noqa: E402
from precision_doctor.graph import input_metadata, load_model  # noqa: E402
from precision_doctor.inputs import load_samples  # noqa: E402
from precision_doctor.layerwise import compare, engines, stats  # noqa: E402

try:  # absent from trees before the compiled statistics (--before comparisons)
    from precision_doctor.layerwise import fused  # noqa: E402
except ImportError:
    fused = None  # type: ignore[assignment]
from precision_doctor.layerwise.candidates import (  # noqa: E402
    emulated,
    reference_factory,
    run_samples,
)
from precision_doctor.precision.plan import PrecisionPlan  # noqa: E402
from precision_doctor.runners import ort as ort_runner  # noqa: E402

TIMES: dict[tuple[str, str], float] = defaultdict(float)
CPU: dict[tuple[str, str], float] = defaultdict(float)
COUNTS: dict[tuple[str, str], int] = defaultdict(int)
EVENTS: list[tuple[str, int, float, float]] = []  # (phase, thread id, start, end)
BUSY = ("plan", "segment_model", "session", "ort_run", "stats")


def _timed(phase: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            key = (phase, "main" if threading.current_thread() is threading.main_thread()
                   else "side")
            end = time.perf_counter()
            TIMES[key] += end - t0
            CPU[key] += time.thread_time() - c0
            if phase in BUSY:
                EVENTS.append((phase, threading.get_ident(), t0, end))
            COUNTS[key] += 1
    return wrapper


def _instrument() -> None:
    compare.plan_segments = _timed("plan", compare.plan_segments)
    compare.infer_types = _timed("plan", compare.infer_types)
    compare.cut_like = _timed("plan", compare.cut_like)
    engines.segment_model = _timed("segment_model", engines.segment_model)
    engines._run_both = _timed("both", engines._run_both)
    ort_runner.OrtRunner.__enter__ = _timed("session", ort_runner.OrtRunner.__enter__)
    ort_runner.OrtRunner.run = _timed("ort_run", ort_runner.OrtRunner.run)
    stats._Accumulator.add = _timed("stats", stats._Accumulator.add)
    stats.StatsPool.add = _timed("stats_wait", stats.StatsPool.add)
    stats.StatsPool.records = _timed("stats_wait", stats.StatsPool.records)


def cases(shared: Path, minilm: Path) -> dict:
    det = shared / "models/ppocrv4/det.onnx"
    rec = shared / "models/ppocrv4/rec.onnx"
    return {"det": (det, shared / "data/ocr/full_images", "ppocr-det:resize=fixed,size=640x640"),
            "rec": (rec, shared / "data/ocr/rec_crops/*/*", "ppocr-rec"),
            "minilm": (minilm, minilm.parent / "minilm_inputs.npz", None)}


def profile_case(path: Path, data: Path, pre: str | None, top: int) -> dict:
    model = load_model(path)
    samples = load_samples(data, input_metadata(model), pre)
    names = [o.name for o in model.graph.output]
    candidate = emulated(PrecisionPlan(Precision.FP16))
    if fused is not None:  # as diagnose does: the statistics kernel loads during the runs
        fused.preload()
    t0, c0 = time.perf_counter(), time.process_time()
    run_samples(reference_factory(model), samples, names)
    t_ref, c_ref = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    run_samples(candidate.factory(model), samples, names)
    t_cand, c_cand = time.perf_counter() - t0, time.process_time() - c0
    TIMES.clear()
    CPU.clear()
    EVENTS.clear()
    COUNTS.clear()
    prof = cProfile.Profile() if top else None
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    lw = compare.compare_layerwise(model, [dict(s.feeds) for s in samples], reference_factory,
                                   candidate.factory, Precision.FP16, 1e-2,
                                   segments=candidate.segments,
                                   candidate_graph=candidate.graph)
    if prof:
        prof.disable()
    t_lw = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    main = {k[0]: v for k, v in TIMES.items() if k[1] == "main"}
    inner = main.get("both", 0) + main.get("session", 0) + main.get("segment_model", 0) \
        + main.get("plan", 0) + main.get("stats_wait", 0)
    row = {"samples": len(samples), "segments": lw.chunks, "mode": lw.mode,
           "records": len(lw.records), "reference_s": round(t_ref, 3),
           "candidate_s": round(t_cand, 3), "reference_cpu_s": round(c_ref, 3),
           "candidate_cpu_s": round(c_cand, 3), "layerwise_s": round(t_lw, 3),
           "ratio": round(t_lw / (t_ref + t_cand), 2), "layerwise_cpu_s": round(cpu, 3),
           "phases_s": {f"{k[0]}@{k[1]}": round(v, 3) for k, v in sorted(TIMES.items())},
           "phases_cpu_s": {f"{k[0]}@{k[1]}": round(v, 3) for k, v in sorted(CPU.items())},
           "calls": {f"{k[0]}@{k[1]}": v for k, v in sorted(COUNTS.items())},
           "other_main_s": round(t_lw - inner, 3),
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}
    row["busy_threads_share"] = busy_share(t0, t0 + t_lw)
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(top)
    return row


def busy_share(start: float, stop: float, step: float = 1e-3) -> dict[int, float]:
    """Share of the wall time [start, stop) during which 0, 1, 2, 3+ threads were inside a
    timed phase that works (``BUSY``: not waiting), on a grid of ``step`` seconds."""
    grid = [0] * max(1, int((stop - start) / step))
    for _, _, a, b in EVENTS:
        for i in range(max(0, int((a - start) / step)), min(len(grid), int((b - start) / step))):
            grid[i] += 1
    counts = [0, 0, 0, 0]
    for g in grid:
        counts[min(g, 3)] += 1
    return {k: round(c / len(grid), 3) for k, c in enumerate(counts)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", type=Path, default=REPO.parent / "shared")
    ap.add_argument("--minilm", type=Path, default=REPO / ".models/minilm_op14.onnx")
    ap.add_argument("--models", default="det,rec,minilm")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--cprofile", type=int, default=0, metavar="N")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-stats", action="store_true", help="fold nothing (the floor)")
    args = ap.parse_args()
    _instrument()
    if args.no_stats:
        stats._Accumulator.add = lambda *a, **k: None
    all_cases = cases(args.shared, args.minilm)
    out: dict = {"load_average_at_start": os.getloadavg()}
    for name in args.models.split(","):
        rows = [profile_case(*all_cases[name], args.cprofile) for _ in range(args.repeat)]
        out[name] = rows
        for r in rows:
            print(name, json.dumps(r), flush=True)
    out["load_average_at_end"] = os.getloadavg()
    print("load", out["load_average_at_start"], out["load_average_at_end"])
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
