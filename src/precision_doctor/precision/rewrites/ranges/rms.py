"""Decomposed RMSNorm, as PyTorch exports T5's and LLaMA's (``x * rsqrt(mean(x^2) + eps)``):

    p = Pow(x', 2) | Mul(x', x')    x' = x or Cast(x, to=FLOAT)
    m = ReduceMean(p)               any axes
    a = Add(m, eps)                 eps a constant scalar
    r = Sqrt(a)
    y = Mul(x, Reciprocal(r)) | Mul(x, Div(1, r)) | Div(x, r)

It is scale-invariant like ``RMSNormalization``: with x -> s x and eps -> s^2 eps, y is the
same. Every intermediate (p, m, a, r and the reciprocal) must have one consumer, the next node,
and not be a graph output: otherwise the scaled statistics would leak out of the pattern.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from precision_doctor.precision.rewrites.graph_edit import constant_array

FLOAT32 = 1  # ONNX TensorProto.FLOAT, the Cast target of T5's ``.to(torch.float32)``


@dataclass(frozen=True)
class DecomposedRms:
    """One decomposed RMSNorm.

    Attributes:
        head: The squaring node (Pow or Mul).
        add: The ``Add`` of epsilon.
        eps_index: Input index of epsilon in ``add``.
        tail: The node that divides x by the root (its output is the normalized x).
        source: x, the value the pattern normalizes.
    """

    head: ir.Node
    add: ir.Node
    eps_index: int
    tail: ir.Node
    source: ir.Value


def _single_consumer(value: ir.Value | None, op: str | tuple[str, ...]) -> ir.Node | None:
    """The one consumer of ``value`` when it is an ``op`` and ``value`` is no graph output."""
    if value is None or value.is_graph_output() or len(value.uses()) != 1:
        return None
    node = next(iter(value.uses())).node
    ops = (op,) if isinstance(op, str) else op
    return node if node.op_type in ops and node.domain in ("", "ai.onnx") else None


def _scalar(value: ir.Value | None) -> float | None:
    array = constant_array(value)
    return float(array.reshape(-1)[0]) if array is not None and array.size == 1 else None


def _squared(head: ir.Node) -> ir.Value | None:
    """x' when ``head`` is Pow(x', 2) or Mul(x', x')."""
    if head.op_type == "Pow" and len(head.inputs) == 2 and _scalar(head.inputs[1]) == 2.0:
        return head.inputs[0]
    if head.op_type == "Mul" and len(head.inputs) == 2 and head.inputs[0] is head.inputs[1]:
        return head.inputs[0]
    return None


def _sources(squared: ir.Value) -> tuple[ir.Value, ...]:
    """x' itself, and x when x' = Cast(x, to=FLOAT)."""
    producer = squared.producer()
    if producer is not None and producer.op_type == "Cast" and producer.inputs \
            and producer.inputs[0] is not None:
        to = producer.attributes.get("to")
        if to is not None and to.as_int() == FLOAT32:
            return (squared, producer.inputs[0])
    return (squared,)


def from_head(head: ir.Node) -> DecomposedRms | None:
    """The decomposed RMSNorm that starts at the squaring node ``head``, or None."""
    squared = _squared(head)
    if squared is None or head.domain not in ("", "ai.onnx"):
        return None
    mean = _single_consumer(head.outputs[0], "ReduceMean")
    add = _single_consumer(mean.outputs[0], "Add") if mean is not None else None
    if add is None or len(add.inputs) != 2:
        return None
    eps_index = next((i for i in (0, 1) if _scalar(add.inputs[i]) is not None), None)
    root = _single_consumer(add.outputs[0], "Sqrt") if eps_index is not None else None
    if root is None or eps_index is None:
        return None
    after = _single_consumer(root.outputs[0], ("Reciprocal", "Div", "Mul"))
    if after is None:
        return None
    tail: ir.Node | None = after
    one_over = after.op_type == "Div" and _scalar(after.inputs[0]) == 1.0
    if after.op_type == "Div" and after.inputs[1] is root.outputs[0] and not one_over:
        data = after.inputs[0]  # Div(x, r)
    else:
        if after.op_type == "Mul" or (after.op_type == "Div" and not one_over):
            return None
        tail = _single_consumer(after.outputs[0], "Mul")  # Mul(x, 1/r)
        if tail is None:
            return None
        data = next((v for v in tail.inputs if v is not after.outputs[0]), None)
    if data is None or not any(data is s for s in _sources(squared)):
        return None
    assert tail is not None
    return DecomposedRms(head, add, eps_index, tail, data)


def rms_reading(node: ir.Node, value: ir.Value) -> DecomposedRms | None:
    """The decomposed RMSNorm of ``value`` that ``node`` (a consumer of ``value``) is the head
    or the tail of, or None."""
    if node.op_type in ("Pow", "Mul"):
        found = from_head(node)
        if found is not None and (found.source is value or _squared(node) is value):
            return found
    if node.op_type not in ("Mul", "Div"):
        return None
    for other in node.inputs:
        if other is None or other is value:
            continue
        producer = other.producer()
        root = producer
        if producer is not None and producer.op_type in ("Reciprocal", "Div"):
            root = producer.inputs[-1].producer() if producer.inputs[-1] is not None else None
        add = _producer_of(root.inputs[0]) if root is not None and root.op_type == "Sqrt" \
            else None
        mean = _producer_of(next((v for v in add.inputs if constant_array(v) is None), None)) \
            if add is not None and add.op_type == "Add" else None
        if mean is not None and mean.inputs and mean.inputs[0] is not None:
            head = mean.inputs[0].producer()
            found = from_head(head) if head is not None else None
            if found is not None and found.tail is node and found.source is value:
                return found
    return None


def _producer_of(value: ir.Value | None) -> ir.Node | None:
    return value.producer() if value is not None else None


def epsilon_of(rms: DecomposedRms) -> float:
    """The pattern's epsilon (a constant scalar, checked by ``from_head``)."""
    array = constant_array(rms.add.inputs[rms.eps_index])
    assert array is not None
    return float(np.asarray(array).reshape(-1)[0])
