"""``fold-batchnorm``: fold an inference ``BatchNormalization`` into the Conv/ConvTranspose/Gemm
that feeds it.

    BN(y) = gamma * (y - mean) / sqrt(var + eps) + beta,  y = W * x + b
    => W' = W * s,  b' = (b - mean) * s + beta,  s = gamma / sqrt(var + eps)   (per out channel)

(ONNX BatchNormalization spec; the same algebra as onnxscript's ``_fuse_batchnorm`` rule, computed
here in float64 and cast once to the weight dtype.) Why it matters for FP16: PP-OCRv4 det has a
BatchNormalization whose running variance reaches 9.8e7 (> FP16 max 65504) after a Conv whose
output reaches ~2e4; folded, the parameter and the large pre-BN activation disappear. The folded
weights' range is reported (``details``) because a tiny ``s`` can push weights into FP16
subnormals.

The BN's output tensor name is kept (the folded op now produces it), so graph outputs and
downstream names are stable; the producer keeps its node name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import onnx_ir as ir

from precision_doctor.formats import FORMATS, Precision
from precision_doctor.precision.rewrites.graph_edit import (
    RewritePassResult,
    add_initializer,
    constant_array,
    describe_source,
    other_consumers,
    remove_dead_constants,
    taken_names,
    unique_name,
)
from precision_doctor.precision.rewrites.report import Detail, RewriteRecord

FOLDABLE_PRODUCERS = ("Conv", "ConvTranspose", "Gemm")
# ONNX BatchNormalization default epsilon (https://onnx.ai/onnx/operators/onnx__BatchNormalization.html)
DEFAULT_BN_EPSILON = 1e-5


def _int_attr(node: ir.Node, name: str, default: int) -> int:
    attr = node.attributes.get(name)
    return default if attr is None else attr.as_int()


def _float_attr(node: ir.Node, name: str, default: float) -> float:
    attr = node.attributes.get(name)
    return default if attr is None else attr.as_float()


def fold_batchnorm_params(op_type: str, weight: np.ndarray, bias: np.ndarray | None,
                          gamma: np.ndarray, beta: np.ndarray, mean: np.ndarray, var: np.ndarray,
                          epsilon: float, *, group: int = 1, trans_b: bool = False,
                          gemm_beta: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """New weight and bias of ``op_type`` with a following BatchNormalization folded in.

    Computed in float64, returned in ``weight.dtype``.

    Args:
        op_type: ``Conv`` (W: [M, C/group, k...]), ``ConvTranspose`` (W: [C, M/group, k...]) or
            ``Gemm`` (B: [K, M], or [M, K] when ``trans_b``).
        weight: The producer's weight.
        bias: The producer's bias (Conv/ConvTranspose: [M]; Gemm: C, broadcastable to [N, M]),
            or None.
        gamma, beta, mean, var: BatchNormalization scale, bias, running mean and variance, [M].
        epsilon: BatchNormalization epsilon.
        group: Conv/ConvTranspose ``group`` attribute.
        trans_b: Gemm ``transB`` attribute.
        gemm_beta: Gemm ``beta`` attribute (folded into the new bias; drop it from the node).

    Returns:
        ``(weight', bias')``; bias' is [M] (Gemm: C's broadcast with [M]).

    Raises:
        ValueError: Channel counts of the weight and the BN parameters disagree.
    """
    w = weight.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):  # reported by the caller
        s = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + float(epsilon))
    m = s.shape[0]
    if op_type == "Conv":
        if w.shape[0] != m:
            raise ValueError(f"Conv has {w.shape[0]} output channels, BatchNormalization {m}")
        w_new = w * s.reshape((m,) + (1,) * (w.ndim - 1))
    elif op_type == "ConvTranspose":
        c_in, m_per_group, kernel = w.shape[0], w.shape[1], w.shape[2:]
        if m_per_group * group != m or c_in % group:
            raise ValueError(f"ConvTranspose weight {w.shape} with group={group} does not give "
                             f"{m} output channels")
        grouped = w.reshape((group, c_in // group, m_per_group) + kernel)
        s_grouped = s.reshape((group, 1, m_per_group) + (1,) * len(kernel))
        w_new = (grouped * s_grouped).reshape(w.shape)
    elif op_type == "Gemm":
        axis = 0 if trans_b else 1
        if w.shape[axis] != m:
            raise ValueError(f"Gemm has {w.shape[axis]} output features, BatchNormalization {m}")
        w_new = w * (s[:, None] if trans_b else s[None, :])
    else:
        raise ValueError(f"cannot fold BatchNormalization into {op_type}")
    b = np.zeros(m) if bias is None else bias.astype(np.float64) * (gemm_beta if op_type == "Gemm"
                                                                      else 1.0)
    b_new = (b - mean.astype(np.float64)) * s + beta.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return w_new.astype(weight.dtype), b_new.astype(weight.dtype)


def weight_range_details(weight: np.ndarray, folded: np.ndarray, var: np.ndarray,
                         scale: np.ndarray) -> dict[str, Detail]:
    """FP16 range evidence for a fold: what left the graph, what the new weights look like.

    Thresholds are IEEE binary16's (max 65504, smallest normal 2**-14, see ``formats.FORMATS``).

    Args:
        weight: Weight before folding.
        folded: Weight after folding.
        var: BN running variance (removed from the graph).
        scale: Per-channel factor ``gamma / sqrt(var + eps)``.
    """
    fp16 = FORMATS[Precision.FP16]
    a = np.abs(folded.astype(np.float64))
    nonzero = a[a > 0]
    w32 = folded.astype(np.float32)
    with np.errstate(over="ignore"):
        w16 = w32.astype(np.float16).astype(np.float64)
    norm = float(np.linalg.norm(w32.astype(np.float64)))
    finite = norm and np.isfinite(w16).all()
    err = float(np.linalg.norm(w16 - w32)) / norm if finite else float("inf")
    return {
        "bn_var_max": float(np.max(var)),
        "bn_var_over_fp16_max": int(np.sum(np.abs(var) > fp16.max)),
        "scale_min": float(np.min(np.abs(scale))),
        "scale_max": float(np.max(np.abs(scale))),
        "weight_absmax_before": float(np.max(np.abs(weight))) if weight.size else 0.0,
        "weight_absmax_after": float(a.max()) if a.size else 0.0,
        "weight_absmin_nonzero_after": float(nonzero.min()) if nonzero.size else 0.0,
        "weight_fp16_overflow_count": int(np.sum(a > fp16.max)),
        "weight_fp16_subnormal_fraction": float(np.mean(nonzero < fp16.min_normal))
        if nonzero.size else 0.0,
        "weight_fp16_rel_rounding_error": err,
    }


@dataclass(frozen=True)
class _Match:
    bn: ir.Node
    producer: ir.Node
    weight: np.ndarray
    bias: np.ndarray | None
    params: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    epsilon: float


def check_batchnorm(bn: ir.Node) -> _Match | str:
    """Match ``BN(Conv|ConvTranspose|Gemm(x, W, b))``; the reason as a string when it fails."""
    if _int_attr(bn, "training_mode", 0) or any(v.uses() or v.is_graph_output()
                                                for v in bn.outputs[1:]):
        return "BatchNormalization is in training mode (its running statistics are read); " \
               "only the inference form can be folded"
    if not _int_attr(bn, "spatial", 1):
        return "BatchNormalization has spatial=0 (per-element statistics)"
    x = bn.inputs[0]
    producer = x.producer() if x is not None else None
    if x is None or producer is None or producer.domain != "" \
            or producer.op_type not in FOLDABLE_PRODUCERS:
        hint = ""
        feeding = [i.producer() for i in (producer.inputs if producer is not None else ())
                   if i is not None]
        if producer is not None and producer.op_type == "Add" and any(
                f is not None and f.op_type in ("Conv", "ConvTranspose") for f in feeding):
            hint = " (a bias Add sits between the convolution and the BatchNormalization: " \
                   "run fold-bias-add first)"
        return f"input comes from {describe_source(x)}, not from " \
               f"{'/'.join(FOLDABLE_PRODUCERS)}{hint}"
    others = other_consumers(x, [bn])
    if others:
        return f"{producer.op_type} output '{x.name}' has another consumer ({', '.join(others)})"
    weight = constant_array(producer.inputs[1] if len(producer.inputs) > 1 else None)
    if weight is None:
        return f"{producer.op_type} weight is not a constant " \
               f"({describe_source(producer.inputs[1] if len(producer.inputs) > 1 else None)})"
    if not np.issubdtype(weight.dtype, np.floating):
        return f"{producer.op_type} weight has dtype {weight.dtype}, not floating point"
    bias_value = producer.inputs[2] if len(producer.inputs) > 2 else None
    bias = constant_array(bias_value)
    if bias_value is not None and bias is None:
        return f"{producer.op_type} bias is not a constant ({describe_source(bias_value)})"
    params = []
    for label, value in zip(("scale", "B", "input_mean", "input_var"), bn.inputs[1:5]):
        array = constant_array(value)
        if array is None:
            return f"BatchNormalization {label} is not a constant ({describe_source(value)})"
        if array.ndim != 1:
            return f"BatchNormalization {label} has shape {array.shape}, expected [C]"
        params.append(array)
    epsilon = _float_attr(bn, "epsilon", DEFAULT_BN_EPSILON)
    return _Match(bn, producer, weight, bias, tuple(params), epsilon)  # type: ignore[arg-type]


class FoldBatchNorm(ir.passes.InPlacePass):
    """Pass: fold every foldable ``BatchNormalization`` into its Conv/ConvTranspose/Gemm.

    Every BatchNormalization of the main graph gets a record: applied (with weight-range
    details) or skipped with the reason.
    """

    rule: ClassVar[str] = "fold-batchnorm"

    def call(self, model: ir.Model) -> RewritePassResult:
        """Fold in place; one record per BatchNormalization of the main graph."""
        graph = model.graph
        taken = taken_names(graph)
        records: list[RewriteRecord] = []
        for bn in [n for n in graph if n.op_type == "BatchNormalization" and n.domain == ""]:
            match = check_batchnorm(bn)
            if isinstance(match, str):
                records.append(RewriteRecord(self.rule, False, (bn.name or "",), (), match))
                continue
            try:
                records.append(self._rewrite(graph, match, taken))
            except ValueError as exc:  # channel counts disagree, or a non-finite result
                records.append(RewriteRecord(self.rule, False, (match.producer.name or "",
                                                                bn.name or ""), (), str(exc)))
        return RewritePassResult(model, any(r.applied for r in records), tuple(records))

    def _rewrite(self, graph: ir.Graph, m: _Match, taken: set[str]) -> RewriteRecord:
        p = m.producer
        weight_value = p.inputs[1]
        assert weight_value is not None  # checked by check_batchnorm
        gamma, beta, mean, var = m.params
        gemm_beta = _float_attr(p, "beta", 1.0) if p.op_type == "Gemm" else 1.0
        new_w, new_b = fold_batchnorm_params(
            p.op_type, m.weight, m.bias, gamma, beta, mean, var, m.epsilon,
            group=_int_attr(p, "group", 1), trans_b=bool(_int_attr(p, "transB", 0)),
            gemm_beta=gemm_beta)
        if not (np.isfinite(new_w).all() and np.isfinite(new_b).all()):
            raise ValueError(f"folded parameters are not finite in {new_w.dtype} (variance + "
                             "epsilon <= 0, or the product overflows); BatchNormalization kept")
        w_value = add_initializer(graph, new_w, unique_name(f"{weight_value.name}_bnfold", taken))
        bias_value = p.inputs[2] if len(p.inputs) > 2 else None
        b_base = f"{bias_value.name}_bnfold" if bias_value is not None else f"{m.bn.name}_bias"
        b_value = add_initializer(graph, new_b, unique_name(b_base, taken))
        attributes = [a for a in p.attributes.values() if not (p.op_type == "Gemm"
                                                                and a.name == "beta")]
        folded = ir.Node("", p.op_type, [p.inputs[0], w_value, b_value], attributes,
                         name=p.name, doc_string=p.doc_string,
                         metadata_props=dict(p.metadata_props))
        old_inputs = list(p.inputs[1:]) + list(m.bn.inputs[1:])
        ir.convenience.replace_nodes_and_values(
            graph, m.bn, [p, m.bn], [folded], [m.bn.outputs[0]], [folded.outputs[0]])
        removed = remove_dead_constants(graph, old_inputs)
        scale = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + m.epsilon)
        details = weight_range_details(m.weight, new_w, var, scale)
        reason = (f"folded into {p.op_type} '{p.name}' (output '{folded.outputs[0].name}' kept); "
                  f"BN variance max {details['bn_var_max']:.3g} removed; folded |W| <= "
                  f"{details['weight_absmax_after']:.3g}, "
                  f"{100 * float(details['weight_fp16_subnormal_fraction']):.1f}% FP16-subnormal")
        return RewriteRecord(self.rule, True, (p.name or "", m.bn.name or "", *removed),
                             (folded.name or "",), reason, details)
