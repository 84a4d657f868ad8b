"""Layerwise benchmark: precision-doctor's layerwise comparison against the two plain
runs it starts from and against Polygraphy's ``--onnx-outputs mark all``, in one run.

Per model, on the same inputs (one Polygraphy ``--save-inputs`` JSON file that both tools
load):

* ``diagnose``: ``precision-doctor diagnose MODEL --data inputs.json --json report.json`` with
  the defaults (FP16 emulation, layerwise by segments, noise floor, findings). Its JSON
  ``timings_s`` gives ``reference`` and ``candidate`` (the two plain runs: ONNX Runtime CPU FP32
  and the FP16 emulator over every sample) and ``layerwise``.
* ``plain``: the same ``diagnose`` with ``--no-layerwise`` (what layerwise adds in memory).
* ``polygraphy``: ``polygraphy run MODEL --onnxrt --onnx-outputs mark all --load-inputs
  inputs.json --save-outputs outputs.json`` (every tensor of one runner, ONNX Runtime CPU).

Each runs in a fresh subprocess; wall time, CPU time and peak RSS are that process's
(``os.wait4`` rusage: interpreter start and imports included); "file" is the result file's
size. Models:

* ``det``: PP-OCRv4 det, the 3 images of ``shared/data/ocr/full_images``, ``ppocr-det``
  preprocessing at a fixed 640x640.
* ``rec``: PP-OCRv4 rec, the 32 text crops of ``shared/data/ocr/rec_crops/*/``, ``ppocr-rec``
  preprocessing (height 48, widths 320 to 1120: six input shapes); no Polygraphy run (every
  tensor of 32 samples would be a file of about 20 GB).
* ``minilm``: all-MiniLM-L6-v2 at opset 14 (``benchmarks/export_minilm.py``), batch 8 x 128
  tokens, when ``.models/minilm_op14.onnx`` exists.
* ``gen-N`` / ``gen-2N``: seeded residual conv stacks (Conv3x3-Relu-Conv3x3-Add-Relu blocks,
  32 channels at 160x160, 2 random samples), the second twice as deep as the first: peak RSS
  of ``diagnose`` should grow < 20% (bounded by one segment, not by the model).

The time ratio layerwise / (reference + candidate) is taken ``--repeat`` times on det, rec and
MiniLM (median printed). ``--before SRC`` (the ``src`` folder of another checkout, e.g. a
``git worktree`` of the commit before a change) runs that tree's ``diagnose`` right after each
of this tree's, on the same inputs: both ratios then see the same load on a shared machine.

Prints one table and the ratios; writes ``benchmarks/results/layerwise_<date>_<machine>.json``.

Usage (repo root, ``../shared`` present)::

    python -m benchmarks run layerwise [--skip-polygraphy] [--depth 12] [--models det,rec]
        [--repeat 3] [--before /tmp/pd-before/src]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "benchmarks")]

from common import measure_process, results_path, write_results  # noqa: E402

from precision_doctor.graph import input_metadata, load_model  # noqa: E402
from precision_doctor.inputs import load_samples  # noqa: E402
from precision_doctor.inputs.feeds import Sample  # noqa: E402
from precision_doctor.inputs.polygraphy import save_polygraphy_inputs  # noqa: E402


def generated_model(depth: int, channels: int = 32, seed: int = 0) -> onnx.ModelProto:
    """``depth`` residual blocks: Conv3x3 -> Relu -> Conv3x3 -> Add(skip) -> Relu."""
    rng = np.random.default_rng(seed)
    f = TensorProto.FLOAT
    nodes, inits, x = [], [], "x"
    for b in range(depth):
        for k in (1, 2):
            w = rng.normal(0, (2.0 / (9 * channels)) ** 0.5 / 2, (channels, channels, 3, 3))
            inits.append(numpy_helper.from_array(w.astype(np.float32), f"b{b}.w{k}"))
        nodes += [helper.make_node("Conv", [x, f"b{b}.w1"], [f"b{b}.c1"], f"b{b}/conv1",
                                   pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"b{b}.c1"], [f"b{b}.r1"], f"b{b}/relu1"),
                  helper.make_node("Conv", [f"b{b}.r1", f"b{b}.w2"], [f"b{b}.c2"],
                                   f"b{b}/conv2", pads=[1, 1, 1, 1]),
                  helper.make_node("Add", [f"b{b}.c2", x], [f"b{b}.s"], f"b{b}/add"),
                  helper.make_node("Relu", [f"b{b}.s"], [f"b{b}.y"], f"b{b}/relu2")]
        x = f"b{b}.y"
    shape = ["batch", channels, "h", "w"]
    graph = helper.make_graph(nodes, f"resnet{depth}",
                              [helper.make_tensor_value_info("x", f, shape)],
                              [helper.make_tensor_value_info(x, f, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def measure(cmd: list[str], log: Path, result: Path | None, ok: tuple[int, ...] = (0,),
            src: Path = REPO / "src") -> dict:
    """Run ``cmd`` in a fresh process: wall, CPU and peak RSS (os.wait4), result size.

    ``diagnose`` exits 1 when the verdict is "fail" (det in FP16): pass ``ok=(0, 1)``.
    ``src``: the package's source tree the process imports."""
    env = dict(os.environ, PYTHONPATH=str(src))
    run = measure_process(cmd, env=env, log=log)
    if run["returncode"] not in ok:
        raise SystemExit(f"{' '.join(cmd)} failed ({run['returncode']}); see {log}")
    return {"wall_s": run["wall_s"], "cpu_s": run["cpu_s"], "peak_rss_mb": run["peak_rss_mb"],
            "file_mb": round(result.stat().st_size / 1e6, 3) if result else None}


def cast_cost(model: onnx.ModelProto, samples: list) -> dict:
    """Share of the FP16 emulator's ONNX Runtime kernel time spent in its Cast round trips,
    with and without skipping the round trips of exact ops (Relu, Clip, ...), from ORT's
    profiler over every sample (after one warm-up run); outputs compared bit for bit."""
    import onnxruntime as ort

    from precision_doctor.formats import Precision
    from precision_doctor.precision import emulate_pass as emulate_module
    from precision_doctor.precision.emulate import emulate
    from precision_doctor.precision.plan import PrecisionPlan

    exact_ops = emulate_module.EXACT_OPS
    out, results = {}, {}
    for label, ops in (("skip_exact_ops", exact_ops), ("every_op", frozenset())):
        emulate_module.EXACT_OPS = ops
        try:
            emulated, _ = emulate(model, PrecisionPlan(Precision.FP16))
        finally:
            emulate_module.EXACT_OPS = exact_ops
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(tempfile.gettempdir()) / "pd_cast_profile")
        sess = ort.InferenceSession(emulated.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
        sess.run(None, samples[0].feeds)
        t0 = time.perf_counter()
        results[label] = [sess.run(None, x.feeds) for x in samples]
        wall = time.perf_counter() - t0
        prof = Path(sess.end_profiling())
        events = json.loads(prof.read_text())
        prof.unlink()
        runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
        start = runs[1]["ts"] if len(runs) > 1 else 0  # skip the warm-up run
        kernel = {}
        for e in events:
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= start:
                op = e["args"]["op_name"]
                kernel[op] = kernel.get(op, 0) + e["dur"]
        total = sum(kernel.values())
        out[label] = {"casts": sum(1 for n in emulated.graph.node if n.op_type == "Cast"),
                      "cast_share_of_kernel_time": round(kernel.get("Cast", 0) / total, 3),
                      "kernel_s": round(total / 1e6, 3), "wall_s": round(wall, 3)}
    out["identical_outputs"] = all(
        np.array_equal(a, b) for ra, rb in zip(results["skip_exact_ops"], results["every_op"])
        for a, b in zip(ra, rb))
    return out


def run_case(name: str, model_path: Path, samples: list, work: Path, polygraphy: bool,
             repeat: int = 1, before: Path | None = None) -> dict:
    inputs = save_polygraphy_inputs(samples, work / f"{name}_inputs.json", overwrite=True)
    pd = [sys.executable, "-m", "precision_doctor", "diagnose", str(model_path), "--data",
          str(inputs)]
    report = work / f"{name}_report.json"
    row: dict = {"model": name, "samples": len(samples),
                 "shapes": {k: list(v.shape) for k, v in samples[0].feeds.items()}}
    row["diagnose"] = measure([*pd, "--json", str(report), "--force"], work / f"{name}.log",
                              report, (0, 1))
    data = json.loads(report.read_text())
    row["timings_s"] = data["timings_s"]
    row["segments"] = data["layerwise"]["chunks"]
    row["mode"] = data["layerwise"]["mode"]
    plain = work / f"{name}_plain.json"
    row["plain"] = measure([*pd, "--no-layerwise", "--json", str(plain), "--force"],
                           work / f"{name}_plain.log", plain, (0, 1))
    if polygraphy:
        outputs = work / f"{name}_polygraphy.json"
        exe = shutil.which("polygraphy") or str(Path(sys.executable).parent / "polygraphy")
        row["polygraphy"] = measure([exe, "run", str(model_path), "--onnxrt", "--onnx-outputs",
                                     "mark", "all", "--load-inputs", str(inputs),
                                     "--save-outputs", str(outputs)],
                                    work / f"{name}_polygraphy.log", outputs)
        outputs.unlink()
    ratios = [_ratio(row["timings_s"])]
    rss = [row["diagnose"]["peak_rss_mb"]]
    runs_this = [{**row["diagnose"], "timings_s": row["timings_s"]}]
    runs_before: list[dict] = []
    for i in range(repeat):  # the ratio again, on a machine others may be loading
        if before is not None:  # the other tree right after this one's run, same inputs
            other = work / f"{name}_before{i}.json"
            run = measure([*pd, "--json", str(other), "--force"], work / f"{name}_b{i}.log",
                          other, (0, 1), before)
            runs_before.append({**run, "timings_s": json.loads(other.read_text())["timings_s"],
                                "load_average": os.getloadavg()})
        if i + 1 < repeat:
            again = work / f"{name}_report{i}.json"
            run = measure([*pd, "--json", str(again), "--force"], work / f"{name}_{i}.log",
                          again, (0, 1))
            ratios.append(_ratio(json.loads(again.read_text())["timings_s"]))
            rss.append(run["peak_rss_mb"])
            runs_this.append({**run, "timings_s": json.loads(again.read_text())["timings_s"]})
    row["layerwise_over_plain_runs"] = ratios[0]
    if repeat > 1:
        row["layerwise_over_plain_runs_repeats"] = ratios
        row["layerwise_over_plain_runs_median"] = float(np.median(ratios))
        row["diagnose_peak_rss_mb_repeats"] = rss
    if repeat > 1:
        row["runs"] = runs_this
        row["diagnose_wall_s_median"] = float(np.median([r["wall_s"] for r in runs_this]))
    if runs_before:
        row["before"] = {"src": str(before), "runs": runs_before,
                         "layerwise_over_plain_runs_median": float(np.median(
                             [_ratio(r["timings_s"]) for r in runs_before])),
                         "peak_rss_mb_max": max(r["peak_rss_mb"] for r in runs_before),
                         "diagnose_wall_s_median": float(np.median(
                             [r["wall_s"] for r in runs_before]))}
        # this tree's layerwise over the other tree's plain runs of the same repeat: a
        # denominator that this tree's work beside the plain runs (e.g. loading the
        # statistics kernel while they run) cannot inflate
        row["layerwise_over_before_plain_runs_median"] = float(np.median(
            [round(a["timings_s"]["layerwise"] / (b["timings_s"]["reference"]
                                                  + b["timings_s"]["candidate"]), 2)
             for a, b in zip(runs_this, runs_before)]))
    if polygraphy:
        row["polygraphy_rss_over_ours"] = round(
            row["polygraphy"]["peak_rss_mb"] / row["diagnose"]["peak_rss_mb"], 1)
    return row


def _ratio(t: dict) -> float:
    """layerwise / (reference + candidate) from a diagnosis' ``timings_s``."""
    return round(t["layerwise"] / (t["reference"] + t["candidate"]), 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", type=Path, default=REPO.parent / "shared")
    ap.add_argument("--minilm", type=Path, default=REPO / ".models/minilm_op14.onnx")
    ap.add_argument("--depth", type=int, default=12, help="depth of the shallower generated model")
    ap.add_argument("--skip-polygraphy", action="store_true")
    ap.add_argument("--models", default="det,rec,minilm,gen", help="comma-separated subset")
    ap.add_argument("--repeat", type=int, default=3,
                    help="diagnose runs on det, rec and MiniLM for the time ratio (median printed)")
    ap.add_argument("--before", type=Path, default=None,
                    help="src folder of another tree, run after each of this tree's diagnose "
                         "runs on det, rec and MiniLM (ratios under the same load)")
    ap.add_argument("--out", type=Path,
                    default=results_path("layerwise"))
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="pd-layerwise-bench-") as tmp:
        work = Path(tmp)
        chosen = set(args.models.split(","))
        if "det" in chosen:
            det = args.shared / "models/ppocrv4/det.onnx"
            samples = load_samples(args.shared / "data/ocr/full_images",
                                   input_metadata(load_model(det)),
                                   "ppocr-det:resize=fixed,size=640x640")
            rows.append(run_case("det", det, samples, work, not args.skip_polygraphy,
                                 args.repeat, args.before))
            rows[-1]["emulator_cast_cost"] = cast_cost(load_model(det), samples)
        if "rec" in chosen:
            rec = args.shared / "models/ppocrv4/rec.onnx"
            samples = load_samples(str(args.shared / "data/ocr/rec_crops/*/*"),
                                   input_metadata(load_model(rec)), "ppocr-rec")
            rows.append(run_case("rec", rec, samples, work, False, args.repeat, args.before))
        if "minilm" in chosen and args.minilm.is_file():
            data = args.minilm.parent / "minilm_inputs.npz"
            samples = load_samples(data, input_metadata(load_model(args.minilm)))
            rows.append(run_case("minilm", args.minilm, samples, work, not args.skip_polygraphy,
                                 args.repeat, args.before))
        rng = np.random.default_rng(0)
        gen_samples = [Sample(f"s{i}", {"x": rng.standard_normal((1, 32, 160, 160)).astype(
            np.float32)}) for i in range(2)]
        for depth in (args.depth, 2 * args.depth) if "gen" in chosen else ():
            path = work / f"gen{depth}.onnx"
            onnx.save(generated_model(depth), str(path))
            rows.append(run_case(f"gen-{depth}", path, gen_samples, work,
                                 not args.skip_polygraphy))
    summary = {}
    if "gen" in chosen:
        shallow, deep = rows[-2], rows[-1]
        summary["rss_growth_twice_as_deep"] = round(
            deep["diagnose"]["peak_rss_mb"] / shallow["diagnose"]["peak_rss_mb"] - 1, 3)
    if "gen" in chosen and not args.skip_polygraphy:
        summary["polygraphy_rss_growth_twice_as_deep"] = round(
            deep["polygraphy"]["peak_rss_mb"] / shallow["polygraphy"]["peak_rss_mb"] - 1, 3)
    _print(rows, summary)
    write_results(args.out, {"load_average_at_end": os.getloadavg(), "rows": rows,
                             "summary": summary})
    print(f"written {args.out}")


def _print(rows: list[dict], summary: dict) -> None:
    head = (f"{'model':<8} {'run':<11} {'wall s':>7} {'cpu s':>7} {'RSS MB':>7} {'file MB':>8}"
            "   notes")
    print(head)
    print("-" * len(head))
    for r in rows:
        t = r["timings_s"]
        notes = {"diagnose": f"{r['mode']}, {r['segments']} segment(s); timings_s ref "
                             f"{t['reference']} + cand {t['candidate']} vs layerwise "
                             f"{t['layerwise']}: {r['layerwise_over_plain_runs']}x",
                 "plain": "diagnose --no-layerwise",
                 "polygraphy": f"mark all: {r.get('polygraphy_rss_over_ours', '?')}x our RSS"}
        for run in ("diagnose", "plain", "polygraphy"):
            if run not in r:
                continue
            m = r[run]
            file_mb = f"{m['file_mb']:.3f}" if m["file_mb"] is not None else "-"
            print(f"{r['model']:<8} {run:<11} {m['wall_s']:>7.2f} {m['cpu_s']:>7.2f} "
                  f"{m['peak_rss_mb']:>7} {file_mb:>8}   {notes[run]}")
    for r in rows:
        if "emulator_cast_cost" in r:
            print(f"{r['model']} FP16 emulator Cast round trips:",
                  json.dumps(r["emulator_cast_cost"]))
    print("ratios:", json.dumps({r["model"]: {k: r[k] for k in r if k.endswith(("_plain_runs",
                                                                          "_median", "_over_ours"))}
                                 for r in rows}), json.dumps(summary))
    for r in rows:
        if "before" in r:
            b = r["before"]
            print(f"{r['model']} before ({b['src']}): median ratio "
                  f"{b['layerwise_over_plain_runs_median']}, peak RSS {b['peak_rss_mb_max']} MB;"
                  f" this tree: median {r.get('layerwise_over_plain_runs_median')}, peak RSS "
                  f"{max(r.get('diagnose_peak_rss_mb_repeats', [r['diagnose']['peak_rss_mb']]))}"
                  f" MB, over the other tree's plain runs "
                  f"{r.get('layerwise_over_before_plain_runs_median')}; diagnose wall median "
                  f"{b['diagnose_wall_s_median']} -> {r.get('diagnose_wall_s_median')} s")


if __name__ == "__main__":
    main()
