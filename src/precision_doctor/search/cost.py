"""Compute cost per node: FLOPs (multiply-add = 2 FLOPs) and parameter counts.

Used to report the share of compute left in FP32. Estimates for the concrete input shapes:

* Conv / ConvTranspose: 2 * numel(output) * (C_in / group) * prod(kernel) for Conv, and
  2 * numel(input) * (C_out / group) * prod(kernel) for ConvTranspose;
* MatMul / Gemm: 2 * numel(output) * K (K = reduced dimension);
* every other floating op: numel(output) (one op per element);
* parameters: elements of the node's constant float inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.graph.constants import constant_values
from precision_doctor.graph.outputs import float_activations
from precision_doctor.precision.plan import DATA_MOVEMENT_OPS


@dataclass(frozen=True)
class NodeCost:
    """Cost of one node: ``flops`` (float operations) and ``params`` (constant elements)."""

    flops: float
    params: int


def compute_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Nodes doing floating arithmetic: not Constant and not pure data movement."""
    return [n for n in model.graph.node
            if n.op_type not in DATA_MOVEMENT_OPS and n.domain in ("", "ai.onnx")]


def node_costs(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]]
               ) -> dict[str, NodeCost]:
    """FLOPs and parameters of every compute node for ``input_shapes``.

    Args:
        model: The model.
        input_shapes: Concrete shape of every graph input.

    Returns:
        Node name -> ``NodeCost`` (FLOPs 0 where the output size is unknown).
    """
    sizes = {s.name: s.numel for s in float_activations(model, input_shapes)}
    sizes.update({k: int(np.prod(v)) for k, v in input_shapes.items()})
    consts = constant_values(model)
    costs = {}
    for node in compute_nodes(model):
        out = sizes.get(node.output[0]) if node.output else None
        params = sum(int(consts[i].size) for i in node.input
                     if i in consts and consts[i].dtype.kind == "f")
        flops = float(out or 0)
        w = consts.get(node.input[1]) if len(node.input) > 1 else None
        if node.op_type == "Conv" and w is not None and out:
            flops = 2.0 * out * (w.shape[1] * int(np.prod(w.shape[2:])))
        elif node.op_type == "ConvTranspose" and w is not None:
            n_in = sizes.get(node.input[0]) or 0
            flops = 2.0 * n_in * (w.shape[1] * int(np.prod(w.shape[2:])))
        elif node.op_type in ("MatMul", "Gemm") and out:
            k = _reduced_dim(node, consts, sizes)
            flops = 2.0 * out * k if k else float(out)
        costs[node.name] = NodeCost(flops, params)
    return costs


def _reduced_dim(node: onnx.NodeProto, consts, sizes) -> int | None:
    b = consts.get(node.input[1])
    if b is not None and b.ndim >= 2:
        trans_b = any(a.name == "transB" and a.i for a in node.attribute)
        return int(b.shape[-1] if trans_b else b.shape[-2])
    a = consts.get(node.input[0])
    if a is not None and a.ndim >= 2:
        return int(a.shape[-1])
    return None


def fp32_share(model: onnx.ModelProto, fp32_nodes: Sequence[str],
               costs: Mapping[str, NodeCost]) -> dict[str, float]:
    """Share of compute nodes, FLOPs and parameters that stay in FP32.

    Returns:
        ``{"nodes": .., "flops": .., "params": .., "fp32_nodes": n, "compute_nodes": N}``.
    """
    names = [n.name for n in compute_nodes(model)]
    keep = set(fp32_nodes) & set(names)
    total_flops = sum(c.flops for c in costs.values()) or 1.0
    total_params = sum(c.params for c in costs.values()) or 1
    return {
        "nodes": len(keep) / max(len(names), 1),
        "flops": sum(costs[n].flops for n in keep if n in costs) / total_flops,
        "params": sum(costs[n].params for n in keep if n in costs) / total_params,
        "fp32_nodes": len(keep), "compute_nodes": len(names),
    }
