"""Constant tensors of a graph: initializers and Constant node outputs, as numpy arrays."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from precision_doctor.graph.external import tensor_array


def constant_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Tensor name -> value of every initializer and Constant node output (``value`` attr)."""
    values = {t.name: tensor_array(t) for t in model.graph.initializer}  # external: memory map
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output:
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
                elif attr.name == "value_float":
                    values[node.output[0]] = np.array(attr.f, np.float32)
                elif attr.name == "value_floats":
                    values[node.output[0]] = np.array(attr.floats, np.float32)
    return values
