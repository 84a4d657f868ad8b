"""Tiny attention models whose mask is filled with -FLT_MAX, as Hugging Face exporters write it.

``attention(variant)``: x [1, 4, 8] and an attention mask [1, 4] -> y [1, 4, 8].

- ``"mul"``: ``(1 - Cast(mask)) * -FLT_MAX`` added to the scaled scores (BERT's extended mask):
  in FP16 the constant is -inf and the unmasked positions compute 0 x -inf = NaN.
- ``"where"``: ``Where(mask, scores, -FLT_MAX)`` into the Softmax: a fully masked row is all
  -inf in FP16, and its softmax NaN (FP32: -FLT_MAX everywhere, a uniform row).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLT_MIN = float(np.finfo(np.float32).min)  # -3.4028235e38


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def attention(variant: str = "mul", seed: int = 0) -> onnx.ModelProto:
    """The model (opset 17, nodes named)."""
    rng = np.random.default_rng(seed)
    inits = [_init(n, (rng.standard_normal((8, 8)) * 0.3).astype(np.float32))
             for n in ("Wq", "Wk", "Wv")]
    inits += [_init("scale", np.array(0.35, np.float32)), _init("one", np.array(1.0, np.float32)),
              _init("fill", np.array(FLT_MIN, np.float32)), _init("axes1", np.array([1]))]
    nodes = [helper.make_node("MatMul", ["x", "Wq"], ["q"], name="q_proj"),
             helper.make_node("MatMul", ["x", "Wk"], ["k"], name="k_proj"),
             helper.make_node("MatMul", ["x", "Wv"], ["v"], name="v_proj"),
             helper.make_node("Transpose", ["k"], ["kt"], name="k_t", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"], name="qk"),
             helper.make_node("Mul", ["qk", "scale"], ["scores"], name="scale_mul")]
    if variant == "mul":
        mask_in = helper.make_tensor_value_info("mask", TensorProto.INT64, [1, 4])
        nodes += [helper.make_node("Cast", ["mask"], ["mf"], name="mask_cast",
                                   to=TensorProto.FLOAT),
                  helper.make_node("Sub", ["one", "mf"], ["inv"], name="mask_sub"),
                  helper.make_node("Mul", ["inv", "fill"], ["bias"], name="mask_mul"),
                  helper.make_node("Unsqueeze", ["bias", "axes1"], ["bias3"], name="mask_unsq"),
                  helper.make_node("Add", ["scores", "bias3"], ["masked"], name="mask_add")]
    elif variant == "where":
        mask_in = helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, 4])
        nodes += [helper.make_node("Unsqueeze", ["mask", "axes1"], ["mask3"], name="mask_unsq"),
                  helper.make_node("Where", ["mask3", "scores", "fill"], ["masked"],
                                   name="mask_where")]
    else:
        raise ValueError(variant)
    nodes += [helper.make_node("Softmax", ["masked"], ["p"], name="softmax", axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["y"], name="pv")]
    graph = helper.make_graph(
        nodes, f"mask_{variant}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8]), mask_in],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def feeds(variant: str = "mul", seed: int = 0, masked_row: bool = False) -> dict[str, np.ndarray]:
    """One sample: x [1, 4, 8] float32 and the mask [1, 4] (the last key position masked;
    ``masked_row``: every key position masked, for ``where``)."""
    rng = np.random.default_rng(100 + seed)
    x = rng.standard_normal((1, 4, 8)).astype(np.float32)
    keep = np.array([[1, 1, 1, 0]])
    if masked_row:
        keep = np.zeros((1, 4), np.int64)
    mask = keep.astype(bool) if variant == "where" else keep.astype(np.int64)
    return {"x": x, "mask": mask}


def arithmetic_constant() -> onnx.ModelProto:
    """A constant beyond the FP16 range that feeds ordinary arithmetic (a MatMul), not a mask:
    x [1, 4] -> y [1, 4]."""
    nodes = [helper.make_node("Mul", ["x", "big"], ["xb"], name="big_mul"),
             helper.make_node("MatMul", ["xb", "W"], ["h"], name="mm"),
             helper.make_node("Softmax", ["h"], ["y"], name="softmax", axis=-1)]
    graph = helper.make_graph(
        nodes, "arith", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [_init("big", np.array(1e5, np.float32)),
         _init("W", np.eye(4, dtype=np.float32) * 1e-5)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model
