"""Constant tensors of a graph: initializers and Constant node outputs, as numpy arrays (from
the proto), and as onnx_ir tensors (from an ``ir.Model``, without onnx_ir's protocol checks)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

from precision_doctor.graph.external import tensor_array


def constant_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Tensor name -> value of every initializer and Constant node output (``value`` attr)."""
    values = {t.name: tensor_array(t) for t in model.graph.initializer}  # external: memory map
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output:
            for attr in node.attribute:
                value = constant_attr_array(attr)
                if value is not None:
                    values[node.output[0]] = value
    return values


def constant_attr_array(attr: onnx.AttributeProto) -> np.ndarray | None:
    """The value of a ``Constant`` node's ``value``, ``value_float`` or ``value_floats``
    attribute, else None."""
    if attr.name == "value":
        return tensor_array(attr.t)
    if attr.name == "value_float":
        return np.array(attr.f, np.float32)
    if attr.name == "value_floats":
        return np.array(attr.floats, np.float32)
    return None


# onnx_ir's ``ir.tensor(array)``, ``Attr.as_tensor()`` and ``ir.convenience.get_const_tensor``
# test their argument against runtime-checkable protocols (``TensorProtocol``,
# ``ArrayCompatible``); on Python 3.11 each such ``isinstance`` walks the protocol's members
# (``typing._get_protocol_attrs``), even for a subclass. The writer and the emulator call them
# once per constant of every model they build: a quarter of ``write_mixed_precision``'s time on
# PP-OCRv4 det. The three functions below return what those return, for the arguments these
# callers pass (a numpy array; a tensor of one of onnx_ir's own classes), with a plain class
# check, and call onnx_ir for anything else.
_IR_TENSORS = (ir.TensorProtoTensor, ir.Tensor, ir.ExternalTensor, ir.StringTensor, ir.LazyTensor,
               ir.PackedTensor)


def ir_tensor(array: np.ndarray, name: str | None = None) -> ir.TensorProtocol:
    """``ir.tensor(array, name=name)``."""
    if type(array) is np.ndarray:
        return ir.Tensor(array, name=name)
    return ir.tensor(array, name=name)


def attr_tensor(attr: ir.Attr) -> ir.TensorProtocol:
    """``attr.as_tensor()``."""
    if attr.type == ir.AttributeType.TENSOR and isinstance(attr.value, _IR_TENSORS):
        return attr.value
    return attr.as_tensor()


def const_tensor(value: ir.Value) -> ir.TensorProtocol | None:
    """``ir.convenience.get_const_tensor(value)``: an initializer's tensor, or a ``Constant``
    node's ``value`` tensor (named after ``value``, as onnx_ir names it)."""
    if value.const_value is not None:
        return value.const_value
    node = value.producer()
    if node is not None and node.op_type == "Constant" and node.domain == "" \
            and len(node.outputs) == 1 and len(node.attributes) == 1:
        attr = node.attributes.get("value")
        if attr is not None and not attr.is_ref() and attr.type == ir.AttributeType.TENSOR \
                and isinstance(attr.value, _IR_TENSORS):
            tensor = attr.value
            tensor.name = value.name
            return tensor
    return ir.convenience.get_const_tensor(value)
