"""What ``fix`` costs against one plain FP32 pass, with and without the search's incremental
evaluation (``search.incremental``), and whether both find the same plan.

Per case, in fresh subprocesses (imports and sample loading excluded from every timing),
alternating ``--repeat`` times:

* ``plain``: one ONNX Runtime CPU FP32 session opened and run over every sample, as
  ``OrtRunner`` opens it by default (no CPU memory arena: every large activation a fresh
  mapping), and again with ONNX Runtime's default CPU arena (``plain_arena``, what a user's own
  ``InferenceSession`` does; det's 3 images run about 2.3x faster with it). Both ratios are
  printed: the issue's target was set against the first;
* ``fix``: ``precision_doctor.fix`` with ``repair.stages.SEARCH_INCREMENTAL`` off (every plan a
  whole-model emulation, as before) and on.

Printed per case: median seconds of each, fix / plain, the search's own seconds, evaluations,
sample runs, FP32 nodes kept, the score, whether every trial's pass/fail and value agree
between off and on, and the incremental counts (segment runs skipped, sessions reused).

Cases: ``det`` = PP-OCRv4 det, 3 full images, default tolerance (relative L2 <= 1e-2); ``rec``
= PP-OCRv4 rec, the 32 crops of ``rec_crops/*/*``, CTC strings equal to FP32's; ``whisper`` =
Whisper tiny.en's encoder (``benchmarks/export_whisper.py``), 3 clips, per-frame cosine >= 0.99;
``zoo:NAME`` = ``.models/zoo/NAME`` (``benchmarks/zoo.py``), default tolerance.

Usage (repo root, ``../shared`` present)::

    python -m benchmarks run search_cost [--cases det,rec,whisper] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "benchmarks")]

from common import machine, results_path, write_results  # noqa: E402

SHARED = REPO.parent / "shared"
REC = SHARED / "models/ppocrv4/rec.onnx"
CASES = {
    "det": dict(model=SHARED / "models/ppocrv4/det.onnx", data=SHARED / "data/ocr/full_images",
                preprocess="ppocr-det"),
    "rec": dict(model=REC, data=SHARED / "data/ocr/rec_crops/*/*", preprocess="ppocr-rec",
                metric=f"ctc-string:charset={REC}"),
    "whisper": dict(model=REPO / ".models/whisper_enc_op14.onnx",
                    data=REPO / ".models/whisper_data", max_samples=3,
                    metric=str(REPO / "benchmarks/transformer_metrics.py") + ":min_cosine",
                    threshold=0.99),
}

CHILD = r"""
import json, sys, time
import precision_doctor as pd
from precision_doctor.graph.load import input_metadata, load_model
from precision_doctor.inputs import load_samples
from precision_doctor.repair import stages
from precision_doctor.runners.ort import OrtRunner
from precision_doctor.search import incremental
mode, case = sys.argv[1], json.loads(sys.argv[2])
if mode == "plain":
    model = load_model(case["model"])
    samples = load_samples(case["data"], input_metadata(model), case.get("preprocess"))
    samples = samples[:case.get("max_samples") or len(samples)]
    walls = []
    for arena in (False, True):
        t = time.perf_counter()
        with OrtRunner(model, cpu_mem_arena=arena) as r:
            for s in samples:
                r.run(s.feeds)
        walls.append(time.perf_counter() - t)
    print(json.dumps({"wall": walls[0], "wall_arena": walls[1], "samples": len(samples)}))
    sys.exit()
stages.SEARCH_INCREMENTAL = mode == "on"
counts = []
close = incremental.IncrementalEmulation.close
def spy(self):
    counts.append(dict(vars(self.counts), segments=len(self.segments)))
    close(self)
incremental.IncrementalEmulation.close = spy
args = {k: v for k, v in case.items() if k not in ("model", "data")}
t = time.perf_counter()
f = pd.fix(case["model"], case["data"], quiet=True, **args)
wall = time.perf_counter() - t
s = f.report["search"]
print(json.dumps({"wall": wall, "seconds": f.report["seconds"], "kept": s["kept"],
                  "evaluations": s["evaluations"], "samples_run": s.get("samples_run"),
                  "score": f.report.get("score_after"),
                  "trials": [(t["stage"], t["fp32_nodes"], t["passed"], t["value"])
                             for t in s.get("trials", [])],
                  "counts": counts[-1] if counts else None,
                  "peak_rss_mb": f.report["resources"].get("peak_rss_mb")}))
"""


def child(mode: str, case: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run([sys.executable, "-c", CHILD, mode,
                          json.dumps({k: str(v) if isinstance(v, Path) else v
                                      for k, v in case.items()})],
                         env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{mode} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def case_of(name: str) -> dict:
    if name.startswith("zoo:"):
        folder = REPO / ".models/zoo" / name[4:]
        return dict(model=folder / "model.onnx", data=folder / "inputs")
    return CASES[name]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="det,rec,whisper")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--suffix", default="")
    args = ap.parse_args(argv)
    print(f"load average at start: {os.getloadavg()}")
    results: dict[str, dict] = {}
    for name in args.cases.split(","):
        case = case_of(name)
        runs: dict[str, list[dict]] = {"plain": [], "off": [], "on": []}
        for _ in range(args.repeat):
            for mode in runs:
                runs[mode].append(child(mode, case))
        off, on = runs["off"][-1], runs["on"][-1]
        row = {m: statistics.median(r["wall"] for r in rs) for m, rs in runs.items()}
        row.update({
            "search_off": statistics.median(r["seconds"]["search"] for r in runs["off"]),
            "search_on": statistics.median(r["seconds"]["search"] for r in runs["on"]),
            "same_kept": all(r["kept"] == off["kept"] for r in runs["off"] + runs["on"]),
            "same_trials": [t[:3] for t in off["trials"]] == [t[:3] for t in on["trials"]],
            "max_trial_value_gap": max((abs(a[3] - b[3]) for a, b in
                                        zip(off["trials"], on["trials"])), default=0.0),
            "kept": on["kept"], "evaluations": [off["evaluations"], on["evaluations"]],
            "samples_run": [off["samples_run"], on["samples_run"]], "counts": on["counts"],
            "peak_rss_mb": [off["peak_rss_mb"], on["peak_rss_mb"]]})
        row["fix_over_plain"] = [row["off"] / row["plain"], row["on"] / row["plain"]]
        row["plain_arena"] = statistics.median(r["wall_arena"] for r in runs["plain"])
        row["fix_over_plain_arena"] = [row["off"] / row["plain_arena"],
                                       row["on"] / row["plain_arena"]]
        results[name] = {"row": row, "runs": runs}
        print(f"{name}: plain {row['plain']:.2f} s (with the CPU arena "
              f"{row['plain_arena']:.2f} s: fix on {row['fix_over_plain_arena'][1]:.1f}x); "
              f"fix off {row['off']:.1f} s "
              f"({row['fix_over_plain'][0]:.1f}x), on {row['on']:.1f} s "
              f"({row['fix_over_plain'][1]:.1f}x); search {row['search_off']:.1f} -> "
              f"{row['search_on']:.1f} s; evaluations {row['evaluations']}; kept {row['kept']}; "
              f"same trials {row['same_trials']} (value gap {row['max_trial_value_gap']:.2g}); "
              f"counts {row['counts']}; peak RSS {row['peak_rss_mb']} MB", flush=True)
    print(f"load average at end: {os.getloadavg()}")
    path = results_path("search_cost", suffix=args.suffix)
    write_results(path, {"machine": machine(), "command": "python -m benchmarks run search_cost "
                         + " ".join(argv if argv is not None else sys.argv[1:]),
                         "results": results})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
