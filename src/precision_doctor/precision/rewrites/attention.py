"""``prescale-attention``: apply the 1/sqrt(d) attention scale to Q before QK^T, not after.

    Softmax(MatMul(Q, K^T) * s)  ==  Softmax(MatMul(Q * s, K^T))      (s a constant scalar)

Why: an exporter that writes the scale after the MatMul (Hugging Face eager attention,
``torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)``) stores QK^T unscaled; in FP16 that
tensor overflows at 65504 although the softmax input s * QK^T, sqrt(d) times smaller (8x for
d = 64), would fit. Scaling Q first keeps every stored tensor as small as the softmax input.

How: when Q is ``[Add(] MatMul(x, W) [, b)]`` followed only by data-movement nodes (Reshape,
Transpose, ...) with constant W (and b), the scale is folded into W and b: no node is added and
the FP16 product x @ (s W) is rounded once, like x @ W was. Otherwise a ``Mul(Q, s)`` is inserted
before the MatMul. The scale node is then removed. In FP32 the result equals the original up to
float32 rounding (s * (q . k) vs (s q) . k: one rounding per product either way).

Checks (each failure is a record with its reason): the Softmax is fed by a MatMul of two
activations through scale/mask/data-movement nodes; there is a constant scalar ``Div``/``Mul``
on that path that is not 1; only data-movement nodes separate it from the MatMul (a mask added
before the scale must not be scaled); every value in between has no other consumer.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import onnx_ir as ir

from precision_doctor.precision.rewrites.graph_edit import (
    RewritePassResult,
    add_initializer,
    constant_array,
    other_consumers,
    taken_names,
    unique_name,
)
from precision_doctor.precision.rewrites.report import RewriteRecord

_MOVE = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Cast",
                   "Flatten"})
_PATH = _MOVE | {"Div", "Mul", "Add", "Sub", "Where"}
_MAX_HOPS = 6


def _scalar(value: ir.Value | None) -> float | None:
    a = constant_array(value)
    if a is None or a.size != 1 or a.dtype.kind != "f":
        return None
    return float(a.reshape(-1)[0])


def _is_activation(value: ir.Value | None) -> bool:
    return value is not None and constant_array(value) is None


class PrescaleAttention(ir.passes.InPlacePass):
    """Pass: move each constant attention scale from after QK^T onto Q (weights or a Mul)."""

    rule: ClassVar[str] = "prescale-attention"

    def call(self, model: ir.Model) -> RewritePassResult:
        """Rewrite in place; one record per Softmax fed by a QK^T MatMul."""
        graph = model.graph
        taken = taken_names(graph)
        records = []
        for softmax in [n for n in graph if n.op_type == "Softmax" and n.domain == ""]:
            record = self._try(graph, softmax, taken)
            if record is not None:
                records.append(record)
        return RewritePassResult(model, any(r.applied for r in records), tuple(records))

    def _try(self, graph: ir.Graph, softmax: ir.Node, taken: set[str]) -> RewriteRecord | None:
        path: list[ir.Node] = []
        value: ir.Value | None = softmax.inputs[0]
        matmul: ir.Node | None = None
        for _ in range(_MAX_HOPS):
            node = value.producer() if value is not None else None
            if node is None:
                break
            if node.op_type == "MatMul":
                matmul = node
                break
            if node.op_type not in _PATH:
                break
            path.append(node)
            nxt = [v for v in node.inputs
                   if v is not None and _is_activation(v) and v.producer() is not None]
            if node.op_type == "Where":
                nxt = nxt[1:] or nxt
            if not nxt:
                break
            value = next((v for v in nxt if getattr(v.producer(), "op_type", "") == "MatMul"),
                         nxt[0])
        if matmul is None or not all(_is_activation(v) for v in matmul.inputs[:2]):
            return None  # not attention (a classifier head's Softmax, ...): no candidate
        names: tuple[str, ...] = (matmul.name or "", softmax.name or "")
        scale_at = next((i for i, n in enumerate(reversed(path)) if n.op_type in ("Div", "Mul")
                         and _scalar(n.inputs[1]) is not None), None)
        if scale_at is None:
            return RewriteRecord(self.rule, False, names, (),
                                 "no constant scale between the QK^T MatMul and the Softmax "
                                 "(already pre-scaled, or unscaled)")
        between = list(reversed(path))[:scale_at]
        scale_node = list(reversed(path))[scale_at]
        c = _scalar(scale_node.inputs[1])
        assert c is not None
        s = 1.0 / c if scale_node.op_type == "Div" else c
        names = (matmul.name or "", scale_node.name or "", softmax.name or "")
        if s == 1.0:
            return RewriteRecord(self.rule, False, names, (),
                                 f"the scale {scale_node.op_type} '{scale_node.name}' is 1: Q "
                                 "is already pre-scaled", {"scale": s})
        moved = [n for n in between if n.op_type not in _MOVE]
        if moved:
            return RewriteRecord(self.rule, False, names, (),
                                 f"{moved[0].op_type} '{moved[0].name}' (a mask?) sits between "
                                 "QK^T and the scale; scaling Q would scale it too")
        for v in [matmul.outputs[0], *(n.outputs[0] for n in between)]:
            others = other_consumers(v, [*between, scale_node])
            if others:
                return RewriteRecord(self.rule, False, names, (),
                                     f"'{v.name}' has another consumer ({', '.join(others)})")
        if scale_node.outputs[0].is_graph_output():
            return RewriteRecord(self.rule, False, names, (),
                                 f"the scaled scores '{scale_node.outputs[0].name}' are a graph "
                                 "output")
        q = matmul.inputs[0]
        data = scale_node.inputs[0]
        assert q is not None and data is not None  # both are activations (checked above)
        where = self._fold_into_weights(graph, q, s, taken)
        new_nodes: tuple[str, ...] = ()
        if where is None:
            dtype = q.dtype.numpy() if q.dtype is not None else np.float32
            const = add_initializer(graph, np.asarray(s, dtype=dtype),
                                    unique_name(f"{matmul.name}_prescale", taken))
            mul = ir.Node("", "Mul", [q, const], name=unique_name(f"{matmul.name}/prescale_q",
                                                                  taken))
            mul.outputs[0].name = unique_name(f"{q.name}_prescaled", taken)
            if q.dtype is not None:
                mul.outputs[0].dtype, mul.outputs[0].shape = q.dtype, q.shape
            graph.insert_before(matmul, mul)
            matmul.replace_input_with(0, mul.outputs[0])
            where, new_nodes = f"a Mul '{mul.name}' on Q", (mul.name or "",)
        scale_node.outputs[0].replace_all_uses_with(data)
        graph.remove(scale_node, safe=True)
        return RewriteRecord(self.rule, True, names, new_nodes,
                             f"attention scale {s:.6g} moved from {scale_node.op_type} "
                             f"'{scale_node.name}' after QK^T onto Q ({where})", {"scale": s})

    def _fold_into_weights(self, graph: ir.Graph, q: ir.Value, s: float,
                           taken: set[str]) -> str | None:
        """Scale Q's projection ``[Add(] MatMul(x, W) [, b)]`` in place; None when impossible."""
        value: ir.Value | None = q
        for _ in range(_MAX_HOPS):
            if value is None:
                return None
            node = value.producer()
            if node is None or len(value.uses()) != 1 or value.is_graph_output():
                return None
            if node.op_type in _MOVE and node.op_type != "Cast":
                value = node.inputs[0]
                continue
            break
        if value is None:
            return None
        node = value.producer()
        add = None
        if node is not None and node.op_type == "Add":
            b_idx = next((i for i, v in enumerate(node.inputs) if constant_array(v) is not None),
                         None)
            if b_idx is None:
                return None
            mm_in = node.inputs[1 - b_idx]
            if mm_in is None or len(mm_in.uses()) != 1:
                return None
            add, node = (node, b_idx), mm_in.producer()
        if node is None or node.op_type not in ("MatMul", "Gemm"):
            return None
        w_idx = 1
        w_value = node.inputs[w_idx]
        w = constant_array(w_value)
        if w is None or w_value is None or len(w_value.uses()) != 1 or w.dtype.kind != "f":
            return None
        if node.op_type == "Gemm" and len(node.inputs) > 2:
            return None  # Gemm's own bias: keep the simple MatMul/Add case only
        new_w = add_initializer(graph, (w.astype(np.float64) * s).astype(w.dtype),
                                unique_name(f"{w_value.name}_prescaled", taken))
        node.replace_input_with(w_idx, new_w)
        folded = f"weights of {node.op_type} '{node.name}'"
        if add is not None:
            add_node, b_idx = add
            b_value = add_node.inputs[b_idx]
            b = constant_array(b_value)
            assert b is not None and b_value is not None
            new_b = add_initializer(graph, (b.astype(np.float64) * s).astype(b.dtype),
                                    unique_name(f"{b_value.name}_prescaled", taken))
            add_node.replace_input_with(b_idx, new_b)
            folded += f" and bias of Add '{add_node.name}'"
        return folded
