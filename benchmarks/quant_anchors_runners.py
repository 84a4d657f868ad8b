"""The runners of ``quant_anchors``: each tool quantizes the FP32 model in a fresh process
(``quant_anchors.py --worker TOOL``) and returns what it reports.

* ``pd``: ``precision_doctor.fix_quantized(model, samples, target=int8|fp8, metric=...,
  threshold=..., calibrator="max")``: the fewest layers left unquantized (FP16 between the Q/DQ
  pairs, plus the nodes FP16 needs in FP32 when the float part fails alone) that meet the task
  metric on every calibration sample (it calibrates and searches on them: ``calibration=`` and
  the data are the calibration samples, ``holdout=0``, where the API has them). Not run by
  default: ``pd-l2``, the same with ``fix``'s default target (relative L2 <= 0.1 on every
  output); ``pd-fp32``, FP32 between the pairs
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
  onnxruntime-gpu and its own onnx, so it runs in a separate virtual environment
  (``--modelopt-python``, default ``.venv-anchors/bin/python``, git-ignored)::

      python3 -m venv .venv-anchors && .venv-anchors/bin/pip install "nvidia-modelopt[onnx]"

  When that environment is missing or the tool fails, the failure is recorded in the row.

This module imports only the standard library at its top: the ModelOpt runner runs in the
ModelOpt environment, which has no precision-doctor.
"""

from __future__ import annotations

import time
from pathlib import Path

TOOLS = ("pd", "ort-minmax", "ort-entropy", "ort-percentile", "ort-distribution",
         "modelopt-max", "modelopt-entropy")
# FP32 between the Q/DQ pairs instead of FP16 (both tools' default is FP16): for models whose
# all-FP16 form fails the target by itself (det: a BatchNorm variance of 9.8e7 overflows FP16)
EXTRA_TOOLS = ("pd-l2", "pd-fp32", "modelopt-max-fp32")
# ORT's quantize_static takes float8 with CalibrationMethod.Distribution only (quantize.py
# raises otherwise); Distribution is meant for float8, so int8 keeps the three classic ones
ORT_FORMATS = {"ort-minmax": ("int8",), "ort-entropy": ("int8",), "ort-percentile": ("int8",),
               "ort-distribution": ("fp8",)}


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

    feeds = [dict(np.load(f)) for f in spec["calibration"]]
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
        import inspect

        import precision_doctor as pd

        metric = None if tool == "pd-l2" else spec["metric"]
        # the calibration samples calibrate and the search runs on them too: pd sees what the
        # other tools see, and the evaluation samples are its held-out set (so no sample of
        # them is held out of the search: holdout=0, where the API has it)
        accepted = inspect.signature(pd.fix_quantized).parameters
        extra = {k: v for k, v in (("calibration", feeds), ("holdout", 0)) if k in accepted}
        t0 = time.perf_counter()
        fixed = pd.fix_quantized(spec["model"], feeds, target=fmt, metric=metric,
                                 threshold=spec["threshold"] if metric else None,
                                 calibrator="max", quiet=True, **extra)
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
        quantize_static(spec["model"], str(dest), Reader(spec["calibration"]),
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
        quantize_static(spec["model"], str(dest), Reader(spec["calibration"]),
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

