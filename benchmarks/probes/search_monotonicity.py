"""How far ``fix``'s search can trust "more FP32 never hurts", on a real search's own trials.

Runs ``precision_doctor.fix`` on one case of ``benchmarks/search_cost.py`` (default ``det``)
with a spy on the search's evaluator, which records every evaluation: its FP32 node set, pass or
fail, value, samples run and seconds. Then, over the trials in order:

* **inferable failures**: trials whose set is a subset of a set that failed before (valid on
  every sample). If more FP32 never hurt, each of them would fail too and could be skipped;
  ``violations`` counts those that passed instead, and ``seconds_inferable`` what skipping
  them all would have saved;
* **inferable passes**: trials whose set is a superset of a set that passed before on every
  sample; ``violations`` counts those that failed.

A search that skipped inferable trials would take other paths whenever a violation occurs, so
it would not give the same plan. Also printed: how the search's seconds split between the
samples' runs (the runs of the largest input, the others) and the rest (opening each plan's
runner, scoring), from ``OrtRunner.run`` timed during the search.

Usage (repo root, ``../shared`` present)::

    python -m benchmarks run probes/search_monotonicity [--case det] [--save]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "src"), str(REPO / "benchmarks")]

import numpy as np  # noqa: E402
from common import save_probe  # noqa: E402
from search_cost import case_of  # noqa: E402

import precision_doctor as pd  # noqa: E402
from precision_doctor.runners.ort import OrtRunner  # noqa: E402
from precision_doctor.search import bisection  # noqa: E402


def record(case: dict) -> tuple[list[dict], list[tuple[int, float]], dict]:
    """Run ``fix`` on ``case``; the trials, the (input elements, seconds) of each sample run
    inside the search, and the report's stage seconds."""
    trials: list[dict] = []
    runs: list[tuple[int, float]] = []
    in_search = [False]
    call, run = bisection._Evaluator.__call__, OrtRunner.run

    def spy_call(self, nodes, stage, complete=False, then=None):
        n = len(self.trials)
        in_search[0] = True
        try:
            score = call(self, nodes, stage, complete, then)
        finally:
            in_search[0] = False
        if len(self.trials) > n:
            t = self.trials[-1]
            trials.append({"nodes": sorted(nodes), "stage": stage, "passed": score.passed,
                           "value": score.value, "samples": t.samples, "seconds": t.seconds,
                           "all_samples": complete or self.active is None})
        return score

    def spy_run(self, feeds, output_names=None):
        t = time.perf_counter()
        out = run(self, feeds, output_names)
        if in_search[0]:
            runs.append((sum(int(np.asarray(v).size) for v in feeds.values()),
                         time.perf_counter() - t))
        return out

    bisection._Evaluator.__call__, OrtRunner.run = spy_call, spy_run
    try:
        args = {k: v for k, v in case.items() if k not in ("model", "data")}
        result = pd.fix(str(case["model"]), str(case["data"]), quiet=True, **args)
    finally:
        bisection._Evaluator.__call__, OrtRunner.run = call, run
    return trials, runs, result.report["seconds"]


def inferences(trials: list[dict]) -> dict:
    """Count the trials monotonicity would have decided, and its violations."""
    failed: list[frozenset] = []
    passed: list[frozenset] = []
    fail = {"trials": 0, "violations": 0, "seconds_inferable": 0.0}
    ok = {"trials": 0, "violations": 0}
    for t in trials:
        key = frozenset(t["nodes"])
        if any(key <= f for f in failed):
            fail["trials"] += 1
            fail["seconds_inferable"] += t["seconds"]
            fail["violations"] += t["passed"]
        if any(key >= p for p in passed):
            ok["trials"] += 1
            ok["violations"] += not t["passed"]
        if not t["passed"]:
            failed.append(key)
        elif t["all_samples"]:
            passed.append(key)
    return {"inferable_failures": fail, "inferable_passes": ok}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="det")
    ap.add_argument("--save", action="store_true",
                    help="also write benchmarks/results/NAME_<date>_<machine>.json")
    args = ap.parse_args(argv)
    trials, runs, seconds = record(case_of(args.case))
    largest = max((n for n, _ in runs), default=0)
    big = [s for n, s in runs if n == largest]
    other = [s for n, s in runs if n != largest]
    split = {"search_s": seconds.get("search"), "sample_runs": len(runs),
             "largest_input_runs": len(big), "largest_input_s": sum(big),
             "largest_input_run_median_s": float(np.median(big)) if big else None,
             "other_runs": len(other), "other_s": sum(other)}
    split["rest_s"] = (split["search_s"] or 0.0) - sum(big) - sum(other)
    out = {"case": args.case, "evaluations": len(trials), **inferences(trials),
           "search_split": split, "stage_seconds": seconds,
           "trials": [{k: v for k, v in t.items() if k != "nodes"}
                      | {"fp32_nodes": len(t["nodes"])} for t in trials]}
    print(json.dumps({k: v for k, v in out.items() if k != "trials"}, indent=1))
    if args.save:
        save_probe("search_monotonicity", argv, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
