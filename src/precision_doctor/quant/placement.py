"""Where Q/DQ pairs go: TensorRT's explicit-quantization placement rules.

Sources: TensorRT Developer Guide, "Explicit Quantization", section "Q/DQ Layer-Placement
Recommendations" (TensorRT 10):

* **weighted operations**: quantize every input of Convolution, Deconvolution (ConvTranspose)
  and GEMM/MatMul, the data and the weights. Weights per output channel (symmetric),
  activations per tensor. A MatMul of two activations (attention's QK^T and PV) has both
  inputs quantized per tensor.
* **residual Add**: a Conv whose only consumer is an Add fuses with it (Conv + Add + ReLU);
  quantizing the Add's other (residual) input lets the whole block run in INT8, so the
  residual input belongs to the Conv's layer.
* **pooling**: MaxPool, AveragePool and GlobalAveragePool have quantized kernels: their input
  is quantized per tensor.
* outputs are not quantized (the next layer's input Q/DQ does that); everything between runs in
  the engine's float precision (FP16 here, as ``trtexec --stronglyTyped`` of a model written
  with FP16 tensors does).

A *unit* is one layer the search can leave unquantized: the weighted node or pooling node with
all its Q/DQ sites.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import onnx

from precision_doctor.graph.outputs import consumers
from precision_doctor.graph.shapes import infer_types
from precision_doctor.precision.plan import FLOAT_ELEM_TYPES

WEIGHTED_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
POOL_OPS = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool"})
ACTIVATION, WEIGHT, RESIDUAL = "activation", "weight", "residual"


@dataclass(frozen=True)
class QuantSite:
    """One quantized input of one node.

    Attributes:
        unit: Name of the layer (unit) the site belongs to.
        node: Name of the node whose input is quantized (the unit, or its residual Add).
        input_index: Which input of ``node``.
        tensor: The quantized tensor's name.
        kind: ``activation`` (per tensor), ``weight`` (an initializer, per channel) or
            ``residual`` (the residual input of a Conv's fused Add, per tensor).
        axis: Weights: the output-channel axis of the per-channel scale. Activations: the
            channel axis used to measure the per-channel range spread (1 for NCHW inputs of
            Conv and pooling, the last axis (the GEMM's K) for MatMul/Gemm's A), or None.
    """

    unit: str
    node: str
    input_index: int
    tensor: str
    kind: str
    axis: int | None


@dataclass(frozen=True)
class QuantUnit:
    """One layer the search can leave unquantized.

    Attributes:
        name: The weighted (or pooling) node's name.
        op_type: Its op type.
        sites: Its Q/DQ sites, inputs first, then weights, then the residual input.
        depthwise: A grouped Conv with one input channel per group.
        after: Op type producing its first activation input through data movement
            (``Softmax``, ``Gelu``...), or ``""``.
        index: Position of the node in the graph (topological order).
    """

    name: str
    op_type: str
    sites: tuple[QuantSite, ...]
    depthwise: bool = False
    after: str = ""
    index: int = 0

    @property
    def activation_sites(self) -> tuple[QuantSite, ...]:
        return tuple(s for s in self.sites if s.kind != WEIGHT)

    @property
    def weight_sites(self) -> tuple[QuantSite, ...]:
        return tuple(s for s in self.sites if s.kind == WEIGHT)


def place(model: onnx.ModelProto, pooling: bool = True, residual: bool = True
          ) -> list[QuantUnit]:
    """The quantization units of ``model`` under TensorRT's placement rules (module docstring).

    Args:
        model: The FP32 model (nodes named, ``graph.load.name_nodes``).
        pooling: Quantize pooling inputs.
        residual: Quantize the residual input of a Conv's fused Add.

    Returns:
        Units in graph order. A node whose inputs are not all floating point, or a weight that
        is not an initializer or Constant (then quantized per tensor, as an activation) is
        handled as documented on ``QuantSite``.
    """
    weights = _constant_tensors(model)
    types = infer_types(model)
    elem = {k: t.tensor_type.elem_type for k, t in types.items() if t.HasField("tensor_type")}
    elem.update({i.name: i.data_type for i in model.graph.initializer})
    users = consumers(model)
    producer = {o: n for n in model.graph.node for o in n.output}
    units = []
    for index, node in enumerate(model.graph.node):
        if node.op_type in WEIGHTED_OPS:
            sites = list(_weighted_sites(node, weights, elem))
        elif pooling and node.op_type in POOL_OPS and _is_float(node.input[0], elem):
            sites = [QuantSite(node.name, node.name, 0, node.input[0], ACTIVATION, 1)]
        else:
            continue
        if not sites:
            continue
        if residual and node.op_type == "Conv":
            sites.extend(_residual_site(node, users, weights, elem))
        first = sites[0].tensor
        units.append(QuantUnit(node.name, node.op_type, tuple(sites), _depthwise(node, weights),
                               _origin(first, producer), index))
    return units


def _weighted_sites(node: onnx.NodeProto, weights: dict[str, tuple[int, ...]],
                    elem: dict[str, int]) -> Iterator[QuantSite]:
    op = node.op_type
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    for i in (0, 1):  # X and W of Conv/ConvTranspose, A and B of MatMul/Gemm (bias unquantized)
        if i >= len(node.input) or not node.input[i] or not _is_float(node.input[i], elem):
            continue
        name = node.input[i]
        shape = weights.get(name)
        if i == 1 and shape is not None and len(shape) >= 2:
            yield QuantSite(node.name, node.name, i, name, WEIGHT, _weight_axis(op, shape,
                                                                                attrs))
        else:
            yield QuantSite(node.name, node.name, i, name, ACTIVATION,
                            _activation_axis(op, i, attrs))


def _weight_axis(op: str, shape: tuple[int, ...], attrs: dict) -> int:
    """Output-channel axis of a weight: Conv W[O, I/g, ...] 0; ConvTranspose W[I, O/g, ...] 1;
    Gemm B[K, N] 1, or B[N, K] 0 with transB; MatMul B[..., K, N] the last."""
    if op == "Conv":
        return 0
    if op == "ConvTranspose":
        return 1
    if op == "Gemm":
        return 0 if attrs.get("transB", 0) else 1
    return len(shape) - 1


def _activation_axis(op: str, index: int, attrs: dict) -> int | None:
    """The channel axis of an activation input: NCHW's 1 for convolutions; for a GEMM the
    reduction axis K of A (its last, or 0 with Gemm's transA); B of an activation MatMul has K
    on its second-to-last axis."""
    if op in ("Conv", "ConvTranspose"):
        return 1 if index == 0 else None
    if op == "Gemm":
        return (0 if attrs.get("transA", 0) else -1) if index == 0 else None
    return -1 if index == 0 else -2


def _residual_site(node: onnx.NodeProto, users, weights: dict, elem: dict[str, int]
                   ) -> Iterator[QuantSite]:
    """The residual input of the Add a Conv fuses with (the Conv's only consumer)."""
    out = node.output[0]
    following = users.get(out, [])
    if len(following) != 1 or following[0].op_type != "Add":
        return
    add = following[0]
    others = [(i, t) for i, t in enumerate(add.input) if t != out]
    if len(others) != 1:
        return
    i, tensor = others[0]
    if tensor in weights or not _is_float(tensor, elem):
        return  # a bias Add, not a residual
    yield QuantSite(node.name, add.name, i, tensor, RESIDUAL, 1)


def _origin(tensor: str, producer: dict[str, onnx.NodeProto]) -> str:
    """The op type producing ``tensor``, looking through data movement (Reshape, Transpose...)."""
    from precision_doctor.precision.plan import DATA_MOVEMENT_OPS

    seen = 0
    node = producer.get(tensor)
    while node is not None and node.op_type in DATA_MOVEMENT_OPS and node.input and seen < 8:
        node, seen = producer.get(node.input[0]), seen + 1
    return node.op_type if node is not None else ""


def _depthwise(node: onnx.NodeProto, weights: dict[str, tuple[int, ...]]) -> bool:
    if node.op_type != "Conv":
        return False
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    shape = weights.get(node.input[1]) if len(node.input) > 1 else None
    return group > 1 and shape is not None and len(shape) >= 2 and shape[1] == 1


def _constant_tensors(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every initializer and Constant output (the weights)."""
    out = {t.name: tuple(t.dims) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    out[n.output[0]] = tuple(a.t.dims)
    return out


def _is_float(name: str, elem: dict[str, int]) -> bool:
    return elem.get(name) in FLOAT_ELEM_TYPES
