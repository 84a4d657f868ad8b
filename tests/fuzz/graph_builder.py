"""The graph builder of the fuzzer's strategies (``graphs``): unique names, initializers, the
model at opset 17 / IR version 8 with one float32 input ``x`` of shape ``SHAPE``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

S, H = 4, 8
SHAPE = [1, S, H]
OPSET = 17
IR_VERSION = 8
FLT_MAX = float(np.finfo(np.float32).max)
MS_DOMAIN = "com.microsoft"
F = TensorProto.FLOAT
# Weight scales: FP16 underflow (< 6e-8 after the product), ordinary, FP16 overflow (> 65504).
SCALES = (1e-9, 1e-4, 1.0, 30.0, 3e3, 1e5)


@dataclass
class Sample:
    """A sample (duck-types ``precision_doctor.inputs.Sample``)."""

    name: str
    feeds: dict


class Graph:
    """Nodes and initializers of one graph being built, with unique names."""

    def __init__(self, rng: np.random.Generator, avoid: frozenset[str] = frozenset()) -> None:
        self.rng = rng
        self.avoid = avoid
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0
        self.pieces: list[str] = []
        self.domains: set[str] = set()
        self.extra: dict[str, list] = {}  # more outputs of their own shapes (data-dependent)

    def variant(self, draw, piece: str, names: list[str]) -> str:
        """One of ``names``, leaving out the ``piece:name`` variants listed in ``avoid``."""
        return draw(st.sampled_from([n for n in names if f"{piece}:{n}" not in self.avoid]))

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def const(self, array, prefix: str = "w", dtype=np.float32) -> str:
        name = self.fresh(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(array, dtype), name))
        return name

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, domain: str = "",
           **attrs) -> list[str]:
        name = self.fresh(op_type.lower())
        outs = [f"{name}/out{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, domain=domain,
                                           **attrs))
        return outs

    def op1(self, op_type: str, inputs: list[str], **attrs) -> str:
        return self.op(op_type, inputs, 1, **attrs)[0]

    def weight(self, shape, scale: float) -> str:
        fan_in = shape[-2] if len(shape) >= 2 else 1
        return self.const(self.rng.normal(0, scale / np.sqrt(fan_in), shape), "w")

    def model(self, outputs: list[str]) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, "fuzz", [helper.make_tensor_value_info("x", F, SHAPE)],
            [helper.make_tensor_value_info(o, F, SHAPE) for o in outputs]
            + [helper.make_tensor_value_info(o, F, s) for o, s in self.extra.items()],
            self.inits)
        opsets = [helper.make_opsetid("", OPSET)] + [helper.make_opsetid(d, 1)
                                                      for d in sorted(self.domains)]
        model = helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION,
                                  producer_name="tests.fuzz")
        model.doc_string = " -> ".join(self.pieces)
        onnx.checker.check_model(model)
        return model


Piece = Callable[[st.DrawFn, Graph, str], str]


def scale_of(draw: st.DrawFn) -> float:
    """One of ``SCALES``."""
    return draw(st.sampled_from(SCALES))
