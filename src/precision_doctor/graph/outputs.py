"""Find every intermediate floating tensor, estimate its size, and mark tensors as outputs.

Layerwise comparison sizes its segments (``graph.segments``) with these estimates; where no
segment cut is possible it marks intermediate tensors as graph outputs in chunks whose
estimated size fits a memory budget, so even large models never hold all activations at once.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import onnx
import onnx_ir as ir

from precision_doctor.graph.shapes import infer_types

_FLOAT_ELEM = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
               onnx.TensorProto.BFLOAT16}


@dataclass(frozen=True)
class TensorSite:
    """A floating tensor produced by a node.

    Attributes:
        name: Tensor name.
        node: Name of the producing node.
        op_type: Producer op type.
        index: Topological position of the producer (0-based, node order of the graph).
        numel: Estimated elements for the concrete input shapes (None if unknown).
        itemsize: Bytes per element.
    """

    name: str
    node: str
    op_type: str
    index: int
    numel: int | None
    itemsize: int = 4


def float_activations(model: onnx.ModelProto,
                      input_shapes: Mapping[str, Sequence[int]] | None = None
                      ) -> list[TensorSite]:
    """Floating node outputs in topological order (Constant outputs excluded: parameters).

    Args:
        model: The model (assumed topologically sorted, as ONNX requires).
        input_shapes: Concrete input shapes used to estimate tensor sizes.

    Returns:
        One ``TensorSite`` per floating intermediate or output tensor.
    """
    types = infer_types(model, input_shapes or {}, data_prop=True)
    sites = []
    for index, node in enumerate(model.graph.node):
        if node.op_type == "Constant":
            continue
        for out in node.output:
            t = types.get(out)
            if not out or t is None or not t.HasField("tensor_type"):
                continue
            tt = t.tensor_type
            if tt.elem_type not in _FLOAT_ELEM:
                continue
            numel: int | None = 1
            if not tt.HasField("shape"):
                numel = None
            else:
                for d in tt.shape.dim:
                    if d.HasField("dim_value") and d.dim_value > 0:
                        numel *= d.dim_value
                    else:
                        numel = None
                        break
            itemsize = 8 if tt.elem_type == onnx.TensorProto.DOUBLE else (
                2 if tt.elem_type in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16) else 4)
            sites.append(TensorSite(out, node.name, node.op_type, index, numel, itemsize))
    return sites


def chunk_sites(sites: Sequence[TensorSite], budget_bytes: int) -> list[list[TensorSite]]:
    """Split ``sites`` (in order) into chunks whose estimated bytes fit ``budget_bytes``.

    Tensors of unknown size count as the largest known size. A single tensor larger than the
    budget gets a chunk of its own.
    """
    known = [s.numel * s.itemsize for s in sites if s.numel is not None]
    fallback = max(known) if known else 4 << 20
    chunks: list[list[TensorSite]] = []
    current: list[TensorSite] = []
    used = 0
    for s in sites:
        size = s.numel * s.itemsize if s.numel is not None else fallback
        if current and used + size > budget_bytes:
            chunks.append(current)
            current, used = [], 0
        current.append(s)
        used += size
    if current:
        chunks.append(current)
    return chunks


def mark_outputs(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph outputs also include ``names`` (via onnx-ir).

    Names that are already outputs, graph inputs, or not produced by a node are skipped.
    """
    ir_model = ir.serde.deserialize_model(model)
    graph = ir_model.graph
    produced = {v.name: v for node in graph for v in node.outputs if v.name}
    existing = {v.name for v in graph.outputs}
    for name in names:
        value = produced.get(name)
        if value is not None and name not in existing:
            graph.outputs.append(value)
            existing.add(name)
    return ir.serde.serialize_model(ir_model)


def producer_inputs(model: onnx.ModelProto) -> dict[str, list[str]]:
    """Tensor name -> names of the inputs of the node producing it."""
    return {out: list(node.input) for node in model.graph.node for out in node.output if out}


def consumers(model: onnx.ModelProto) -> defaultdict[str, list[onnx.NodeProto]]:
    """Tensor name -> the nodes reading it, in graph order (an empty list for any other name)."""
    out: defaultdict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in model.graph.node:
        for name in node.input:
            if name:
                out[name].append(node)
    return out
