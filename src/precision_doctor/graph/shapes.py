"""Shape and type inference on a weight-free skeleton of a model.

``onnx.shape_inference.infer_shapes`` serializes the whole model: it copies every weight and
fails above the 2 GB protobuf limit. The skeleton keeps the nodes, the graph I/O and the small
initializers (shape constants such as Reshape targets, which data propagation needs) and
replaces every large initializer by a typed graph input of the same shape, so inference sees
the same types and shapes without the weight bytes.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import onnx
from onnx import helper

# Initializers up to this many elements keep their values (shape constants, scalars); larger
# ones are weights, whose values inference never needs.
SMALL_INITIALIZER = 4096


def skeleton(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None = None
             ) -> onnx.ModelProto:
    """A copy of ``model`` without the values of its large initializers.

    Args:
        model: The model (external-data initializers are fine: only their dims are read).
        input_shapes: Concrete shapes for graph inputs (replace symbolic dims); stale
            ``value_info`` is dropped when given.

    Returns:
        A new ``ModelProto`` whose large initializers are typed graph inputs.
    """
    src = model.graph
    g = onnx.GraphProto(name=src.name)
    g.node.extend(src.node)
    g.output.extend(src.output)
    if not input_shapes:
        g.value_info.extend(src.value_info)
    initialized = {t.name for t in src.initializer}
    for vi in src.input:
        if vi.name in initialized:
            continue
        new = g.input.add()
        new.CopyFrom(vi)
        if input_shapes and vi.name in input_shapes:
            dims = new.type.tensor_type.shape.dim
            for d, size in zip(dims, input_shapes[vi.name]):
                d.ClearField("dim_param")
                d.dim_value = int(size)
    for t in src.initializer:
        numel = 1
        for d in t.dims:
            numel *= d
        if numel <= SMALL_INITIALIZER and t.data_location != onnx.TensorProto.EXTERNAL:
            g.initializer.append(t)
        else:
            g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    g.sparse_initializer.extend(src.sparse_initializer)
    out = onnx.ModelProto(ir_version=max(model.ir_version, 4), graph=g)
    out.opset_import.extend(model.opset_import)
    out.functions.extend(model.functions)
    return out


def infer_types(model: onnx.ModelProto,
                input_shapes: Mapping[str, Sequence[int]] | None = None,
                data_prop: bool = False) -> dict[str, onnx.TypeProto]:
    """Tensor name -> inferred type (with shape) of every value inference could determine.

    Args:
        model: The model.
        input_shapes: Concrete input shapes (default: the model's own, possibly symbolic).
        data_prop: Propagate shape values through shape subgraphs (ONNX ``data_prop``).

    Returns:
        Types of graph inputs, initializers, intermediate values and outputs. Empty entries
        are missing: inference failures (custom ops) leave the declared types only.
    """
    skel = skeleton(model, input_shapes)
    try:
        skel = onnx.shape_inference.infer_shapes(skel, strict_mode=False, data_prop=data_prop)
    except Exception:  # noqa: BLE001 - inference is best effort; declared types remain
        pass
    types: dict[str, onnx.TypeProto] = {}
    for vi in list(skel.graph.input) + list(skel.graph.value_info) + list(skel.graph.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type
    for t in skel.graph.initializer:
        types[t.name] = helper.make_tensor_type_proto(t.data_type, list(t.dims))
    return types
