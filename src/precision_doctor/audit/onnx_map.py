"""Map engine layers back to ONNX nodes with the ONNX model the engine was built from.

A Myelin ``{ForeignNode[first...last]}`` layer names only its two ends. With the model we find
what is inside, two ways:

1. **Graph slice** (preferred): walk the ONNX graph backwards from the region's output tensors
   until reaching its input tensors, graph inputs, initializers, or a node that another engine
   layer already claims (from its ``Metadata``/name). Engine tensor names created by reformats
   ("Reformatted Input Tensor 0 to ...") are traced through the reformat layers first.
2. **Topological range** (fallback, approximate): every node between the first and the last
   endpoint in the model's node order (ONNX requires topological order).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import onnx

from precision_doctor.audit.records import EngineLayer
from precision_doctor.errors import ModelLoadError
from precision_doctor.graph.load import name_nodes


@dataclass(frozen=True)
class OnnxIndex:
    """Read-only lookups over a model's main graph.

    Attributes:
        source: Model path or ``<model>``.
        names: Node names in graph (topological) order.
        op_types: Node name -> op type.
        producer: Tensor name -> index of the node producing it.
        inputs: Node index -> its input tensor names.
        consumers: Tensor name -> indices of the nodes reading it.
        sources: Graph inputs and initializer names.
        positions: Node name -> index.
    """

    source: str
    names: tuple[str, ...]
    op_types: Mapping[str, str]
    producer: Mapping[str, int]
    inputs: tuple[tuple[str, ...], ...]
    consumers: Mapping[str, tuple[int, ...]]
    sources: frozenset[str]
    positions: Mapping[str, int]

    @classmethod
    def build(cls, model: onnx.ModelProto | str | os.PathLike) -> OnnxIndex:
        """Index ``model`` (a proto or a path; external data is not loaded: not needed).

        Raises:
            ModelLoadError: The file is missing or not an ONNX model.
        """
        source = "<model>"
        if not isinstance(model, onnx.ModelProto):
            source = str(model)
            if not Path(source).is_file():
                raise ModelLoadError(f"ONNX model not found: {source}", file=source)
            try:
                model = onnx.load(source, load_external_data=False)
            except Exception as exc:  # onnx raises DecodeError/ValueError variants
                raise ModelLoadError(f"cannot read ONNX model {source}: {exc}",
                                     file=source) from exc
            name_nodes(model)
        graph = model.graph
        names = tuple(n.name for n in graph.node)
        producer: dict[str, int] = {}
        consumers: dict[str, list[int]] = {}
        for i, node in enumerate(graph.node):
            for out in node.output:
                if out:
                    producer[out] = i
            for inp in node.input:
                if inp:
                    consumers.setdefault(inp, []).append(i)
        return cls(source, names, {n.name: n.op_type for n in graph.node}, producer,
                   tuple(tuple(i for i in n.input if i) for n in graph.node),
                   {k: tuple(v) for k, v in consumers.items()},
                   frozenset([i.name for i in graph.input] + [t.name for t in graph.initializer]),
                   {name: i for i, name in reversed(list(enumerate(names)))})

    def index_of(self, name: str) -> int | None:
        """Node index of a node name, or of the first consumer of a tensor/initializer name."""
        if name in self.positions:
            return self.positions[name]
        if name in self.producer:
            return self.producer[name]
        users = self.consumers.get(name)
        return min(users) if users else None


def _trace(name: str, layers: Sequence[EngineLayer], index: OnnxIndex, backward: bool) -> str:
    """Follow reformat/NoOp layers until a tensor name the ONNX graph knows."""
    seen: set[str] = set()
    while name not in index.producer and name not in index.sources and name not in seen:
        seen.add(name)
        nxt = None
        for layer in layers:
            if len(layer.inputs) != 1 or len(layer.outputs) != 1:
                continue
            if backward and layer.outputs[0].name == name:
                nxt = layer.inputs[0].name
            elif not backward and layer.inputs[0].name == name:
                nxt = layer.outputs[0].name
            if nxt:
                break
        if nxt is None:
            break
        name = nxt
    return name


def claimed_nodes(layers: Iterable[EngineLayer], index: OnnxIndex) -> dict[str, str]:
    """ONNX node name -> the first non-fused layer whose Metadata/name lists it."""
    out: dict[str, str] = {}
    for layer in layers:
        if layer.fused or layer.nodes_source not in ("metadata", "layer-name"):
            continue
        for node in layer.onnx_nodes:
            if node in index.op_types:
                out.setdefault(node, layer.name)
    return out


def slice_region(layer: EngineLayer, layers: Sequence[EngineLayer], index: OnnxIndex,
                 claimed: Mapping[str, str]) -> tuple[str, ...]:
    """ONNX nodes computing a fused layer's outputs from its inputs (graph slice).

    Returns:
        Node names in graph order; empty when no output tensor is found in the model.
    """
    stops = {_trace(t.name, layers, index, backward=True) for t in layer.inputs}
    starts = [_trace(t.name, layers, index, backward=False) for t in layer.outputs]
    todo = [index.producer[s] for s in starts if s in index.producer]
    found: set[int] = set()
    while todo:
        i = todo.pop()
        if i in found or index.names[i] in claimed:
            continue
        found.add(i)
        for tensor in index.inputs[i]:
            if tensor in stops or tensor in index.sources or tensor not in index.producer:
                continue
            todo.append(index.producer[tensor])
    return tuple(index.names[i] for i in sorted(found))


def range_region(first: Sequence[str], last: Sequence[str], index: OnnxIndex,
                 claimed: Mapping[str, str]) -> tuple[str, ...]:
    """Unclaimed nodes between the first and last endpoints in topological order (approximate).

    Returns:
        Node names in graph order; empty when no endpoint resolves.
    """
    lo = [i for i in (index.index_of(n) for n in first) if i is not None]
    hi = [i for i in (index.index_of(n) for n in last) if i is not None]
    if not lo or not hi or min(lo) > max(hi):
        return ()
    return tuple(n for n in index.names[min(lo):max(hi) + 1] if n not in claimed)


def resolve_fused(layer: EngineLayer, layers: Sequence[EngineLayer], index: OnnxIndex,
                  claimed: Mapping[str, str], first: Sequence[str], last: Sequence[str],
                  ) -> tuple[tuple[str, ...], str]:
    """ONNX nodes inside one fused layer, and the method used.

    Returns:
        ``(nodes, method)`` with method ``onnx-graph``, ``onnx-topological-range`` or ``none``.
    """
    nodes = slice_region(layer, layers, index, claimed)
    if nodes:
        return nodes, "onnx-graph"
    nodes = range_region(first, last, index, claimed)
    return (nodes, "onnx-topological-range") if nodes else ((), "none")
