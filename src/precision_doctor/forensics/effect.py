"""How far a preprocessing difference moves a model's outputs, next to the precision effect.

Three runs with ONNX Runtime CPU: the FP32 model on A (the reference), the FP32 model on B (the
preprocessing effect), and the CPU emulation of the model in the target precision on A
(``precision.emulate`` with ``PrecisionPlan(target)``: the precision effect). Both effects are
relative L2 errors against the same reference (``compare.metrics``), so their ratio says which
one matters: "the preprocessing difference moves the outputs 40x more than FP16 does".

A and B are run as given. When B does not fit the model's input (a wrong layout, a size the
model cannot take), the result says so instead of guessing a conversion.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from precision_doctor.compare.metrics import compute_metrics, relative_l2
from precision_doctor.errors import InputError
from precision_doctor.formats import Precision
from precision_doctor.graph.load import load_model
from precision_doctor.inputs import check_feeds, image_input
from precision_doctor.precision.emulate import emulate
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners.ort import OrtRunner


def _ratio_text(pre: float, prec: float, target: str) -> str:
    if prec == 0 and pre == 0:
        return f"neither the preprocessing difference nor {target} changes the outputs"
    if prec == 0:
        return f"the preprocessing difference changes the outputs; {target} does not"
    if pre == 0:
        return f"the preprocessing difference does not change the outputs; {target} does"
    ratio = pre / prec
    if ratio >= 1:
        return f"the preprocessing difference moves the outputs {ratio:.3g}x more than " \
               f"{target} does"
    return f"{target} moves the outputs {1 / ratio:.3g}x more than the preprocessing " \
           "difference does"


def _metrics(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]
             ) -> dict[str, dict[str, Any]]:
    return {name: compute_metrics([reference[name]], [candidate[name]]).to_dict()
            for name in reference}


def output_effect(model: onnx.ModelProto | str | Path, a: np.ndarray, b: np.ndarray,
                  target: Precision | str = Precision.FP16) -> dict[str, Any]:
    """Output change caused by B instead of A, next to the change caused by ``target``.

    Args:
        model: ONNX model (path or proto) with one image input.
        a: Tensor A as the model takes it (the reference input).
        b: Tensor B, run as given.
        target: Reduced precision whose effect is the yardstick (fp16, bf16, tf32).

    Returns:
        JSON-ready dict: ``model``, ``input``, ``target``, ``b_fits`` and ``b_error`` (why B
        could not be run), ``preprocessing_rel_l2`` (||f(B) - f(A)|| / ||f(A)|| over every
        output; None when B cannot run or its outputs have other shapes),
        ``precision_rel_l2`` (||f_target(A) - f(A)|| / ||f(A)||), ``ratio``
        (preprocessing / precision), ``summary`` (one sentence) and ``outputs`` (per output:
        ``preprocessing`` and ``precision`` error statistics of ``compute_metrics``).

    Raises:
        ModelLoadError: The model file cannot be read.
        InputNameError: The model does not have a single image input.
        InputError: A does not fit the model input (the reference must run).
        BackendError: ONNX Runtime fails.
    """
    proto = load_model(model) if isinstance(model, (str, Path)) else model
    precision = Precision.parse(target) if isinstance(target, str) else target
    emulated, _ = emulate(proto, PrecisionPlan(precision))
    with OrtRunner(proto, name="ort-cpu-fp32") as runner:
        metas = runner.input_metadata()
        meta = image_input(metas)
        try:
            feed_a = check_feeds({meta.name: a}, metas)
        except InputError as exc:
            raise type(exc)(f"A does not fit the model: {exc.message}", **exc.context) from exc
        try:
            feed_b: dict[str, np.ndarray] | None = check_feeds({meta.name: b}, metas)
            b_error = None
        except InputError as exc:
            feed_b, b_error = None, f"B does not fit the model input: {exc.message}"
        ref = runner.run(feed_a)
        out_b = runner.run(feed_b) if feed_b is not None else None
    with OrtRunner(emulated, name=f"emulate-{precision.value}") as runner:
        out_target = runner.run(feed_a)
    names = list(ref)
    prec_rel = relative_l2([ref[n] for n in names], [out_target[n] for n in names])
    result: dict[str, Any] = {
        "model": proto.graph.name or "model", "input": meta.name, "target": precision.value,
        "b_fits": feed_b is not None, "b_error": b_error, "preprocessing_rel_l2": None,
        "precision_rel_l2": prec_rel, "ratio": None}
    outputs: dict[str, dict[str, Any]] = {n: {"precision": m}
                                          for n, m in _metrics(ref, out_target).items()}
    if out_b is not None and any(ref[n].shape != out_b[n].shape for n in names):
        shapes = {n: [list(ref[n].shape), list(out_b[n].shape)] for n in names}
        result["b_error"] = f"outputs of A and B have different shapes {shapes}; not comparable"
    elif out_b is not None:
        pre_rel = relative_l2([ref[n] for n in names], [out_b[n] for n in names])
        result["preprocessing_rel_l2"] = pre_rel
        result["ratio"] = pre_rel / prec_rel if prec_rel > 0 else (
            math.inf if pre_rel > 0 else None)
        for name, m in _metrics(ref, out_b).items():
            outputs[name]["preprocessing"] = m
        result["summary"] = _ratio_text(pre_rel, prec_rel, precision.value.upper())
    if "summary" not in result:
        result["summary"] = (f"{result['b_error']}; {precision.value.upper()} alone moves the "
                             f"outputs by {prec_rel:.3g} (relative L2)")
    result["outputs"] = outputs
    return result
