"""How much of a quantized model's compute runs in INT8/FP8: the share of the multiply-adds
(MACs) and of the weights of its Conv/ConvTranspose/MatMul/Gemm nodes whose two operands are
both dequantized (each comes from a DequantizeLinear through pass-through ops), against every
such node of the model. The other op types (element-wise, normalizations, pooling) are left
out of both counts: they are a few percent of a CNN's or transformer's MACs.

The MACs of a node come from the FP32 model run on one sample with every weighted node's
operands and output made graph outputs (ONNX Runtime CPU, so dynamic axes take the sample's
sizes): Conv ``prod(output) * prod(weight.shape[1:])``, ConvTranspose ``prod(input) *
prod(weight.shape[1:])``, MatMul ``prod(output) * K`` (K = the last axis of A), Gemm
``prod(output) * K``. The weights of a node: the elements of its second operand when that is an
initializer or a Constant (an attention MatMul of two activations has none). The quantized
models keep the FP32 model's node names (every tool gets the model with its nodes named), so a
written model's nodes are matched to these costs by name.
"""

from __future__ import annotations

import math
from typing import Callable

WEIGHTED = ("Conv", "ConvTranspose", "MatMul", "Gemm")
PASS_THROUGH = ("Cast", "Identity", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze")


def node_costs(fp32_path: str, feeds: dict) -> dict[str, dict[str, int]]:
    """``{node name: {"macs", "params"}}`` of every weighted node of the FP32 model, for the
    sample ``feeds`` (input name -> array)."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    model = onnx.load(fp32_path)
    graph = model.graph
    consts = {i.name: tuple(i.dims) for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].HasField("t"):
            consts[node.output[0]] = tuple(numpy_helper.to_array(node.attribute[0].t).shape)
    weighted = [n for n in graph.node if n.op_type in WEIGHTED]
    known = {o.name for o in graph.output}
    wanted = []
    for n in weighted:
        for name in (n.input[0], n.output[0]):
            if name not in consts and name not in known and name not in wanted:
                wanted.append(name)
    graph.output.extend(onnx.ValueInfoProto(name=name) for name in wanted)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    shapes = {n: tuple(v.shape) for n, v in zip(names, sess.run(names, feeds))}
    shapes.update(consts)
    costs = {}
    for n in weighted:
        a, out = shapes[n.input[0]], shapes[n.output[0]]
        w = shapes.get(n.input[1], ())
        if n.op_type == "Conv":
            macs = math.prod(out) * math.prod(w[1:])
        elif n.op_type == "ConvTranspose":
            macs = math.prod(a) * math.prod(w[1:])
        elif n.op_type == "Gemm":
            trans_a = next((x.i for x in n.attribute if x.name == "transA"), 0)
            macs = math.prod(out) * (a[0] if trans_a else a[-1])
        else:
            macs = math.prod(out) * a[-1]
        costs[n.name] = {"macs": int(macs),
                         "params": int(math.prod(w)) if n.input[1] in consts else 0}
    return costs


def dequantized(graph) -> Callable[[str], bool]:
    """Tensor name -> whether it comes from a DequantizeLinear through ``PASS_THROUGH`` ops."""
    producer = {o: n for n in graph.node for o in n.output}

    def from_dq(tensor: str) -> bool:
        node = producer.get(tensor)
        while node is not None and node.op_type in PASS_THROUGH:
            node = producer.get(node.input[0]) if node.input else None
        return node is not None and node.op_type == "DequantizeLinear"
    return from_dq


def quantized_share(path: str, costs: dict[str, dict[str, int]]) -> dict:
    """The share of MACs and weights of the model at ``path`` whose nodes run both operands
    dequantized: ``{"mac_share", "param_share", "macs", "quantized_macs", "params",
    "quantized_params", "unmatched"}`` (``unmatched``: weighted nodes of ``path`` whose name
    ``costs`` lacks, left out of both counts)."""
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    from_dq = dequantized(graph)
    total = {"macs": 0, "params": 0}
    quantized = {"macs": 0, "params": 0}
    unmatched = []
    for node in graph.node:
        if node.op_type not in WEIGHTED:
            continue
        cost = costs.get(node.name)
        if cost is None:
            unmatched.append(node.name)
            continue
        both = len(node.input) >= 2 and from_dq(node.input[0]) and from_dq(node.input[1])
        for key in total:
            total[key] += cost[key]
            quantized[key] += cost[key] if both else 0
    return {"mac_share": quantized["macs"] / total["macs"] if total["macs"] else 0.0,
            "param_share": quantized["params"] / total["params"] if total["params"] else 0.0,
            "macs": total["macs"], "quantized_macs": quantized["macs"],
            "params": total["params"], "quantized_params": quantized["params"],
            "unmatched": unmatched}
