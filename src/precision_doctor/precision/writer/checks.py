"""Why a node the plan puts in FP16/BF16 must be written in FP32 instead.

* ``parameter-out-of-range``: a float parameter (initializer, ``Constant``, or a constant moved by
  data-movement ops) has a finite |x| above the format's largest finite value (65504 for FP16,
  IEEE-754 binary16). Converting it would give inf; values are never clamped (onnxconverter-
  common clamps to 1e4 silently, see ANCHORS.md), so the node stays FP32 and the report says so.
* ``type-not-allowed``: the ONNX schema of the op does not accept the format at any opset the
  writer may raise to (e.g. Range accepts float16 only from opset 27).
* ``shape-computation``: float arithmetic on values computed from ``Shape``/``Size`` only (sizes
  for Resize/Reshape in PyTorch exports); FP16 represents integers exactly only up to 2048.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from precision_doctor.formats import FORMATS, Precision
from precision_doctor.graph.constants import attr_tensor, const_tensor
from precision_doctor.precision.plan import DATA_MOVEMENT_OPS
from precision_doctor.precision.writer.report import KeptNode
from precision_doctor.precision.writer.schema import TypeGroup, first_opset_allowing, op_schema

LOW = {Precision.FP16: ir.DataType.FLOAT16, Precision.BF16: ir.DataType.BFLOAT16}
MOVE_OPS = DATA_MOVEMENT_OPS - {"Constant", "Cast", "CastLike", "ConstantOfShape", "Range"}
MAX_KNOWN_OPSET = 28  # only used to tell the user which opset would accept a type


@dataclass
class ConstantMemo:
    """What the writes of one unchanged model's plans can share about its constants, by tensor
    name (``writer.core.PlanWriter``; a search with a real engine writes a model per plan).

    Attributes:
        overflow: (name, precision) -> ``(max finite |x|, count above the format max)``, or
            None when every finite value fits.
        converted: (name, ONNX element type) -> the FP16/BF16 array ``apply.convert_array``
            made and its flush warning.
    """

    overflow: dict[tuple[str, Precision], tuple[float, int] | None] = field(default_factory=dict)
    converted: dict[tuple[str, int], tuple[np.ndarray, str]] = field(default_factory=dict)


class ConstantView:
    """Read-only view of the main graph's constant tensors, with cached statistics.

    Constants are initializers that are not graph inputs (a user cannot override them) and
    outputs of ``Constant`` nodes (PaddlePaddle writes every weight as one).

    Args:
        is_float: Whether a value is a float32 tensor (from the model or shape inference).
        memo: Facts shared with other writes of the same unchanged model, or None.
    """

    def __init__(self, is_float: Callable[[ir.Value | None], bool],
                 memo: ConstantMemo | None = None) -> None:
        self.is_float = is_float
        self.memo = memo
        self._arrays: dict[ir.Value, np.ndarray | None] = {}
        self._leaves: dict[ir.Value, tuple[ir.Value, ...] | None] = {}

    def overflow(self, v: ir.Value, precision: Precision) -> tuple[float, int] | None:
        """``(max finite |x|, count above the format max)`` of constant ``v`` when some finite
        value does not fit ``precision``; None when all fit or ``v`` is not readable."""
        key = (v.name or "", precision)
        if self.memo is not None and key[0] and key in self.memo.overflow:
            return self.memo.overflow[key]
        array = self.array(v)
        found = None if array is None else _overflow(array, precision)
        if self.memo is not None and key[0]:
            self.memo.overflow[key] = found
        return found

    @staticmethod
    def is_constant(v: ir.Value | None) -> bool:
        """True for an initializer (not a graph input) or a ``Constant`` node output."""
        if v is None or v.is_graph_input():
            return False
        if v.is_initializer():
            return v.const_value is not None
        producer = v.producer()
        return producer is not None and producer.op_type == "Constant" and \
            producer.domain in ("", "ai.onnx")

    def array(self, v: ir.Value) -> np.ndarray | None:
        """The constant's value (any dtype), or None when ``v`` is not a readable constant."""
        if v not in self._arrays:
            tensor = None
            if self.is_constant(v):
                try:
                    tensor = const_tensor(v)
                except (ValueError, TypeError):  # sparse or malformed Constant
                    tensor = None
            self._arrays[v] = None if tensor is None else np.asarray(tensor.numpy())
        return self._arrays[v]

    def clear(self) -> None:
        """Forget the cached arrays (memory maps of external weights among them)."""
        self._arrays.clear()
        self._leaves.clear()

    def leaves(self, v: ir.Value | None) -> tuple[ir.Value, ...] | None:
        """The float constants ``v`` is made of when it is a constant or a data-movement
        function of constants only (Constant -> Reshape -> Transpose); else None."""
        if v is None:
            return None
        if v in self._leaves:
            return self._leaves[v]
        found: tuple[ir.Value, ...] | None = None
        if self.array(v) is not None:
            found = (v,)
        else:
            producer = v.producer()
            if producer is not None and producer.op_type in MOVE_OPS and \
                    producer.domain in ("", "ai.onnx"):
                parts = [self.leaves(x) for x in producer.inputs if self.is_float(x)]
                if parts and all(p is not None for p in parts):
                    found = tuple(leaf for p in parts for leaf in p)  # type: ignore[union-attr]
        self._leaves[v] = found
        return found


def _overflow(array: np.ndarray, precision: Precision) -> tuple[float, int] | None:
    """(max finite |x|, count above the format max) when some finite value does not fit."""
    if array.dtype.kind != "f" or array.size == 0:
        return None
    a = np.abs(array.astype(np.float64))
    a = a[np.isfinite(a)]
    limit = FORMATS[precision].max
    if a.size == 0 or float(a.max()) <= limit:
        return None
    return float(a.max()), int((a > limit).sum())


def misfit_node(node: ir.Node, value: ir.Value | None, precision: Precision,
                consts: ConstantView) -> KeptNode | None:
    """A ``parameter-out-of-range`` record when a constant behind ``value`` does not fit.

    ``value`` may be an input of ``node`` or, for ``ConstantOfShape``, its output (the fill
    value attribute is checked).
    """
    if value is None:
        return None
    fmt = FORMATS[precision]
    for name, over, size in _checked(node, value, precision, consts):
        if over is None:
            continue
        peak, count = over
        return KeptNode(
            node.name or "", node.op_type, precision.value, "parameter-out-of-range",
            f"parameter '{name}' has |x| up to {peak:.4g} > {fmt.name} max {fmt.max:g} "
            f"({count} of {size} values); in {fmt.name} they would become inf, so "
            f"{node.op_type} '{node.name}' stays FP32", name, peak, fmt.max, count)
    return None


def _checked(node: ir.Node, value: ir.Value, precision: Precision, consts: ConstantView
             ) -> Iterator[tuple[str, tuple[float, int] | None, int]]:
    """(name, ``_overflow`` result, element count) of each constant behind ``value``, lazily
    (the count only where something overflows)."""
    if node.op_type == "ConstantOfShape" and value in node.outputs:
        attr = node.attributes.get("value")
        if attr:
            fill = np.asarray(attr_tensor(attr).numpy())
            yield value.name or "value", _overflow(fill, precision), fill.size
        return
    for leaf in consts.leaves(value) or ():
        over = consts.overflow(leaf, precision)
        array = None if over is None else consts.array(leaf)
        yield leaf.name or "", over, 0 if array is None else array.size


def first_allowing(node: ir.Node, dtype: ir.DataType, start: int, stop: int) -> int | None:
    """The first opset in ``[start, stop]`` where ``node``'s op accepts ``dtype``."""
    if start > stop:
        return None
    return first_opset_allowing(node.op_type, node.domain, dtype, start, stop)


def keep_reason(node: ir.Node, groups: list[TypeGroup], aux: list[TypeGroup], precision: Precision,
                consts: ConstantView, shape_computation: bool, opset: int,
                upgrade_to: int) -> tuple[KeptNode | None, int]:
    """Why ``node`` cannot be written in ``precision``, and the opset it needs if it can.

    Args:
        node: A compute node the plan puts in FP16/BF16.
        groups: Its main type groups (float inputs that flow to its float outputs).
        aux: Other float input groups that will be converted with it (they must fit too).
        precision: ``fp16`` or ``bf16``.
        consts: Constants of the graph.
        shape_computation: The node computes only from tensor shapes.
        opset: The model's default-domain opset.
        upgrade_to: Highest opset the writer may convert to.

    Returns:
        ``(record, needed_opset)``: the record is None when the node can be written in
        ``precision`` (at ``needed_opset``).
    """
    name = node.name or ""
    if shape_computation:
        return KeptNode(name, node.op_type, precision.value, "shape-computation",
                        f"{node.op_type} '{name}' computes on tensor shapes (Shape/Size), not "
                        "data; kept FP32 so integer sizes above 2048 stay exact"), opset
    for group in [*groups, *aux]:
        for i in group.inputs:
            kept = misfit_node(node, node.inputs[i], precision, consts)
            if kept is not None:
                return kept, opset
    dtype = LOW[precision]
    needed = opset
    for group in groups:
        if group.allows(dtype):
            continue
        first = first_allowing(node, dtype, opset + 1, upgrade_to)
        if first is None:
            schema = op_schema(node.op_type, node.domain, opset)
            since = schema.since_version if schema else opset
            later = first_allowing(node, dtype, upgrade_to + 1, MAX_KNOWN_OPSET)
            hint = f"it does from opset {later}" if later else "no opset does"
            return KeptNode(name, node.op_type, precision.value, "type-not-allowed",
                            f"{node.op_type}-{since} input type {group.param} does not accept "
                            f"{precision.value} (writer opset limit {upgrade_to}; {hint})"), opset
        needed = max(needed, first)
    return None, needed
