"""Models shipped in FP16/BF16: recognize them and build their exact FP32 upcast.

A diagnosis compares a model in reduced precision with its FP32 reference. A model that is
already stored in FP16 or BF16 (weights, graph inputs/outputs, internal ``Cast(to=FLOAT16)``)
run as is would be compared with itself: every error would read 0. Its FP32 reference is its
*upcast*, the same graph computed in FP32:

* every FLOAT16/BFLOAT16 initializer, ``Constant`` value, ``ConstantOfShape`` value and other
  tensor attribute is widened to FLOAT. Exact: FP32 has more exponent and mantissa bits than
  both formats (IEEE-754 binary16: 5/10 bits, bfloat16: 8/7, binary32: 8/23), so every value,
  subnormals, infinities and NaN included, is representable;
* ``Cast(to=FLOAT16|BFLOAT16)`` becomes ``Cast(to=FLOAT)`` (a no-op on a float input; the node
  and its name stay, so plans and reports address the same nodes as in the shipped model);
  ``CastLike`` follows its (now FLOAT) second input by itself;
* a ``dtype``/``output_dtype`` attribute of FLOAT16/BFLOAT16 (``RandomNormal``, ``EyeLike``,
  ``DequantizeLinear`` ...) becomes FLOAT;
* graph inputs, outputs and ``value_info`` of those types (sequences and optionals of them
  too) are retyped FLOAT, in subgraphs (``If``/``Loop``/``Scan`` bodies) and functions as well.

External FP16 weights are widened into the process's ``graph.weight_store`` and referenced
from there, so the upcast stays a small proto (``graph.external``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from precision_doctor.graph.external import is_external, tensor_array
from precision_doctor.graph.weight_store import stored_tensor_proto

FLOAT = onnx.TensorProto.FLOAT
LOW: dict[int, str] = {onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.BFLOAT16: "bf16"}
"""ONNX element type -> the name of the shipped format."""
DTYPE_ATTRIBUTES = ("to", "dtype", "output_dtype")
"""Default-domain INT attributes that name an element type (Cast, RandomNormal, EyeLike,
Bernoulli, DequantizeLinear ...)."""


@dataclass
class _Count:
    formats: set[str] = field(default_factory=set)
    initializers: int = 0
    constants: int = 0
    casts: int = 0
    dtype_attributes: int = 0
    value_types: int = 0
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Upcast:
    """What the FP32 upcast of a model shipped in FP16/BF16 changed.

    Attributes:
        shipped: ``"fp16"`` or ``"bf16"`` (every low-precision part is of that format), or
            ``"mixed"`` (both formats appear).
        initializers: Initializers (sparse ones included) widened to FP32, all graphs.
        constants: Tensor attributes widened (``Constant``, ``ConstantOfShape`` values ...).
        casts: ``Cast`` nodes whose target was FP16/BF16, now FP32.
        dtype_attributes: Other ``dtype``/``output_dtype`` attributes set to FP32.
        value_types: ``value_info`` entries and subgraph inputs/outputs retyped.
        inputs: Main-graph inputs that were FP16/BF16 (feeds are widened to FP32).
        outputs: Main-graph outputs that were FP16/BF16 (the reference's are FP32).
    """

    shipped: str
    initializers: int = 0
    constants: int = 0
    casts: int = 0
    dtype_attributes: int = 0
    value_types: int = 0
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()

    def statement(self) -> str:
        """One sentence for the report's headline: the shipped format and what was widened."""
        fmt = {"fp16": "FP16", "bf16": "BF16"}.get(self.shipped, "FP16/BF16")
        parts = []
        if self.initializers or self.constants:
            parts.append(f"{self.initializers + self.constants} {fmt} weight(s) and constant(s) "
                         "widened exactly")
        if self.casts:
            parts.append(f"{self.casts} Cast(s) to {fmt} now cast to FP32")
        io = [f"input {n}" for n in self.inputs] + [f"output {n}" for n in self.outputs]
        if io:
            shown = ", ".join(io[:4]) + (f" and {len(io) - 4} more" if len(io) > 4 else "")
            parts.append(f"{shown} retyped FP32")
        detail = f" ({'; '.join(parts)})" if parts else ""
        return f"This model is {fmt} as shipped; reference = its FP32 upcast{detail}"

    def model_info(self) -> dict[str, str]:
        """The keys added to the report's ``model`` dict: ``shipped_precision`` and
        ``reference`` (``statement()``)."""
        return {"shipped_precision": self.shipped, "reference": self.statement()}


def shipped_precision(model: onnx.ModelProto) -> Upcast | None:
    """What ``upcast`` would change in ``model``, without changing it (no weight is read).

    Returns:
        The record, or None for a model with no FP16/BF16 tensor, type or Cast.
    """
    count = _Count()
    _Walker(count, apply=False).model(model)
    return _record(count)


def upcast(model: onnx.ModelProto) -> tuple[onnx.ModelProto, Upcast | None]:
    """The exact FP32 upcast of a model stored (partly) in FP16/BF16.

    Args:
        model: Any ONNX model; it is not modified.

    Returns:
        ``(model, None)`` when nothing is FP16/BF16 (the same object); else a copy computed in
        FP32 (see the module docstring) and what was widened.

    Raises:
        BackendError: An external weight cannot be written to the weight store (disk full).
    """
    if shipped_precision(model) is None:
        return model, None
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    count = _Count()
    _Walker(count, apply=True).model(copy)
    return copy, _record(count)


def with_fp32_io(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model as shipped, with FP32 graph inputs and outputs: each FP16/BF16 input is cast to
    its format first (``<input>/to_shipped``, the rounding the shipped model's caller does) and
    each FP16/BF16 output is cast to FP32 last (exact). Everything in between is untouched, so
    an engine given this model computes what the shipped model computes, fed the upcast's
    FP32 samples; tensor names inside the graph are the shipped ones.

    Args:
        model: The shipped model; it is not modified.

    Returns:
        ``model`` itself when no graph input or output is FP16/BF16, else a copy.
    """
    graph = model.graph
    weights = {t.name for t in graph.initializer}
    low_inputs = [vi for vi in graph.input if vi.name not in weights
                  and vi.type.tensor_type.elem_type in LOW]
    low_outputs = [vi for vi in graph.output if vi.type.tensor_type.elem_type in LOW]
    if not low_inputs and not low_outputs:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    first, last = [], []
    for vi in graph.input:
        elem = vi.type.tensor_type.elem_type
        if vi.name in weights or elem not in LOW:
            continue
        inner = f"{vi.name}/shipped"
        _rename(graph, vi.name, inner, outputs=False)
        first.append(helper.make_node("Cast", [vi.name], [inner], name=f"{vi.name}/to_shipped",
                                      to=elem))
        vi.type.tensor_type.elem_type = FLOAT
    for vi in graph.output:
        if vi.type.tensor_type.elem_type not in LOW:
            continue
        inner = f"{vi.name}/shipped"
        _rename(graph, vi.name, inner, outputs=True)
        last.append(helper.make_node("Cast", [inner], [vi.name], name=f"{vi.name}/to_float",
                                     to=FLOAT))
        vi.type.tensor_type.elem_type = FLOAT
    nodes = [*first, *graph.node, *last]
    del graph.node[:]
    graph.node.extend(nodes)
    return copy


def _rename(graph: onnx.GraphProto, old: str, new: str, outputs: bool) -> None:
    """Every read of ``old`` (subgraphs included: they capture outer names) and, with
    ``outputs``, its producer and ``value_info`` entry, now name ``new``."""
    for node in graph.node:
        node.input[:] = [new if name == old else name for name in node.input]
        if outputs:
            node.output[:] = [new if name == old else name for name in node.output]
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else
                        attr.graphs if attr.type == onnx.AttributeProto.GRAPHS else []):
                _rename(sub, old, new, outputs=False)
    if outputs:
        for vi in graph.value_info:
            if vi.name == old:
                vi.name = new


def _record(count: _Count) -> Upcast | None:
    if not count.formats:
        return None
    shipped = next(iter(count.formats)) if len(count.formats) == 1 else "mixed"
    return Upcast(shipped, count.initializers, count.constants, count.casts,
                  count.dtype_attributes, count.value_types, tuple(count.inputs),
                  tuple(count.outputs))


class _Walker:
    """Visits every tensor, type and dtype attribute of a model; widens them when ``apply``."""

    def __init__(self, count: _Count, apply: bool) -> None:
        self.count = count
        self.apply = apply

    def model(self, model: onnx.ModelProto) -> None:
        self.graph(model.graph, main=True)
        for function in model.functions:
            self.nodes(function.node)
            for vi in getattr(function, "value_info", ()):
                self.count.value_types += self.retype(vi.type)

    def graph(self, graph: onnx.GraphProto, main: bool = False) -> None:
        for tensor in graph.initializer:
            self.count.initializers += self.tensor(tensor)
        for sparse in graph.sparse_initializer:
            self.count.initializers += self.tensor(sparse.values)
        weights = {t.name for t in graph.initializer}
        for values, names in ((graph.input, self.count.inputs),
                              (graph.output, self.count.outputs)):
            for vi in values:
                if self.retype(vi.type) and vi.name not in weights:
                    if main:
                        names.append(vi.name)
                    else:
                        self.count.value_types += 1
        for vi in graph.value_info:
            self.count.value_types += self.retype(vi.type)
        self.nodes(graph.node)

    def nodes(self, nodes: Iterable[onnx.NodeProto]) -> None:
        for node in nodes:
            default_domain = node.domain in ("", "ai.onnx")
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.INT and default_domain \
                        and attr.name in DTYPE_ATTRIBUTES and attr.i in LOW:
                    self.count.formats.add(LOW[attr.i])
                    if node.op_type == "Cast":
                        self.count.casts += 1
                    else:
                        self.count.dtype_attributes += 1
                    if self.apply:
                        attr.i = FLOAT
                elif attr.type == onnx.AttributeProto.TENSOR:
                    self.count.constants += self.tensor(attr.t)
                elif attr.type == onnx.AttributeProto.TENSORS:
                    self.count.constants += sum(self.tensor(t) for t in attr.tensors)
                elif attr.type == onnx.AttributeProto.SPARSE_TENSOR:
                    self.count.constants += self.tensor(attr.sparse_tensor.values)
                elif attr.type == onnx.AttributeProto.GRAPH:
                    self.graph(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for g in attr.graphs:
                        self.graph(g)

    def tensor(self, tensor: onnx.TensorProto) -> int:
        """1 when ``tensor`` is FP16/BF16 (widened in place when applying), else 0."""
        if tensor.data_type not in LOW:
            return 0
        self.count.formats.add(LOW[tensor.data_type])
        if self.apply:
            widened = np.asarray(tensor_array(tensor), dtype=np.float32)  # exact
            new = (stored_tensor_proto(widened, tensor.name) if is_external(tensor)
                   else numpy_helper.from_array(widened, tensor.name))
            new.doc_string = tensor.doc_string
            new.metadata_props.extend(tensor.metadata_props)
            tensor.CopyFrom(new)
        return 1

    def retype(self, tp: onnx.TypeProto) -> int:
        """1 when ``tp`` holds an FP16/BF16 element type (set to FLOAT when applying)."""
        kind = tp.WhichOneof("value")
        if kind in ("tensor_type", "sparse_tensor_type"):
            inner = getattr(tp, kind)
            if inner.elem_type not in LOW:
                return 0
            self.count.formats.add(LOW[inner.elem_type])
            if self.apply:
                inner.elem_type = FLOAT
            return 1
        if kind in ("sequence_type", "optional_type"):
            return self.retype(getattr(tp, kind).elem_type)
        if kind == "map_type":
            return self.retype(tp.map_type.value_type)
        return 0


__all__ = ["LOW", "Upcast", "shipped_precision", "upcast", "with_fp32_io"]
