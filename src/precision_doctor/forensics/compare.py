"""``compare_inputs``: the library entry point behind ``precision-doctor inputs A B``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx

from precision_doctor.forensics.analyze import analyze_tensors
from precision_doctor.forensics.effect import output_effect
from precision_doctor.forensics.result import ForensicsResult
from precision_doctor.forensics.sources import load_side
from precision_doctor.formats import Precision
from precision_doctor.graph.load import input_metadata, load_model
from precision_doctor.inputs import PreprocessSpec

Preprocess = PreprocessSpec | str | Mapping[str, object] | None


def compare_inputs(a: str | Path | np.ndarray, b: str | Path | np.ndarray, *,
                   preprocess_a: Preprocess = None, preprocess_b: Preprocess = None,
                   model: str | Path | onnx.ModelProto | None = None,
                   target: Precision | str = Precision.FP16) -> ForensicsResult:
    """Name what differs between two inputs meant to be the same sample.

    Args:
        a: Side A: an image file (with ``preprocess_a``), ``.npy``, ``.npz[:KEY]``, Polygraphy
            ``.json[:KEY][@ITERATION]`` (see ``forensics.sources``), or an array.
        b: Side B, same forms.
        preprocess_a: Preprocessing of an image A (preset name, ``key=value`` text or spec).
        preprocess_b: Preprocessing of an image B.
        model: Optional ONNX model with one image input: also measure how far B moves its
            outputs compared with the ``target`` precision's effect (``forensics.effect``).
        target: Precision whose effect is the yardstick (default fp16).

    Returns:
        ``ForensicsResult``: findings (most important first), the estimated transform from A to
        B, the residual, and ``output_effect`` when a model is given.

    Raises:
        InputError: Missing files, an image without a spec, a spec for a tensor.
        InputNameError: The array to compare cannot be chosen from a .npz/JSON file.
        DataFormatError: A file does not decode.
        InputShapeError: A tensor is empty or not numeric; A does not fit the model.
        ModelLoadError / BackendError: The model cannot be read or run.
    """
    proto = load_model(model) if isinstance(model, (str, Path)) else model
    names = [m.name for m in input_metadata(proto)] if proto is not None else []
    side_a = load_side(a, preprocess_a, names, "A")
    side_b = load_side(b, preprocess_b, names, "B")
    result = analyze_tensors(side_a.array, side_b.array, side_a.desc, side_b.desc)
    if proto is None:
        return result
    effect = output_effect(proto, side_a.array, side_b.array, target)
    if isinstance(model, (str, Path)):
        effect["model"] = Path(model).name
    return dataclasses.replace(result, output_effect=effect)
