"""``saturate-constants``: clamp an out-of-range masking constant to the format's finite range.

    Softmax(s + (1 - m) * -FLT_MAX)  ==  Softmax(s + (1 - m) * -65504)     (moderate scores s)

Why: Hugging Face exporters fill attention masks with ``torch.finfo(torch.float32).min`` =
-3.4028235e38. A strongly typed FP16 model stores it as -inf (ONNX Cast), and the unmasked
positions then compute 0 x -inf = NaN. TensorRT and onnxconverter-common clamp it instead
(``precision.constants``); this rewrite does the same in the FP32 model, so that the constant
fits the target format and its nodes need not stay FP32.

What is clamped: a float constant (initializer or ``Constant``) with finite values beyond the
target format's largest finite value (FP16: 65504 = largest finite IEEE-754 binary16; BF16:
3.3895314e38), every one of whose uses only *masks*: the path from it goes through mask
arithmetic (Add, Sub, Mul, Where, Neg, Min) and data movement (Reshape, Expand, Cast,
Unsqueeze, Squeeze, Transpose, Identity, Flatten, Tile, Concat, Slice, Gather) and ends in
Softmax/LogSoftmax, Max/ReduceMax or a comparison (Less, Greater, LessOrEqual, GreaterOrEqual,
Equal), never in a graph output or other arithmetic. The values beyond the range become
+-max; others (and +-inf) are kept.

In FP32 this is not bit-identical, but exp(-65504 - max) underflows to exactly 0 like
exp(-FLT_MAX - max) when the scores are moderate, so the softmax is the same; ``fix`` proves
it on the samples (``repair.stages.rewrite`` runs the rewritten model in FP32 against the
reference and undoes the rule when an output moves).

Needs the target format: without one (``apply_rewrites`` called with ``target=None``, as
``diagnose``'s engine-rewrite emulation does) the pass records nothing and changes nothing.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import onnx_ir as ir

from precision_doctor.formats import FORMATS, Precision
from precision_doctor.precision.rewrites.graph_edit import (
    RewritePassResult,
    constant_array,
    remove_dead_constants,
    taken_names,
    unique_name,
)
from precision_doctor.precision.rewrites.report import RewriteRecord

MASK_MOVE = frozenset({"Reshape", "Expand", "Cast", "CastLike", "Unsqueeze", "Squeeze",
                       "Transpose", "Identity", "Flatten", "Tile", "Concat", "Slice", "Gather"})
MASK_MATH = frozenset({"Add", "Sub", "Mul", "Where", "Neg", "Min"})
MASK_SINKS = frozenset({"Softmax", "LogSoftmax", "Max", "ReduceMax", "Less", "Greater",
                        "LessOrEqual", "GreaterOrEqual", "Equal"})
MASK_DEPTH = 12  # nodes from the constant to its sink (HF BERT: Mul-Unsqueeze-Add-Softmax)


def masking_only(value: ir.Value) -> str | None:
    """Why ``value`` does not only mask (None when every path from it ends in a sink).

    Args:
        value: A constant graph value.

    Returns:
        None when it only masks; else the reason (``'x' reaches MatMul 'mm'``).
    """
    seen: set[int] = set()
    stack: list[tuple[ir.Value, int]] = [(value, 0)]
    reached = False
    while stack:
        current, depth = stack.pop()
        if current.is_graph_output():
            return f"'{current.name}' is a graph output"
        for node in current.consumers():
            if id(node) in seen:
                continue
            seen.add(id(node))
            op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
            if op in MASK_SINKS:
                reached = True
                continue
            if op not in MASK_MOVE and op not in MASK_MATH:
                return f"'{current.name}' reaches {op} '{node.name}' (not masking)"
            if depth + 1 >= MASK_DEPTH:
                return f"no Softmax/Max/comparison within {MASK_DEPTH} nodes of it"
            stack.extend((out, depth + 1) for out in node.outputs)
    return None if reached else "it reaches no Softmax, Max, ReduceMax or comparison"


class SaturateConstants(ir.passes.InPlacePass):
    """Pass: clamp masking constants beyond the target format's range to +-its max.

    Args:
        target: The reduced format (FP16, BF16); None: the pass does nothing.
    """

    rule: ClassVar[str] = "saturate-constants"

    def __init__(self, target: Precision | None = None) -> None:
        super().__init__()
        self.target = target if target in (Precision.FP16, Precision.BF16) else None

    def call(self, model: ir.Model) -> RewritePassResult:
        """Rewrite in place; one record per out-of-range float constant."""
        if self.target is None:
            return RewritePassResult(model, False, ())
        graph = model.graph
        taken = taken_names(graph)
        fmax = FORMATS[self.target].max
        records = []
        for value in _constants(graph):
            a = constant_array(value)
            if a is None or a.dtype.kind != "f" or a.size == 0:
                continue
            x = a.astype(np.float64)
            over = np.isfinite(x) & (np.abs(x) > fmax)
            if not over.any():
                continue
            record = self._try(graph, value, a, over, fmax, taken)
            records.append(record)
        return RewritePassResult(model, any(r.applied for r in records), tuple(records))

    def _try(self, graph: ir.Graph, value: ir.Value, a: np.ndarray, over: np.ndarray,
             fmax: float, taken: set[str]) -> RewriteRecord:
        users = tuple(sorted({n.name or n.op_type for n in value.consumers()}))
        extreme = float(a.reshape(-1)[np.argmax(np.abs(np.where(over, a, 0)).reshape(-1))])
        fmt = self.target.value.upper() if self.target else ""
        details = {"max_abs": abs(extreme), "value": extreme, "format_max": fmax,
                   "count": int(over.sum()), "numel": int(a.size), "target": fmt.lower()}
        why_not = masking_only(value)
        if why_not is not None:
            return RewriteRecord(self.rule, False, users, (),
                                 f"'{value.name}' ({extreme:.8g}) does not only mask: {why_not}",
                                 details)
        clamped = np.clip(a.astype(np.float64), -fmax, fmax)
        clamped = np.where(np.isfinite(a), clamped, a).astype(a.dtype)
        new = _initializer(graph, clamped,
                           unique_name(f"{value.name or 'constant'}_saturated", taken))
        for node in list(value.consumers()):
            for i, v in enumerate(node.inputs):
                if v is value:
                    node.replace_input_with(i, new)
        remove_dead_constants(graph, [value])
        sign = "-" if extreme < 0 else "+"
        return RewriteRecord(self.rule, True, users, (),
                             f"'{value.name}' ({extreme:.8g}, {int(over.sum())} value(s) beyond "
                             f"{fmt}) only masks: clamped to {sign}{fmax:.8g}, the largest "
                             f"finite {fmt} magnitude, as TensorRT's weight conversion does",
                             details)


def _constants(graph: ir.Graph) -> list[ir.Value]:
    """The graph's constant values: initializers that are not inputs, and ``Constant``
    outputs, in a stable order (initializers by name, then graph order)."""
    values = [v for _, v in sorted(graph.initializers.items()) if not v.is_graph_input()]
    values += [n.outputs[0] for n in graph
               if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.outputs]
    return values


def _initializer(graph: ir.Graph, array: np.ndarray, name: str) -> ir.Value:
    """A new initializer holding ``array`` with its shape, a 0-d scalar included
    (``np.ascontiguousarray`` would make it [1])."""
    tensor = ir.tensor(array.copy(), name=name)
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype),
                     const_value=tensor)
    graph.register_initializer(value)
    return value
