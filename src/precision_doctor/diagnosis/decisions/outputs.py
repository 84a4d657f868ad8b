"""Which outputs carry decisions, and along which axis.

Detection (per float output, from the graph and the reference values; no ``--metric`` needed):

* ``class-probabilities``: produced by Softmax (through Identity nodes) along its axis, or any
  output whose values along the last axis (rank >= 2) or axis 1 (rank 4) lie in [0, 1] and sum
  to 1 within 1e-3 (FP32 sums of up to 1e5 probabilities are exact to ~1e-5).
* ``class-logits``: produced by LogSoftmax along its axis; or produced by a linear head
  (MatMul/Gemm, or an Add of a constant bias to one) as a rank-2 ``[N, C]`` output with
  ``C >= 2`` (a classifier), or rank-3 ``[N, T, C]`` with ``C >= 10`` (token classification,
  LM heads; box regressions have 4 values per position). Rank-2 outputs of Flatten/Reshape/
  Squeeze (a head after global pooling) count too. Hidden states (a LayerNorm's final Add,
  pooled embeddings) are not decisions.
* ``ctc``: class scores ``[N, T, C]`` of a model whose metadata ``character`` (PP-OCR's CTC
  dictionary) fits ``C``; decoded with best-path CTC (``compare.tasks.ocr``).
* ``sigmoid-map``: produced by Sigmoid: every element is a binary decision at
  ``SIGMOID_THRESHOLD`` = 0.5 (logit 0, the Bayes boundary of a calibrated sigmoid). Task
  post-processing may binarize elsewhere (PP-OCR's DB text detector uses 0.3).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx

from precision_doctor.errors import PrecisionDoctorError

SIGMOID_THRESHOLD = 0.5
SUM_TOLERANCE = 1e-3
MAX_CLASSES = 100_000
LINEAR = ("Gemm", "MatMul")
RESHAPES = ("Flatten", "Reshape", "Squeeze")


def _producer(model: onnx.ModelProto, name: str) -> onnx.NodeProto | None:
    by_out = {o: n for n in model.graph.node for o in n.output}
    node = by_out.get(name)
    while node is not None and node.op_type == "Identity" and node.input:
        node = by_out.get(node.input[0])
    return node


def _linear_head(model: onnx.ModelProto, node: onnx.NodeProto | None) -> bool:
    """MatMul/Gemm, or Add(MatMul/Gemm output, constant bias)."""
    if node is None:
        return False
    if node.op_type in LINEAR:
        return True
    if node.op_type != "Add" or len(node.input) != 2:
        return False
    consts = {t.name for t in model.graph.initializer} | {
        o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    by_out = {o: n for n in model.graph.node for o in n.output}
    kinds = [("const" if i in consts else by_out[i].op_type if i in by_out else "")
             for i in node.input]
    return "const" in kinds and any(k in LINEAR for k in kinds)


def _is_probabilities(arrays: Sequence[np.ndarray], axis: int) -> bool:
    for a in arrays:
        if a.ndim < 2 or not (2 <= a.shape[axis] <= MAX_CLASSES) or a.size == 0:
            return False
        if float(a.min()) < -1e-6 or float(a.max()) > 1 + 1e-6:
            return False
        if float(np.abs(a.sum(axis=axis, dtype=np.float64) - 1).max()) > SUM_TOLERANCE:
            return False
    return True


def ctc_charset(model: onnx.ModelProto, classes: int) -> list[str] | None:
    from precision_doctor.compare.tasks.ocr import ctc_charset_from_model

    if not any(p.key == "character" for p in model.metadata_props):
        return None
    try:
        charset = ctc_charset_from_model(model)
    except PrecisionDoctorError:
        return None
    return charset if len(charset) == classes else None


def detect_decision(model: onnx.ModelProto, name: str, arrays: Sequence[np.ndarray]
                    ) -> tuple[str, int] | None:
    """The decision kind and class axis of output ``name``, or None (rules: module docstring).

    Args:
        model: The FP32 model (producers, opset, metadata).
        name: A graph output.
        arrays: Its reference values, one array per sample.

    Returns:
        ``(kind, axis)`` with a non-negative axis, or None.
    """
    if not arrays or arrays[0].dtype.kind != "f" or arrays[0].ndim < 2:
        return None
    rank = arrays[0].ndim
    node = _producer(model, name)
    op = node.op_type if node is not None else ""
    axis = None
    if node is not None and op in ("Softmax", "LogSoftmax"):
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        attr = next((a.i for a in node.attribute if a.name == "axis"), -1 if opset >= 13 else 1)
        axis = attr % rank
        if op == "LogSoftmax":
            return "class-logits", axis
        if not _is_probabilities(arrays, axis):
            axis = None
    if op == "Sigmoid":
        return "sigmoid-map", 0
    if axis is None:
        axis = next((a for a in ((rank - 1, 1) if rank == 4 else (rank - 1,))
                     if _is_probabilities(arrays, a)), None)
    if axis is not None:
        if rank == 3 and axis == 2 and ctc_charset(model, arrays[0].shape[2]) is not None:
            return "ctc", 2
        return "class-probabilities", axis
    classes = arrays[0].shape[-1]
    linear = _linear_head(model, node)
    if rank == 2 and 2 <= classes <= MAX_CLASSES and (linear or op in RESHAPES):
        return "class-logits", 1
    if rank == 3 and 10 <= classes <= MAX_CLASSES and linear:
        return "class-logits", 2
    return None


__all__ = ["SIGMOID_THRESHOLD", "ctc_charset", "detect_decision"]
