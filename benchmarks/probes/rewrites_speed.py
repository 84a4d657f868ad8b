"""``apply_rewrites`` (BatchNorm folding, LayerNorm fusion, ...) now vs an older tree, side by
side: wall time per model and whether the rewritten models are byte-identical.

Each (tree, model) runs in a fresh subprocess ``--repeat`` times, alternating the trees; the
median is printed with the ratio and the SHA-1 of the rewritten model and of its records.

    git worktree add /tmp/pd-before 72e05bd      # the tree before the LayerNorm prefilter
    python benchmarks/probes/rewrites_speed.py --before /tmp/pd-before/src --repeat 3

Models: PP-OCRv4 det/rec/cls from ``../shared`` and the zoo models prepared by
``benchmarks/zoo.py`` (``.models/zoo``) where present.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("PRECISION_DOCTOR_SHARED") or HERE.parent / "shared")
ONE = r"""
import hashlib, json, sys, time
sys.path.insert(0, sys.argv[1])
import onnx
from precision_doctor.precision.rewrites import apply_rewrites
model = onnx.load(sys.argv[2])
t = time.perf_counter()
out, report = apply_rewrites(model)
wall = time.perf_counter() - t
records = json.dumps([str(r) for r in report.records])
print(json.dumps({"wall": wall, "model": hashlib.sha1(out.SerializeToString()).hexdigest()[:12],
                  "records": hashlib.sha1(records.encode()).hexdigest()[:12]}))
"""


def models() -> dict[str, Path]:
    out = {n: SHARED / f"models/ppocrv4/{n}.onnx" for n in ("det", "rec", "cls")}
    for p in sorted((HERE / ".models/zoo").glob("*/model.onnx")):
        out[p.parent.name] = p
    return {k: v for k, v in out.items() if v.is_file()}


def run(src: Path, model: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", ONE, str(src), str(model)], capture_output=True,
                          text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="src/ of the older tree")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    now = HERE / "src"
    results = {}
    for name, path in models().items():
        runs: dict[str, list[dict]] = {"before": [], "after": []}
        for _ in range(args.repeat):
            runs["before"].append(run(args.before, path))
            runs["after"].append(run(now, path))
        med = {k: statistics.median(r["wall"] for r in v) for k, v in runs.items()}
        same = (runs["before"][-1]["model"] == runs["after"][-1]["model"]
                and runs["before"][-1]["records"] == runs["after"][-1]["records"])
        results[name] = {"median_s": med, "identical": same, "runs": runs}
        print(f"{name:18s} before {med['before']:6.2f} s | after {med['after']:6.2f} s | "
              f"{med['before'] / max(med['after'], 1e-9):5.1f}x faster | identical {same}",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
