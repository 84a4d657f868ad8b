"""Whether the attribution search's evaluation cap, not its wall-time budget, decides a verdict.

Magika 1.0.3 in BF16 (``benchmarks/zoo.py``'s 24 real files): its error is a cancelling variance
that only attribution finds (``diagnosis.causes.attribution``). ``diagnose`` runs on the zoo's
samples as they are, and with the ``shell_script`` sample replaced by the same script with one
line changed (its pytest line with ``--durations=30`` added), each with the evaluation cap
``attribution.MAX_EVALS`` at each of ``--caps``: the assessment, the attribution's status,
evaluations, seconds and the size of the set it kept.

Usage (repo root; the zoo prepared, or ``pip download`` possible)::

    python -m benchmarks run probes/attribution_budget [--caps 64,160] [--save]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "src"), str(REPO / "benchmarks")]

import numpy as np  # noqa: E402
import zoo  # noqa: E402
from common import save_probe  # noqa: E402

from precision_doctor.diagnosis.causes import attribution  # noqa: E402
from precision_doctor.diagnosis.diagnose import diagnose  # noqa: E402
from precision_doctor.formats import Precision  # noqa: E402
from precision_doctor.graph.load import input_metadata, load_model  # noqa: E402
from precision_doctor.inputs import load_samples  # noqa: E402
from precision_doctor.layerwise.candidates import emulated  # noqa: E402
from precision_doctor.precision.plan import PrecisionPlan  # noqa: E402


def run(model, samples, cap: int) -> dict:
    attribution.MAX_EVALS = cap
    report = diagnose(model, samples, Precision.BF16,
                      emulated(PrecisionPlan(Precision.BF16)), rewritten=False)
    a = report.attribution or {}
    return {"cap": cap, "assessment": report.assessment.kind,
            "defect_kind": report.assessment.evidence.get("defect_kind"),
            "status": a.get("status"), "evaluations": a.get("evaluations"),
            "seconds": a.get("seconds"), "kept_size": a.get("kept_size"),
            "explained_share": report.explained_share}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--caps", default="64,160")
    ap.add_argument("--save", action="store_true",
                    help="also write benchmarks/results/NAME_<date>_<machine>.json")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pd-attr-") as tmp:
        folder = zoo.prepare("magika", Path(tmp), cache=REPO / ".models" / "zoo" / "_cache")
        model = load_model(folder / "model.onnx")
        samples = load_samples(folder / "inputs", input_metadata(model))
        script = (REPO / zoo.FROZEN / "shell_script.txt").read_bytes()
        changed = script.replace(b"--dist worksteal tests\n",
                                 b"--dist worksteal tests --durations=30\n")
        assert changed != script
        cfg = json.loads(zoo.read_member(
            zoo.fetch("magika", "1.0.3", REPO / ".models" / "zoo" / "_cache"),
            "magika/models/standard_v3_3/config.min.json"))
        variant = []
        for s in samples:
            if s.name.startswith("shell_script"):
                x = zoo.magika_features(changed, cfg)
                assert x is not None
                s = replace(s, feeds={"bytes": x[None].astype(np.int32)})
            variant.append(s)
        caps = [int(c) for c in args.caps.split(",")]
        out = {"as_prepared": [run(model, samples, c) for c in caps],
               "one_line_changed": [run(model, variant, c) for c in caps]}
    print(json.dumps(out, indent=1))
    if args.save:
        save_probe("attribution_budget", argv, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
