"""Mixed-precision search benchmark: precision-doctor ``fix`` against
onnxconverter-common ``auto_convert_mixed_precision`` and NVIDIA ModelOpt AutoCast.

Same FP32 model, same real inputs, same accuracy target, FP16 with FP32 graph inputs/outputs:

* det (PP-OCRv4 text detector): the 3 images of ``shared/data/ocr/full_images`` with the
  ``ppocr-det`` preprocessing; target: binary-mask IoU at DBPostProcess's 0.3 >= 0.99 on every
  image. ``det-tol``: the same data with ``fix``'s default target (no ``--metric``): output
  relative L2 <= 1e-2 over all images.
* rec (PP-OCRv4 text recognizer): the crops of ``shared/data/ocr/rec_crops/*/``, ``ppocr-rec``
  preprocessing; target: CTC greedy strings equal to FP32's on every crop.

How each tool gets the data and the target:

* precision-doctor: ``fix(model, samples, FP16, Objective(metric, threshold))``: every sample.
* onnxconverter-common: one feed dict only (its API), so the first sample; the target as its
  ``validate_fn`` (same metric and threshold on that one sample).
* AutoCast: has no accuracy target (it keeps nodes FP32 by reference-run magnitude rules,
  ``data_max=512``, ``init_max=65504``); calibration data: one ``.npz`` per sample (its
  multi-batch folder form). It needs onnx 1.21 / onnxruntime-gpu 1.24, so it runs in its own
  virtual environment (``--modelopt-python``).

Each tool runs in a fresh subprocess; wall time, CPU time (user + system: less sensitive than
wall time to other jobs on a shared machine) and peak RSS (``os.wait4`` rusage) are of that
process (interpreter start and imports included). Each output model is then measured the same way
here: ONNX Runtime CPU on every sample (relative L2 vs FP32, task metric), compute nodes left
FP32 (a compute node, ``search.cost.compute_nodes``, whose float outputs are float32 by ONNX
type inference), and their share of FLOPs (``search.cost.node_costs``).

Usage (repo root, ``../shared`` present)::

    pip install onnxconverter-common rapidocr_onnxruntime==1.4.4
    python3 -m venv --system-site-packages /tmp/venv-modelopt
    /tmp/venv-modelopt/bin/pip install "nvidia-modelopt[onnx]"
    python3 benchmarks/search.py --model det --modelopt-python /tmp/venv-modelopt/bin/python

It prints the command, a table, each tool's wall-time and peak-RSS ratios and the load average
(other jobs on the machine inflate every wall time: re-run on an idle machine to compare).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from search_table import print_table  # noqa: E402

SHARED = REPO.parent / "shared"
TOOLS = ("precision-doctor", "onnxconverter-common", "autocast")
# optional: fix evaluating every candidate plan with ONNX Runtime CPU (``--runner ort:cpu``), the
# engine the other two tools validate on, instead of the default FP16 engine emulator
EXTRA_TOOLS = ("precision-doctor-ortcpu",)
TASKS = {
    "det": {"model": "models/ppocrv4/det.onnx", "data": "data/ocr/full_images",
            "preprocess": "ppocr-det", "metric": "mask-iou:threshold=0.3", "threshold": 0.99},
    "rec": {"model": "models/ppocrv4/rec.onnx", "data": "data/ocr/rec_crops/*/*",
            "preprocess": "ppocr-rec", "metric": "ctc-string:charset={model}",
            "threshold": 1.0},
    # the end-to-end target: RapidOCR's own boxes identical on every image (tools that take a
    # target get this one; run with --tools precision-doctor-ortcpu,autocast: a validate_fn
    # this strict sends onnxconverter-common through every segment)
    "det-boxes": {"model": "models/ppocrv4/det.onnx", "data": "data/ocr/full_images",
                  "preprocess": "ppocr-det", "metric": "db-boxes", "threshold": 1.0},
    # the default target of `fix` (no --metric): relative L2 of the output <= 1e-2 (FP16's
    # default tolerance) over all samples; onnxconverter-common gets it as its validate_fn
    "det-tol": {"model": "models/ppocrv4/det.onnx", "data": "data/ocr/full_images",
                "preprocess": "ppocr-det", "metric": None, "rel_l2": 1e-2},
}


def task_spec(name: str, shared: Path) -> dict:
    spec = dict(TASKS[name])
    spec["model"] = str(shared / spec["model"])
    spec["data"] = str(shared / spec["data"])
    if spec["metric"]:
        spec["metric"] = spec["metric"].format(model=spec["model"])
    return spec



# ---------------------------------------------------------------- transformer case (Whisper)
# Whisper tiny.en encoder exported at opset 14 (decomposed LayerNorm) by
# benchmarks/export_whisper.py, with its 9 real speech clips, both under .models/ (absolute paths:
# task_spec's `shared / path` keeps them). Its last LayerNorm squares |x - mean| up to 632 on real
# speech: FP16 statistics overflow. Target: per-frame cosine of the hidden states >= 0.99.
TASKS["whisper"] = {
    "model": str(REPO / ".models" / "whisper_enc_op14.onnx"),
    "data": str(REPO / ".models" / "whisper_data"), "preprocess": None,
    "metric": str(REPO / "benchmarks" / "transformer_metrics.py") + ":min_cosine",
    "threshold": 0.99}

# ---------------------------------------------------------------- workers (one per subprocess)

def _samples(spec: dict):
    from precision_doctor.graph.load import input_metadata, load_model
    from precision_doctor.inputs import load_samples

    model = load_model(spec["model"])
    return model, load_samples(spec["data"], input_metadata(model), spec["preprocess"])


def _sample_metric(spec: dict):
    """``f(ref_outputs, cand_outputs, sample) -> float`` on one sample (name -> array dicts);
    for a tolerance task: 1 - rel_l2 / bound (>= 0 meets it, the threshold is 0)."""
    from precision_doctor.compare.metrics import relative_l2
    from precision_doctor.compare.tasks.registry import evaluate_metric, get_metric, sample_context

    if not spec["metric"]:
        return lambda ref, cand, sample: min(
            1.0 - relative_l2([ref[k]], [cand[k]]) / spec["rel_l2"] for k in ref)
    metric = get_metric(spec["metric"])
    return lambda ref, cand, sample: evaluate_metric(metric, ref, cand, sample_context(sample))


def _threshold(spec: dict) -> float:
    return spec["threshold"] if spec["metric"] else 0.0


def worker_ours(spec: dict, out: Path, ort_cpu: bool = False, jobs: int = 1) -> dict:
    import onnx

    from precision_doctor.compare.tasks.registry import get_metric
    from precision_doctor.compare.tolerance import Tolerance
    from precision_doctor.formats import Precision
    from precision_doctor.repair.pipeline import fix
    from precision_doctor.search.objective import Objective

    model, samples = _samples(spec)
    if spec["metric"]:
        objective = Objective(metric=get_metric(spec["metric"]), threshold=spec["threshold"])
    else:
        objective = Objective(tolerances={"*": Tolerance(rel_l2=spec["rel_l2"])})
    runner = None
    if ort_cpu:
        from precision_doctor.runners.ort import OrtRunner

        def runner(m, intra_op_threads=0):
            return OrtRunner(m, ("cpu",), name="ort-cpu", intra_op_threads=intra_op_threads)
    result = fix(model, samples, Precision.FP16, objective, runner=runner, jobs=jobs)
    onnx.save(result.model, str(out))
    return {"evaluations": result.search.evaluations, "passed": result.passed,
            "self_reported_share": result.share, "kept": list(result.search.kept),
            "resources": result.resources, "seconds": result.seconds}


def worker_occ(spec: dict, out: Path) -> dict:
    import onnx
    from onnxconverter_common.auto_mixed_precision import auto_convert_mixed_precision

    model, samples = _samples(spec)
    names = [o.name for o in model.graph.output]
    metric = _sample_metric(spec)
    calls = [0]

    def validate(res0, res1) -> bool:  # the same target, on its single feed
        calls[0] += 1
        return metric(dict(zip(names, res0)), dict(zip(names, res1)),
                      samples[0]) >= _threshold(spec)

    fixed = auto_convert_mixed_precision(model, dict(samples[0].feeds), validate,
                                         keep_io_types=True)
    onnx.save(fixed, str(out))
    # one call validates FP32 against itself; the others are conversion attempts
    return {"evaluations": calls[0] - 1, "feed": samples[0].name}


def worker_autocast(spec: dict, out: Path, calib: Path) -> dict:
    import onnx
    from modelopt.onnx.autocast import convert_to_mixed_precision

    fixed = convert_to_mixed_precision(onnx_path=spec["model"], low_precision_type="fp16",
                                       keep_io_types=True, calibration_data=str(calib),
                                       providers=["cpu"])
    onnx.save(fixed, str(out))
    return {"evaluations": 1, "note": "one reference run per calibration sample, no search"}


def run_worker(args: argparse.Namespace) -> int:
    spec = task_spec(args.model, args.shared)
    out, info_path = args.out / f"{args.worker}.onnx", args.out / f"{args.worker}.json"
    if args.worker.startswith("precision-doctor"):
        info = worker_ours(spec, out, ort_cpu=args.worker.endswith("ortcpu"), jobs=args.jobs)
    elif args.worker == "onnxconverter-common":
        info = worker_occ(spec, out)
    else:
        info = worker_autocast(spec, out, args.out / "calib")
    info_path.write_text(json.dumps(info, indent=1))
    return 0


# ---------------------------------------------------------------- parent: run and measure

def launch(tool: str, args: argparse.Namespace, timeout_s: float) -> dict:
    """Run one tool's worker in a subprocess; wall time, peak RSS, exit state."""
    python = args.modelopt_python if tool == "autocast" else sys.executable
    cmd = [str(python), str(Path(__file__).resolve()), "--worker", tool, "--model", args.model,
           "--shared", str(args.shared), "--out", str(args.out), "--jobs", str(args.jobs)]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src") if tool != "autocast" else "")
    for stale in (args.out / f"{tool}.json", args.out / f"{tool}.onnx"):
        stale.unlink(missing_ok=True)
    sys.path.insert(0, str(REPO / "benchmarks"))
    from common import measure_process

    run = measure_process(cmd, env=env, timeout=timeout_s, log=args.out / f"{tool}.log")
    timed_out = run["timed_out"]
    info_path = args.out / f"{tool}.json"
    info = json.loads(info_path.read_text()) if info_path.exists() and not timed_out else {}
    return {"tool": tool, "wall_s": round(run["wall_s"], 1), "cpu_s": round(run["cpu_s"], 1),
            "peak_rss_mb": run["peak_rss_mb"], "exit": run["returncode"], "timed_out": timed_out,
            **info}


def fp32_compute_nodes(model) -> list[str]:
    """Compute nodes whose float outputs are float32 (ONNX type inference)."""
    import onnx

    from precision_doctor.search.cost import compute_nodes

    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    types = {vi.name: vi.type.tensor_type.elem_type
             for vi in (*g.value_info, *g.input, *g.output)}
    types.update({t.name: t.data_type for t in g.initializer})
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
              onnx.TensorProto.DOUBLE}
    names = []
    for node in compute_nodes(inferred):
        outs = [types.get(o) for o in node.output if types.get(o) in floats]
        if outs and all(t == onnx.TensorProto.FLOAT for t in outs):
            names.append(node.name)
    return names


def measure(model_path: Path, spec: dict, samples, reference: dict) -> dict:
    """Run a converted model on every sample with ORT CPU and measure it against FP32."""
    import numpy as np
    import onnx

    from precision_doctor.compare.metrics import compute_metrics
    from precision_doctor.runners.ort import OrtRunner
    from precision_doctor.search.cost import fp32_share, node_costs

    model = onnx.load(str(model_path))
    names = list(reference)
    outs: dict[str, list] = {n: [] for n in names}
    with OrtRunner(model, name=model_path.stem) as runner:
        for s in samples:
            res = runner.run(s.feeds)
            for n in names:
                outs[n].append(np.asarray(res[n], np.float32))
    metric = _sample_metric(spec)
    per_sample = [metric({n: reference[n][i] for n in names}, {n: outs[n][i] for n in names},
                         samples[i]) for i in range(len(samples))]
    fp32 = fp32_compute_nodes(model)
    shapes = {k: v.shape for k, v in samples[0].feeds.items()}
    share = fp32_share(model, fp32, node_costs(model, shapes))
    rel_l2 = max(compute_metrics(reference[n], outs[n]).rel_l2 for n in names)
    met = (all(v >= _threshold(spec) for v in per_sample) if spec["metric"]
           else rel_l2 <= spec["rel_l2"])
    return {"rel_l2": rel_l2,
            "metric_min": min(per_sample), "metric_per_sample": per_sample, "met_on_all": met,
            "fp32_nodes": share["fp32_nodes"], "compute_nodes": share["compute_nodes"],
            "fp32_flops": share["flops"], "outputs": outs}


def ocr_identity(det_paths: dict[str, Path], shared: Path) -> dict[str, str]:
    """RapidOCR on the full images with each det model: identical boxes/texts vs FP32."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ocr_end_to_end import compare, run_rapidocr

    images = sorted((shared / "data/ocr/full_images").iterdir())
    ref = run_rapidocr(shared / "models/ppocrv4/det.onnx", images)
    result = {}
    for tool, path in det_paths.items():
        runs = run_rapidocr(path, images)
        cmp = [compare(r, c) for r, c in zip(ref, runs)]
        result[tool] = (f"boxes {sum(c['boxes_equal'] for c in cmp)}/{len(cmp)}, "
                        f"texts {sum(c['texts_equal'] for c in cmp)}/{len(cmp)}")
    return result


def ctc_flips(spec: dict, samples, reference: dict, outs: dict) -> list[str]:
    """Crops whose CTC decoding differs from FP32's, with the FP32 margin."""
    from precision_doctor.compare.tasks.ocr import ctc_details

    flips = []
    name = next(iter(reference))
    for i, s in enumerate(samples):
        d = ctc_details({name: reference[name][i]}, {name: outs[name][i]},
                        charset=spec["model"])[0]
        if not d.equal:
            flips.append(f"{s.name}: {d.reference_text!r} -> {d.candidate_text!r} "
                         f"(FP32 margin {d.reference_margin:.3g})")
    return flips


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="mixed-precision search benchmark")
    ap.add_argument("--model", choices=sorted(TASKS), default="det")
    ap.add_argument("--shared", type=Path, default=SHARED)
    ap.add_argument("--tools", default=",".join(TOOLS),
                    help=f"comma-separated, from {', '.join(TOOLS + EXTRA_TOOLS)}")
    ap.add_argument("--out", type=Path, default=None, help="work folder (default: a temp dir)")
    ap.add_argument("--occ-timeout", type=float, default=1200.0,
                    help="seconds before onnxconverter-common is stopped "
                         "(onnxconverter-common issue #251: slow)")
    ap.add_argument("--timeout", type=float, default=1200.0, help="the other tools' limit")
    ap.add_argument("--modelopt-python", default=sys.executable,
                    help="interpreter with nvidia-modelopt[onnx] installed")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--jobs", type=int, default=1, help="precision-doctor fix --jobs")
    ap.add_argument("--worker", choices=TOOLS + EXTRA_TOOLS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix=f"pd-search-{args.model}-"))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.worker:
        return run_worker(args)
    print("command: " + " ".join([Path(sys.executable).name, *sys.argv]), flush=True)

    sys.path.insert(0, str(REPO / "src"))
    import numpy as np

    from precision_doctor.layerwise.candidates import reference_factory

    spec = task_spec(args.model, args.shared)
    model, samples = _samples(spec)
    (args.out / "calib").mkdir(exist_ok=True)
    for i, s in enumerate(samples):  # AutoCast's multi-batch calibration folder
        np.savez(args.out / "calib" / f"{i:03d}.npz", **s.feeds)
    names = [o.name for o in model.graph.output]
    reference: dict[str, list] = {n: [] for n in names}
    with reference_factory(model) as runner:
        for s in samples:
            res = runner.run(s.feeds)
            for n in names:
                reference[n].append(np.asarray(res[n], np.float32))

    rows = []
    for tool in args.tools.split(","):
        limit = args.occ_timeout if tool == "onnxconverter-common" else args.timeout
        print(f"running {tool} (limit {limit:.0f} s) ...", flush=True)
        row = launch(tool, args, limit)
        path = args.out / f"{tool}.onnx"
        if row["exit"] == 0 and path.exists():
            m = measure(path, spec, samples, reference)
            if args.model == "rec":
                m["flips"] = ctc_flips(spec, samples, reference, m["outputs"])
            del m["outputs"]
            row.update(m, model_path=str(path))
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "metric_per_sample"}), flush=True)
    if args.model.startswith("det"):
        done = {r["tool"]: Path(r["model_path"]) for r in rows if "model_path" in r}
        for tool, text in ocr_identity(done, args.shared).items():
            next(r for r in rows if r["tool"] == tool)["ocr_identical"] = text
    print_table(args.model, spec, len(samples), rows)
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "target": spec, "rows": rows},
                                        indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    if "--worker" in sys.argv and "autocast" not in sys.argv:
        sys.path.insert(0, str(REPO / "src"))
    sys.exit(main())
