"""INT8/FP8 quantization: precision-doctor ``fix --target int8|fp8`` against two anchor tools,
ONNX Runtime ``quantize_static`` and NVIDIA ModelOpt ONNX PTQ, on the same models, the same
calibration samples and the same evaluation.

Models and samples (calibration = evaluation samples, as ``fix`` itself uses them):

* ``cls``: PP-OCRv4 text-direction classifier (``shared/models/ppocrv4/cls.onnx``), 16 of the
  crops of ``shared/data/ocr/rec_crops/*/`` (every other one, sorted), ``ppocr-cls``
  preprocessing ([1, 3, 48, 192]); task metric ``top1`` (identical class on every crop).
* ``rec``: PP-OCRv4 recognizer, the same 16 crops, ``ppocr-rec:max-width=320`` ([1, 3, 48, 320]:
  fixed so every tool can stack them); ``ctc-string`` (CTC greedy string agreement, >= 0.95 on
  every crop, the metric's default).
* ``det``: PP-OCRv4 DB text detector, the 5 images of ``shared/data/ocr/full_images`` and
  ``misc`` resized to 640x640 (``ppocr-det:resize=fixed,size=640x640``); ``mask-iou:threshold=0.3``
  (DBPostProcess's binary mask, IoU >= 0.95 on every image); ``db-boxes`` is reported too.
* ``minilm``: all-MiniLM-L6-v2 at opset 17 (``.models/minilm_op17.onnx``, exported by
  ``benchmarks/export_minilm.py``), its 16 sentences (``.models/minilm_data/batch*.npz``) as 16
  samples of batch 1 x 128 tokens; ``benchmarks/transformer_metrics.py:min_cosine`` >= 0.99
  (every token's hidden vector).
* ``yolo``: YOLOv8n (``nudenet==3.4.2``'s ``320n.onnx``, see ``tests/real_detectors.py``), its 6
  photos, ``ultralytics:size=320x320``; ``box-map`` (mAP@0.5 against FP32's boxes, >= 0.95).

Every tool gets the FP32 model with its nodes named (``api.options.as_model``), so that the
layers each one leaves unquantized can be compared by name.

Tools (each in a fresh subprocess; wall time, CPU time and peak RSS of that process from
``common.measure_process``, interpreter start and imports included, plus the tool's own
in-process seconds):

* ``pd``: ``precision_doctor.fix_quantized(model, samples, target=int8|fp8, metric=...,
  threshold=..., calibrator="max")``: the fewest layers left unquantized (FP16 between the Q/DQ
  pairs, plus the nodes FP16 needs in FP32 when the float part fails alone) that meet the task
  metric on every sample. Not run by default: ``pd-l2``, the same with ``fix``'s default target
  (relative L2 <= 0.1 on every output); ``pd-fp32``, FP32 between the pairs
  (``quant.fix.fix_quantized(..., between=Precision.FP32)``).
* ``ort-minmax``, ``ort-entropy``, ``ort-percentile`` (INT8), ``ort-distribution`` (FP8: the only
  calibration ``quantize_static`` accepts for float8): ``onnxruntime.quantization.quantize_static``
  with ``QuantFormat.QDQ``, ``per_channel=True``, activations and weights QInt8 (or
  QFLOAT8E4M3FN), its other defaults (asymmetric activations, every op type it can quantize, no
  ``quant_pre_process`` so that node names stay comparable). It has no accuracy target. Its
  Entropy calibrator builds 128-bin histograms for 128 quantized bins (``create_calibrator``
  defaults, not settable through ``quantize_static``), so it can only pick the full range unless
  a later sample widens a histogram: then it equals MinMax. FP8 fails on any quantized Softmax
  (its output range is set without the avg/std the FP8 scale needs, ORT 1.32): the run is
  retried with the Softmax nodes in ``nodes_to_exclude`` and the row says so.
* ``modelopt-max``, ``modelopt-entropy``: ``modelopt.onnx.quantization.quantize(onnx_path,
  quantize_mode=int8|fp8, calibration_data={input: stacked samples}, calibration_method=...,
  calibration_eps=["cpu"], output_path=...)``, its defaults otherwise (it has no accuracy
  target; its own rules decide which nodes stay unquantized; FP16 between the pairs, its
  ``high_precision_dtype`` default; ``modelopt-max-fp32``, not run by default: FP32). It needs
  onnxruntime-gpu and its
  own onnx, so it runs in a separate virtual environment (``--modelopt-python``, default
  ``.venv-anchors/bin/python``, git-ignored)::

      python3 -m venv .venv-anchors && .venv-anchors/bin/pip install "nvidia-modelopt[onnx]"

  When that environment is missing or the tool fails, the failure is recorded in the row.

Evaluation, the same for every output model: ONNX Runtime CPU with
``graph_optimization_level=ORT_ENABLE_BASIC`` (the extended level's Q/DQ fusions change FP8 Q/DQ
semantics) and its ``WeightBiasQuantization`` transformer disabled (at the basic level it turns a
Conv/Gemm bias into int32 Q/DQ with scale x_scale * w_scale computed in the bias's type: with
FP16 scales the quotient overflows and the output is ruined), on every sample, against the FP32
model on the same session options: relative L2 per output (over all samples), the task metric
(worst sample, per sample, samples meeting the threshold), and the unquantized layers:
Conv/ConvTranspose/MatMul/Gemm nodes none of whose inputs comes from a DequantizeLinear (through
Cast/Identity/Reshape/Transpose/Flatten/Squeeze/Unsqueeze only), with their names; Q/DQ scales
that are NaN, inf or 0. ``raw BASIC`` (column and ``raw_basic``): max relative L2 / worst metric
with that transformer left on, as a plain ``ORT_ENABLE_BASIC`` session runs the model.

Usage (repository root; ``../shared`` present)::

    python -m benchmarks run quant_anchors                       # cls, rec, det, minilm; int8, fp8
    python -m benchmarks run quant_anchors --models cls --formats int8 --tools pd,ort-minmax
    python -m benchmarks run quant_anchors --models yolo --merge  # add rows to today's file

Prints a table and writes ``benchmarks/results/quant_anchors_<date>_<machine>.json`` (``--merge``:
rows of an existing file for other (model, format, tool) are kept). Output models and logs go
to ``--work`` (default: a temporary folder, kept with ``--keep``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
sys.path[:0] = [str(REPO / "benchmarks")]

from common import measure_process, results_path, write_results  # noqa: E402

MODELOPT_PYTHON = REPO / ".venv-anchors" / "bin" / "python"
MODELS = {
    "cls": {"model": SHARED / "models/ppocrv4/cls.onnx", "data": "ocr-crops",
            "preprocess": "ppocr-cls", "metric": "top1", "threshold": 0.99},
    "rec": {"model": SHARED / "models/ppocrv4/rec.onnx", "data": "ocr-crops",
            "preprocess": "ppocr-rec:max-width=320", "metric": "ctc-string:charset={model}",
            "threshold": 0.95},
    "det": {"model": SHARED / "models/ppocrv4/det.onnx", "data": "ocr-full",
            "preprocess": "ppocr-det:resize=fixed,size=640x640",
            "metric": "mask-iou:threshold=0.3", "threshold": 0.95,
            "extra_metrics": {"db-boxes": 1.0}},
    "minilm": {"model": REPO / ".models/minilm_op17.onnx", "data": "minilm",
               "metric": str(REPO / "benchmarks/transformer_metrics.py") + ":min_cosine",
               "threshold": 0.99},
    "yolo": {"model": "nudenet", "data": "photos", "preprocess": "ultralytics:size=320x320",
             "metric": "box-map", "threshold": 0.95},
}
DEFAULT_MODELS = ("cls", "rec", "det", "minilm")
TOOLS = ("pd", "ort-minmax", "ort-entropy", "ort-percentile", "ort-distribution",
         "modelopt-max", "modelopt-entropy")
# FP32 between the Q/DQ pairs instead of FP16 (both tools' default is FP16): for models whose
# all-FP16 form fails the target by itself (det: a BatchNorm variance of 9.8e7 overflows FP16)
EXTRA_TOOLS = ("pd-l2", "pd-fp32", "modelopt-max-fp32")
# ORT's quantize_static takes float8 with CalibrationMethod.Distribution only (quantize.py
# raises otherwise); Distribution is meant for float8, so int8 keeps the three classic ones
ORT_FORMATS = {"ort-minmax": ("int8",), "ort-entropy": ("int8",), "ort-percentile": ("int8",),
               "ort-distribution": ("fp8",)}
WEIGHTED = ("Conv", "ConvTranspose", "MatMul", "Gemm")
PASS_THROUGH = ("Cast", "Identity", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze")


# ----------------------------------------------------------------------------- samples

def _ocr_files(kind: str) -> list[Path]:
    root = SHARED / "data" / "ocr"
    if kind == "ocr-crops":
        crops = sorted(p for p in (root / "rec_crops").glob("*/*") if p.is_file())
        return crops[::2][:16]
    return sorted(p for d in ("full_images", "misc") for p in (root / d).iterdir() if p.is_file())


def prepare(name: str, folder: Path) -> dict:
    """Write the named FP32 model and its samples (one .npz each, plus all stacked on the
    batch axis for ModelOpt) under ``folder``; return the spec the workers read."""
    import numpy as np
    import onnx

    from precision_doctor.api.options import as_model, as_samples

    spec = dict(MODELS[name])
    folder.mkdir(parents=True, exist_ok=True)
    if spec["model"] == "nudenet":
        sys.path.insert(0, str(REPO / "tests"))
        import real_detectors as rd

        found = rd.nudenet_path()
        if found is None:
            raise RuntimeError(f"YOLOv8n needs the nudenet wheel: {rd.INSTALL}")
        spec["model"] = found
    source = Path(spec["model"])
    if not source.is_file():
        raise RuntimeError(f"{source} is missing")
    model, _ = as_model(source)
    if spec["data"] in ("ocr-crops", "ocr-full"):
        images = folder / "images"
        images.mkdir(exist_ok=True)
        for p in _ocr_files(spec["data"]):
            shutil.copy(p, images / f"{p.parent.name}__{p.name}")
        samples = as_samples(str(images), model, spec["preprocess"])
    elif spec["data"] == "photos":
        samples = as_samples(str(rd.write_photos(folder / "photos")), model, spec["preprocess"])
    else:  # minilm: two batches of 8 sentences -> 16 samples of batch 1
        feeds = []
        for f in sorted((REPO / ".models" / "minilm_data").glob("batch*.npz")):
            batch = dict(np.load(f))
            n = len(next(iter(batch.values())))
            feeds += [{k: v[i:i + 1] for k, v in batch.items()} for i in range(n)]
        samples = as_samples(feeds, model)
    fp32 = folder / "fp32.onnx"
    onnx.save(model, str(fp32))
    (folder / "samples").mkdir(exist_ok=True)
    files = []
    for i, s in enumerate(samples):
        files.append(str(folder / "samples" / f"{i:03d}.npz"))
        np.savez(files[-1], **s.feeds)
    stacked = {k: np.concatenate([s.feeds[k] for s in samples]) for k in samples[0].feeds}
    np.savez(folder / "calib.npz", **stacked)
    spec.update(name=name, model=str(fp32), source=str(source), samples=files,
                sample_names=[s.name for s in samples], calib=str(folder / "calib.npz"),
                metric=spec["metric"].format(model=source))
    return spec


# ----------------------------------------------------------------------------- workers

def worker(tool: str, fmt: str, spec: dict, dest: Path) -> dict:
    """Quantize ``spec["model"]`` with ``tool`` into ``dest``; return what the tool reports."""
    if tool.startswith("modelopt"):
        return _modelopt(tool, fmt, spec, dest)
    if tool.startswith("ort"):
        return _ort(tool, fmt, spec, dest)
    return _ours(tool, fmt, spec, dest)


def _ours(tool: str, fmt: str, spec: dict, dest: Path) -> dict:
    import numpy as np
    import onnx

    feeds = [dict(np.load(f)) for f in spec["samples"]]
    if tool == "pd-fp32":  # the library call: FP32 between the pairs (no API option for it)
        from precision_doctor.api.options import as_model, as_samples
        from precision_doctor.compare.tasks.registry import get_metric
        from precision_doctor.formats import Precision
        from precision_doctor.quant.fix import fix_quantized
        from precision_doctor.quant.qformats import parse_quant_target
        from precision_doctor.search.objective import Objective

        model, _ = as_model(spec["model"])
        t0 = time.perf_counter()
        result = fix_quantized(model, as_samples(feeds, model), parse_quant_target(fmt),
                               Objective(metric=get_metric(spec["metric"]),
                                         threshold=spec["threshold"]),
                               calibrator="max", between=Precision.FP32)
        seconds, written, report = time.perf_counter() - t0, result.model, result.to_dict()
    else:  # the public API, as a user calls it (it finds FP32 nodes when FP16 alone fails)
        import precision_doctor as pd

        metric = None if tool == "pd-l2" else spec["metric"]
        t0 = time.perf_counter()
        fixed = pd.fix_quantized(spec["model"], feeds, target=fmt, metric=metric,
                                 threshold=spec["threshold"] if metric else None,
                                 calibrator="max", quiet=True)
        seconds, written, report = time.perf_counter() - t0, fixed.model, dict(fixed.report)
    onnx.save(written, str(dest))
    report.pop("recipes", None)
    return {"tool_seconds": round(seconds, 2), "report": report}


def _ort(tool: str, fmt: str, spec: dict, dest: Path) -> dict:
    import numpy as np
    import onnxruntime
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self, files: list[str]) -> None:
            self.feeds = iter([dict(np.load(f)) for f in files])

        def get_next(self):
            return next(self.feeds, None)

    method = {"ort-minmax": CalibrationMethod.MinMax, "ort-entropy": CalibrationMethod.Entropy,
              "ort-percentile": CalibrationMethod.Percentile,
              "ort-distribution": CalibrationMethod.Distribution}[tool]
    qtype = QuantType.QInt8 if fmt == "int8" else QuantType.QFLOAT8E4M3FN
    report = {"onnxruntime": onnxruntime.__version__, "calibrate_method": method.name,
              "activation_type": qtype.name, "weight_type": qtype.name}
    t0 = time.perf_counter()
    try:
        quantize_static(spec["model"], str(dest), Reader(spec["samples"]),
                        quant_format=QuantFormat.QDQ, per_channel=True, activation_type=qtype,
                        weight_type=qtype, calibrate_method=method)
    except AttributeError as exc:
        # FP8 + a quantized Softmax: BaseQuantizer.adjust_tensor_ranges gives the Softmax output
        # TensorData(lowest=0, highest=1) without the avg/std that compute_scale_zp_float8
        # reads (ORT 1.32). Retried with the Softmax nodes excluded, recorded as such.
        import onnx

        if "avg" not in str(exc) or fmt == "int8":
            raise
        softmax = [n.name for n in onnx.load(spec["model"]).graph.node
                   if n.op_type == "Softmax"]
        report["first_attempt_error"] = f"{type(exc).__name__}: {str(exc)[:60]}..."
        report["workaround"] = f"nodes_to_exclude = the {len(softmax)} Softmax nodes"
        t0 = time.perf_counter()
        quantize_static(spec["model"], str(dest), Reader(spec["samples"]),
                        quant_format=QuantFormat.QDQ, per_channel=True, activation_type=qtype,
                        weight_type=qtype, calibrate_method=method, nodes_to_exclude=softmax)
    return {"tool_seconds": round(time.perf_counter() - t0, 2), "report": report}


def _modelopt(tool: str, fmt: str, spec: dict, dest: Path) -> dict:
    import importlib.metadata
    import inspect

    import numpy as np
    from modelopt.onnx.quantization import quantize

    method = tool.split("-")[1]
    calib = dict(np.load(spec["calib"]))
    kwargs = {"onnx_path": spec["model"], "quantize_mode": fmt, "calibration_data": calib,
              "calibration_method": method, "output_path": str(dest),
              "calibration_eps": ["cpu"]}
    if tool.endswith("-fp32"):
        kwargs["high_precision_dtype"] = "fp32"
    accepted = inspect.signature(quantize).parameters
    kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    t0 = time.perf_counter()
    quantize(**kwargs)
    versions = {}
    for package in ("nvidia-modelopt", "onnx", "onnxruntime-gpu", "onnxruntime", "torch"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {"tool_seconds": round(time.perf_counter() - t0, 2),
            "report": {"versions": versions, "calibration_method": method,
                       "kwargs": {k: v for k, v in kwargs.items() if k != "calibration_data"}}}


def source_version() -> str:
    """This checkout's commit, ``+dirty`` when ``src/`` has uncommitted changes (the code ``pd``
    ran is under active development)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                              capture_output=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "src"], cwd=REPO, text=True,
                               capture_output=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}{'+dirty' if dirty else ''}" if head else "unknown"


def launch(tool: str, fmt: str, spec: dict, work: Path, modelopt_python: Path,
           timeout: float) -> dict:
    """Run one tool in a fresh process; its output model is ``work/<fmt>_<tool>.onnx``."""
    dest = work / f"{fmt}_{tool}.onnx"
    info = dest.with_suffix(".json")
    log = dest.with_suffix(".log")
    for p in (dest, info):
        p.unlink(missing_ok=True)
    row = {"model": spec["name"], "format": fmt, "tool": tool,
           "ran_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if tool.startswith("pd"):
        row["source"] = source_version()
    if tool.startswith("modelopt"):
        if not modelopt_python.is_file():
            return {**row, "error": f"ModelOpt environment missing: {modelopt_python} (see the "
                                    "module docstring)"}
        python, env = str(modelopt_python), dict(os.environ, PYTHONPATH="")
    else:
        python, env = sys.executable, dict(os.environ, PYTHONPATH=str(REPO / "src"))
    cmd = [python, str(Path(__file__).resolve()), "--worker", tool, "--format", fmt,
           "--spec", json.dumps(spec), "--dest", str(dest)]
    run = measure_process(cmd, env=env, timeout=timeout, log=log)
    row.update(wall_s=run["wall_s"], cpu_s=run["cpu_s"], peak_rss_mb=run["peak_rss_mb"],
               exit=run["returncode"], timed_out=run["timed_out"], log=str(log))
    if info.is_file():
        row.update(json.loads(info.read_text()))
    if tool.startswith("modelopt") and log.is_file():  # what its own rules left out, and why
        keys = ("unsupported", "exclud", "GEMV", "non-quantizable", "nodes to quantize",
                "quantized nodes", "Quantizable op types", "fp16", "ERROR")
        row["tool_notes"] = [line.split(" - ", 3)[-1].strip() for line in
                             log.read_text(errors="replace").splitlines()
                             if "[modelopt]" in line and any(k in line for k in keys)]
    if run["returncode"] != 0 or not dest.is_file():
        tail = log.read_text(errors="replace").strip().splitlines() if log.is_file() else []
        errors = [line for line in tail if "Error" in line or "error" in line]
        row["error"] = (errors[-1] if errors else (tail[-1] if tail else "no output")).strip()
        if run["timed_out"]:
            row["error"] = f"timed out after {timeout:g} s"
        row["log_tail"] = tail[-15:]
        return row
    row["output"] = str(dest)
    return row


# ----------------------------------------------------------------------------- evaluation

# ORT 1.32's level-1 (BASIC) transformer that rewrites a float Conv/Gemm bias into int32 Q/DQ
# with scale x_scale * w_scale, computed in the bias's type: with FP16 scales and bias the
# quotient overflows/underflows and the output is ruined (rel L2 0.7-0.9 on PP-OCR models whose
# BatchNorm was folded into the bias); off in the main evaluation, measured apart ("raw BASIC")
WEIGHT_BIAS_QUANTIZATION = "WeightBiasQuantization"


def session(path: str, disabled: tuple[str, ...] = (WEIGHT_BIAS_QUANTIZATION,)):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 3
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=list(disabled))


def run_all(path: str, spec: dict, disabled: tuple[str, ...] = (WEIGHT_BIAS_QUANTIZATION,)
            ) -> dict:
    import numpy as np

    sess = session(path, disabled)
    names = [o.name for o in sess.get_outputs()]
    outs: dict = {n: [] for n in names}
    for f in spec["samples"]:
        for n, v in zip(names, sess.run(names, dict(np.load(f)))):
            outs[n].append(np.asarray(v, np.float32) if v.dtype.kind == "f" else v)
    return outs


def weighted_layers(path: str) -> tuple[list[str], list[str]]:
    """(every Conv/ConvTranspose/MatMul/Gemm node, those none of whose inputs comes from a
    DequantizeLinear through pass-through ops), by name, graph order."""
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    producer = {o: n for n in graph.node for o in n.output}

    def from_dq(tensor: str) -> bool:
        node = producer.get(tensor)
        while node is not None and node.op_type in PASS_THROUGH:
            node = producer.get(node.input[0]) if node.input else None
        return node is not None and node.op_type == "DequantizeLinear"

    weighted = [n for n in graph.node if n.op_type in WEIGHTED]
    left = [n.name or f"{n.op_type}:{n.output[0]}" for n in weighted
            if not any(from_dq(i) for i in n.input if i)]
    return [n.name for n in weighted], left


def bad_scales(path: str) -> list[str]:
    """Inputs of Q/DQ nodes whose scale initializer has a NaN, an inf or a zero."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(path).graph
    scales = {i.name: i for i in graph.initializer}
    for node in graph.node:  # scales held in Constant nodes
        if node.op_type == "Constant" and node.attribute and node.attribute[0].HasField("t"):
            scales[node.output[0]] = node.attribute[0].t
    bad = []
    for node in graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and node.input[1] in scales:
            value = numpy_helper.to_array(scales[node.input[1]]).astype(np.float32)
            if not np.all(np.isfinite(value)) or np.any(value == 0):
                bad.append(f"{node.op_type}({node.input[0]})")
    return bad


def evaluate(path: str, spec: dict, reference: dict) -> dict:
    import numpy as np

    from precision_doctor.compare.tasks.registry import evaluate_metric, get_metric

    try:
        outs = run_all(path, spec)
        raw = run_all(path, spec, disabled=())
    except Exception as exc:  # noqa: BLE001 - a model ORT refuses is a finding
        return {"eval_error": f"{type(exc).__name__}: {str(exc)[:400]}"}

    def rel_l2(outs: dict) -> dict:
        rel = {}
        for n, refs in reference.items():
            num = sum(float(np.sum((np.asarray(c, np.float64) - np.asarray(r, np.float64)) ** 2))
                      for r, c in zip(refs, outs[n]))
            den = sum(float(np.sum(np.asarray(r, np.float64) ** 2)) for r in refs)
            rel[n] = float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))
        return rel

    rel = rel_l2(outs)
    row: dict = {"rel_l2": rel, "max_rel_l2": max(rel.values())}
    n_samples = len(spec["samples"])
    primary = get_metric(spec["metric"])
    raw_values = [evaluate_metric(primary, {k: v[i] for k, v in reference.items()},
                                  {k: v[i] for k, v in raw.items()}) for i in range(n_samples)]
    row["raw_basic"] = {"max_rel_l2": max(rel_l2(raw).values()),
                        "metric_worst": min(raw_values), "metric_per_sample": raw_values}
    for spec_str, threshold, key in ([(spec["metric"], spec["threshold"], "metric")]
                                     + [(m, t, m) for m, t in
                                        spec.get("extra_metrics", {}).items()]):
        metric = get_metric(spec_str)
        values = [evaluate_metric(metric, {k: v[i] for k, v in reference.items()},
                                  {k: v[i] for k, v in outs.items()}) for i in range(n_samples)]
        worst = min(values) if metric.higher_is_better else max(values)
        row[key] = {"name": metric.name, "threshold": threshold, "worst": worst,
                    "mean": float(np.mean(values)), "per_sample": values,
                    "met_on_every_sample": all(metric.meets(v, threshold) for v in values)}
    weighted, left = weighted_layers(path)
    bad = bad_scales(path)
    row.update(weighted_layers=len(weighted), unquantized=len(left), unquantized_layers=left,
               bad_scales=len(bad), bad_scales_first=bad[:5])
    return row


# ----------------------------------------------------------------------------- main

def note(row: dict) -> str:
    """What the tool decided or ran into, in a few words."""
    report = row.get("report") or {}
    parts = []
    if row["tool"].startswith("pd") and report:
        parts.append(f"calib {report.get('calibrator')}")
        if report.get("smoothquant"):
            parts.append(f"SQ a={report['smoothquant'].get('alpha')}")
        parts.append(f"{report.get('evaluations')} evals")
        if report.get("float_fp32"):
            parts.append(f"{len(report['float_fp32'])} float nodes FP32")
        if not report.get("passed", True):
            parts.append("target not met")
    if report.get("workaround"):
        parts.append("Softmax excluded (ORT bug)")
    for line in row.get("tool_notes", []):
        if line.startswith("Found") and "unsupported" in line:
            parts.append(line.removeprefix("Found ").replace(" for quantization", ""))
    if row.get("bad_scales"):
        parts.append(f"{row['bad_scales']} NaN/0 scales")
    return "; ".join(parts)


def order(rows: list[dict]) -> list[dict]:
    """Rows by model, format and tool, in the order of ``MODELS`` and ``TOOLS``."""
    tools = [*TOOLS, *EXTRA_TOOLS]
    return sorted(rows, key=lambda r: (
        list(MODELS).index(r["model"]) if r["model"] in MODELS else len(MODELS),
        ("int8", "fp8").index(r["format"]) if r["format"] in ("int8", "fp8") else 2,
        tools.index(r["tool"]) if r["tool"] in tools else len(tools)))


def table(rows: list[dict]) -> str:
    head = ("model", "fmt", "tool", "metric worst", "met", "max rel L2", "raw BASIC",
            "unquant", "wall s", "tool s", "note", "unquantized layers / error")
    # "met": samples meeting the threshold / samples (every metric here is higher-is-better)
    lines = []
    for r in order(rows):
        m = r.get("metric") or {}
        what = r.get("error") or r.get("eval_error") or ", ".join(r.get("unquantized_layers",
                                                                        [])[:6])
        if len(r.get("unquantized_layers", [])) > 6:
            what += ", ..."
        lines.append((r["model"], r["format"], r["tool"],
                      f"{m['worst']:.4f}" if m else "-",
                      (f"{sum(v >= m['threshold'] for v in m['per_sample'])}/"
                       f"{len(m['per_sample'])}") if m else "-",
                      f"{r['max_rel_l2']:.3g}" if "max_rel_l2" in r else "-",
                      (f"{r['raw_basic']['max_rel_l2']:.3g}/{r['raw_basic']['metric_worst']:.2f}"
                       if "raw_basic" in r else "-"),
                      f"{r['unquantized']}/{r['weighted_layers']}" if "unquantized" in r
                      else "-", f"{r['wall_s']:.1f}" if "wall_s" in r else "-",
                      f"{r['tool_seconds']:.1f}" if "tool_seconds" in r else "-",
                      note(r), what[:70]))
    widths = [max(len(str(x[i])) for x in [head, *lines]) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths)),
                      *(fmt.format(*x) for x in lines)])


def modelopt_info(python: Path) -> dict:
    if not python.is_file():
        return {"python": str(python), "installed": False}
    code = ("import importlib.metadata as m, json\nout = {}\n"
            "for p in ('nvidia-modelopt', 'onnx', 'onnxruntime-gpu', 'onnxruntime', 'torch', "
            "'onnx-graphsurgeon', 'cppimport', 'numpy'):\n"
            "    try: out[p] = m.version(p)\n    except Exception: pass\n"
            "try:\n    import modelopt.onnx.quantization\n    out['import'] = 'ok'\n"
            "except Exception as e:\n    out['import'] = f'{type(e).__name__}: {e}'\n"
            "print(json.dumps(out))")
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=""))
    try:
        return {"python": str(python), "installed": True,
                **json.loads(done.stdout.strip().splitlines()[-1])}
    except (IndexError, json.JSONDecodeError):
        return {"python": str(python), "installed": True, "error": done.stderr[-800:]}


def reevaluate(path: Path, work: Path | None, models: list[str]) -> None:
    """Evaluate again the output models that the rows of ``path`` name (tool runs kept)."""
    if work is None:
        sys.exit("--evaluate-only needs --work (the folder of the earlier run)")
    record = json.loads(path.read_text())
    rows = record["rows"]
    for name in models:
        spec = prepare(name, work / name)
        reference = run_all(spec["model"], spec)
        for row in rows:
            if row["model"] == name and Path(row.get("output", "")).is_file():
                row.update(evaluate(row["output"], spec, reference))
    record["rows"] = order(rows)
    payload = {k: v for k, v in record.items() if k not in ("date", "machine", "versions")}
    write_results(path, payload)
    print(table(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--formats", default="int8,fp8")
    parser.add_argument("--tools", default=",".join(TOOLS),
                        help=f"comma-separated, of {', '.join(TOOLS + EXTRA_TOOLS)}")
    parser.add_argument("--modelopt-python", type=Path, default=MODELOPT_PYTHON)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per tool run")
    parser.add_argument("--work", type=Path, help="folder for models and logs (default: temp)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary work folder")
    parser.add_argument("--merge", action="store_true",
                        help="keep the rows of today's results file for other runs")
    parser.add_argument("--suffix", default="", help="results file name suffix")
    parser.add_argument("--evaluate-only", action="store_true",
                        help="re-evaluate the output models of today's rows in --work (no tool "
                             "runs), e.g. after the evaluation changed")
    parser.add_argument("--table-only", action="store_true",
                        help="print the table of today's results file and exit")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--format", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--dest", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        out = worker(args.worker, args.format, json.loads(args.spec), args.dest)
        args.dest.with_suffix(".json").write_text(json.dumps(out, indent=1, default=str))
        return

    path = results_path("quant_anchors", suffix=args.suffix)
    if args.table_only:
        print(table(json.loads(path.read_text())["rows"]))
        return
    if args.evaluate_only:
        reevaluate(path, args.work, [m for m in args.models.split(",") if m])
        return
    work = args.work or Path(tempfile.mkdtemp(prefix="quant_anchors_"))
    rows: list[dict] = []
    record: dict = {}
    if args.merge and path.is_file():
        record = json.loads(path.read_text())
        rows = record.get("rows", [])
    tools = [t for t in args.tools.split(",") if t]
    formats = [f for f in args.formats.split(",") if f]
    failures = dict(record.get("model_failures", {}))
    anchors = modelopt_info(args.modelopt_python)
    for name in [m for m in args.models.split(",") if m]:
        try:
            spec = prepare(name, work / name)
        except Exception as exc:  # noqa: BLE001 - a missing model is recorded, not fatal
            failures[name] = f"{type(exc).__name__}: {exc}"
            print(f"{name}: skipped: {failures[name]}", flush=True)
            continue
        failures.pop(name, None)
        reference = run_all(spec["model"], spec)
        for fmt in formats:
            for tool in tools:
                if fmt not in ORT_FORMATS.get(tool, (fmt,)):
                    continue
                row = launch(tool, fmt, spec, work / name, args.modelopt_python, args.timeout)
                if "output" in row:
                    row.update(evaluate(row["output"], spec, reference))
                row.update(samples=len(spec["samples"]), objective=
                           f"{spec['metric'].split('/')[-1]} threshold {spec['threshold']}")
                rows = [r for r in rows if (r["model"], r["format"], r["tool"])
                        != (name, fmt, tool)] + [row]
                print(json.dumps({k: v for k, v in row.items()
                                  if k not in ("report", "log_tail", "rel_l2", "metric")}
                                 | {"metric_worst": (row.get("metric") or {}).get("worst")},
                                 default=str), flush=True)
                write_results(path, {
                    "command": " ".join(sys.argv), "work": str(work),
                    "modelopt": anchors,
                    "evaluation": "ONNX Runtime CPU, ORT_ENABLE_BASIC, every sample vs FP32 "
                                  "on the same options; unquantized = weighted nodes with no "
                                  "DequantizeLinear input",
                    "models": {**record.get("models", {}), name: {
                        k: spec[k] for k in ("source", "metric", "threshold", "sample_names")}},
                    "model_failures": failures, "rows": order(rows)})
                record = json.loads(path.read_text())
    print(table(rows))
    print(f"\nwrote {path}")
    if not args.keep and args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
