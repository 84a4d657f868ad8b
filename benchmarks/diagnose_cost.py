"""What a change costs in ``diagnose`` wall time: this tree vs another (``--before``), side by side.

Each case runs ``precision_doctor.diagnose`` in a fresh subprocess (import excluded from the
timing), alternating the two source trees, ``--repeat`` times; the script prints the median
wall time of each, their ratio, the assessment kind and the attribution stage's own time.

Setup (e.g. the tree before causes were measured by cure, commit b30bedc):

    git worktree add /tmp/pd-before b30bedc
    python -m benchmarks run diagnose_cost --before /tmp/pd-before/src --repeat 3 \
        [--models det,rec,whisper,magika16,magika-bf16] [--json out.json]

Models and inputs (nothing is downloaded here): det/rec from ``../shared`` (PP-OCRv4, real
photos and text crops), Whisper tiny.en's encoder exported by ``benchmarks/export_whisper.py``
into ``.models/`` (9 real spoken-word clips; 3 used), Magika from the ``magika`` wheel with
real files as ``benchmarks/zoo.py`` prepares them (``.models/zoo/magika``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("PRECISION_DOCTOR_SHARED") or HERE.parent / "shared")

CASES = {
    "det": (SHARED / "models/ppocrv4/det.onnx", SHARED / "data/ocr/full_images",
            "ppocr-det", "fp16", 3),
    "rec": (SHARED / "models/ppocrv4/rec.onnx", SHARED / "data/ocr/rec_crops/paddleocr",
            "ppocr-rec", "fp16", None),
    "whisper": (HERE / ".models/whisper_enc_op14.onnx", HERE / ".models/whisper_data", None,
                "fp16", 3),
    "magika16": (HERE / ".models/zoo/magika/model.onnx", HERE / ".models/zoo/magika/inputs",
                 None, "fp16", None),
    "magika-bf16": (HERE / ".models/zoo/magika/model.onnx",
                    HERE / ".models/zoo/magika/inputs", None, "bf16", None),
}

CHILD = r"""
import json, sys, time
import precision_doctor as pd
model, data, pre, target, limit = json.loads(sys.argv[1])
t = time.perf_counter()
d = pd.diagnose(model, data, preprocess=pre, target=target, max_samples=limit, quiet=True)
wall = time.perf_counter() - t
print(json.dumps({"wall": wall, "kind": d.assessment.kind if d.assessment else None,
                  "timings": d.timings_s, "explained": d.explained_share}))
"""


def run_once(src: Path, case: tuple) -> dict:
    model, data, pre, target, limit = case
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", CHILD,
                          json.dumps([str(model), str(data), pre, target, limit])],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="src/ of the tree before")
    ap.add_argument("--after", type=Path, default=HERE / "src", help="src/ of this tree")
    ap.add_argument("--models", default="det,rec,whisper,magika16,magika-bf16")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    results = {}
    for name in args.models.split(","):
        case = CASES[name]
        if not Path(case[0]).is_file():
            print(f"{name}: {case[0]} missing, skipped")
            continue
        runs: dict[str, list[dict]] = {"before": [], "after": []}
        for _ in range(args.repeat):
            for label, src in (("before", args.before), ("after", args.after)):
                runs[label].append(run_once(src, case))
        med = {k: statistics.median(r["wall"] for r in v) for k, v in runs.items()}
        last = runs["after"][-1]
        results[name] = {"median_s": med, "ratio": med["after"] / med["before"],
                         "kind_before": runs["before"][-1]["kind"], "kind_after": last["kind"],
                         "attribution_s": last["timings"].get("attribution"),
                         "mechanisms_s": last["timings"].get("mechanisms"), "runs": runs}
        print(f"{name:12s} before {med['before']:7.1f} s ({results[name]['kind_before']}) | "
              f"after {med['after']:7.1f} s ({last['kind']}) | ratio {results[name]['ratio']:.2f}"
              f" | attribution {last['timings'].get('attribution', 0):.1f} s, mechanisms "
              f"{last['timings'].get('mechanisms', 0):.1f} s")
    print(f"load average at end: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
