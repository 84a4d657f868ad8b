"""``fold-bias-add``: move a per-channel constant ``Add`` after a Conv/ConvTranspose into the
op's own bias input.

    Add(Conv(x, W, b), c) = Conv(x, W, b + c)   when c broadcasts as [1, M, 1, ...] or a scalar

Why the real models need it: PaddlePaddle's exporter writes every ConvTranspose bias of
PP-OCRv4 det as a separate ``Add`` of a [1, M, 1, 1] constant. The third BatchNormalization of
det sits behind such an Add (ConvTranspose -> Add -> BatchNormalization), so ``fold-batchnorm``
can only fold it once the bias is inside the ConvTranspose. It also removes one FP16 rounding of
the pre-bias activation (the bias is added in the convolution's accumulator). In FP32 the sum
b + c is one correctly rounded addition, so the result equals the original up to the order of
one float32 rounding.

Only Adds of a Conv/ConvTranspose output and a constant get a record (applied, or skipped with
the reason); other Adds (e.g. residual Adds of two activations) are not candidates.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import onnx_ir as ir

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
from precision_doctor.precision.rewrites.report import RewriteRecord

CONV_OPS = ("Conv", "ConvTranspose")


def output_channels(op_type: str, weight: np.ndarray, group: int) -> int:
    """Output channels M of Conv (W: [M, C/g, k...]) or ConvTranspose (W: [C, M/g, k...])."""
    return int(weight.shape[0]) if op_type == "Conv" else int(weight.shape[1]) * group


def per_channel_vector(constant: np.ndarray, rank: int, channels: int) -> np.ndarray | None:
    """``constant`` as an [M] vector when it broadcasts over an [N, M, ...] tensor only along M.

    Args:
        constant: The Add's constant operand.
        rank: Rank of the convolution output (= rank of its weight).
        channels: M.

    Returns:
        The [M] vector (same dtype), or None when the constant varies along another axis or is
        not broadcastable.
    """
    if constant.ndim > rank:
        return None
    shape = (1,) * (rank - constant.ndim) + tuple(constant.shape)
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(constant.reshape(-1), (channels,)).copy()


class FoldBiasAdd(ir.passes.InPlacePass):
    """Pass: fold ``Add(Conv|ConvTranspose(...), per-channel constant)`` into the conv's bias."""

    rule: ClassVar[str] = "fold-bias-add"

    def call(self, model: ir.Model) -> RewritePassResult:
        """Fold in place; one record per candidate Add of the main graph."""
        graph = model.graph
        taken = taken_names(graph)
        records: list[RewriteRecord] = []
        for add in [n for n in graph if n.op_type == "Add" and n.domain == ""]:
            producers = [v.producer() if v is not None else None for v in add.inputs]
            conv_inputs = [i for i, p in enumerate(producers)
                           if p is not None and p.op_type in CONV_OPS and p.domain == ""]
            if not conv_inputs:
                continue
            record = self._try(graph, add, conv_inputs[0], taken)
            if record is not None:  # None: a residual Add (non-constant operand), no candidate
                records.append(record)
        return RewritePassResult(model, any(r.applied for r in records), tuple(records))

    def _try(self, graph: ir.Graph, add: ir.Node, index: int,
             taken: set[str]) -> RewriteRecord | None:
        y = add.inputs[index]
        conv = y.producer() if y is not None else None
        assert y is not None and conv is not None  # the caller picked a Conv output
        other = add.inputs[1 - index]
        names = (conv.name or "", add.name or "")
        constant = constant_array(other)
        if constant is None:
            return None
        others = other_consumers(y, [add])
        if others:
            return RewriteRecord(self.rule, False, names, (), f"{conv.op_type} output '{y.name}' "
                                 f"has another consumer ({', '.join(others)})")
        weight = constant_array(conv.inputs[1])
        if weight is None:
            return RewriteRecord(self.rule, False, names, (),
                                 f"{conv.op_type} weight is not a constant, so its channel count "
                                 "is unknown")
        group_attr = conv.attributes.get("group")
        channels = output_channels(conv.op_type, weight, group_attr.as_int() if group_attr else 1)
        vector = per_channel_vector(constant, weight.ndim, channels)
        if vector is None:
            return RewriteRecord(self.rule, False, names, (),
                                 f"constant of shape {list(constant.shape)} is not per-channel "
                                 f"for {channels} output channels "
                                 f"(expected [1, {channels}, 1, ...])")
        if constant.dtype != weight.dtype:
            return RewriteRecord(self.rule, False, names, (), f"constant dtype {constant.dtype} "
                                 f"differs from the weight dtype {weight.dtype}")
        bias_value = conv.inputs[2] if len(conv.inputs) > 2 else None
        bias = constant_array(bias_value)
        if bias_value is not None and bias is None:
            return RewriteRecord(self.rule, False, names, (),
                                 f"{conv.op_type} bias is not a constant "
                                 f"({describe_source(bias_value)})")
        # float64 sum then one rounding == the correctly rounded float32 sum b + c.
        total = (vector.astype(np.float64) if bias is None
                 else bias.astype(np.float64) + vector).astype(weight.dtype)
        base = f"{bias_value.name}_plus_add" if bias_value is not None else f"{conv.name}_bias"
        b_new = add_initializer(graph, total, unique_name(base, taken))
        new_conv = ir.Node("", conv.op_type, [conv.inputs[0], conv.inputs[1], b_new],
                           list(conv.attributes.values()), name=conv.name,
                           doc_string=conv.doc_string, metadata_props=dict(conv.metadata_props))
        ir.convenience.replace_nodes_and_values(graph, add, [conv, add], [new_conv],
                                                [add.outputs[0]], [new_conv.outputs[0]])
        removed = remove_dead_constants(graph, [other, bias_value])
        return RewriteRecord(
            self.rule, True, (*names, *removed), (new_conv.name or "",),
            f"Add '{add.name}' of a [{channels}] per-channel constant folded into the bias of "
            f"{conv.op_type} '{conv.name}' (output '{new_conv.outputs[0].name}' kept)",
            {"channels": channels, "bias_absmax": float(np.max(np.abs(total)))})
