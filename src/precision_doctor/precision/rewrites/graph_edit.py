"""Small onnx-ir graph edits shared by the rewrite passes: constants, names, dead constants.

Constants are what ONNX exporters write: initializers (that are not also graph inputs, which a
user could override at run time) and outputs of ``Constant`` nodes (PaddlePaddle's exporter
writes every weight of PP-OCRv4 as a ``Constant`` node).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np
import onnx_ir as ir

from precision_doctor.graph.constants import const_tensor, ir_tensor
from precision_doctor.precision.rewrites.report import RewriteRecord


@dataclasses.dataclass
class RewritePassResult(ir.passes.PassResult):
    """``onnx_ir`` pass result plus the records of what the pass did and did not do.

    Attributes:
        model: The model (the same object: passes work in place on their own copy).
        modified: True when the graph changed.
        records: One record per application and per non-application.
    """

    records: tuple[RewriteRecord, ...] = ()


def constant_array(value: ir.Value | None) -> np.ndarray | None:
    """The value of a constant tensor, or None when ``value`` is not a constant.

    Args:
        value: A graph value (may be None for an omitted optional input).

    Returns:
        The numpy array (any dtype, the tensor's shape), or None for graph inputs and computed
        values.
    """
    if value is None or value.is_graph_input():
        return None
    try:
        tensor = const_tensor(value)
    except ValueError:  # a malformed Constant node: treat as not constant
        return None
    return None if tensor is None else np.asarray(tensor.numpy())


def describe_source(value: ir.Value | None) -> str:
    """Where a non-constant value comes from, for reasons ("a graph input", "Relu 'r1'")."""
    if value is None:
        return "absent"
    if value.is_graph_input():
        return f"graph input '{value.name}'"
    producer = value.producer()
    if producer is None:
        return f"'{value.name}' (no producer)"
    return f"{producer.op_type} '{producer.name}'"


def other_consumers(value: ir.Value, allowed: Iterable[ir.Node]) -> list[str]:
    """Names of the nodes other than ``allowed`` that read ``value`` (plus "graph output")."""
    keep = set(allowed)
    names = sorted({n.name or n.op_type for n in value.consumers() if n not in keep})
    if value.is_graph_output():
        names.append("graph output")
    return names


def taken_names(graph: ir.Graph) -> set[str]:
    """Every node and value name of ``graph`` (inputs, initializers, node outputs)."""
    names: set[str] = {v.name for v in graph.inputs if v.name}
    names.update(graph.initializers.keys())
    for node in graph:
        if node.name:
            names.add(node.name)
        names.update(v.name for v in node.outputs if v.name)
    return names


def unique_name(base: str, taken: set[str]) -> str:
    """``base`` or ``base_1``, ``base_2``... not in ``taken``; the result is added to it."""
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


def add_initializer(graph: ir.Graph, array: np.ndarray, name: str) -> ir.Value:
    """Register ``array`` as a new initializer of ``graph`` named ``name`` (must be free)."""
    tensor = ir_tensor(np.asarray(array, order="C"), name=name)  # 0-d stays 0-d
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype),
                     const_value=tensor)
    graph.register_initializer(value)
    return value


def remove_dead_constants(graph: ir.Graph, values: Sequence[ir.Value | None]) -> list[str]:
    """Remove the ``Constant`` nodes / initializers behind ``values`` that nothing reads now.

    Only the producers of ``values`` are touched, never other dead nodes of the graph.

    Returns:
        Names of the removed ``Constant`` nodes (initializers are not nodes, so not listed).
    """
    removed: list[str] = []
    for value in values:
        if value is None or value.uses() or value.is_graph_output() or value.is_graph_input():
            continue
        producer = value.producer()
        if producer is not None:
            if producer.op_type == "Constant" and producer.domain == "" and producer.graph is graph:
                graph.remove(producer, safe=True)
                removed.append(producer.name or "")
        elif value.name and graph.initializers.get(value.name) is value:
            graph.initializers.pop(value.name)
    return removed


def default_opset(model: ir.Model) -> int:
    """Default-domain (``ai.onnx``) opset version of ``model`` (1 when absent)."""
    return int(model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1)))


def float_dtype(value: ir.Value | None) -> bool:
    """True when ``value`` is a floating-point tensor (FP16/BF16/FP32/FP64)."""
    return value is not None and value.dtype in (
        ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE)
