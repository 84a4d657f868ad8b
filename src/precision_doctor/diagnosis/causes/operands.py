"""Measure the operands of a few nodes: what ``diagnosis.causes.mechanisms`` needs to name a cause.

One run of the FP32 reference and one of the candidate on one sample (the one whose output
error is largest), with the nodes' floating inputs and first outputs marked as graph outputs;
constant inputs (initializers, Constant nodes) are read from the model. The cost is two
inferences of one sample, whatever the number of nodes (at most ``MAX_NODES``).
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from precision_doctor.diagnosis.causes.mechanisms import NodeFacts
from precision_doctor.graph.constants import constant_values
from precision_doctor.graph.load import opset_of
from precision_doctor.graph.outputs import mark_outputs
from precision_doctor.runners.base import Runner
from precision_doctor.runners.sessions import switched

MAX_NODES = 24
RunnerFactory = Callable[[onnx.ModelProto], Runner]


def _axes(node: onnx.NodeProto, consts: Mapping[str, np.ndarray], rank: int,
          opset: int) -> tuple[int, ...] | None:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Softmax":
        axis = int(attrs.get("axis", -1 if opset >= 13 else 1))
        return (axis % rank,) if rank else None
    axes = attrs.get("axes")
    if axes is None and len(node.input) > 1 and node.input[1] in consts:
        axes = consts[node.input[1]].ravel().tolist()
    if not axes:
        return None
    return tuple(int(a) % rank for a in axes) if rank else None


def _reduced(node: onnx.NodeProto, ins: Sequence[np.ndarray | None],
             out: np.ndarray | None) -> int | None:
    """K: terms summed into each output element."""
    a = ins[0] if ins else None
    if a is None:
        return None
    if node.op_type == "MatMul":
        return int(a.shape[-1]) if a.ndim else None
    if node.op_type == "Gemm":
        trans = any(x.name == "transA" and x.i for x in node.attribute)
        return int(a.shape[0 if trans else 1]) if a.ndim == 2 else None
    if node.op_type in ("Conv", "ConvTranspose") and len(ins) > 1 and ins[1] is not None:
        w = ins[1]
        return int(np.prod(w.shape[1:])) if node.op_type == "Conv" else int(w.shape[0])
    if node.op_type.startswith("Reduce") and out is not None and out.size:
        return max(1, a.size // out.size)
    return None


def measure_operands(model: onnx.ModelProto, nodes: Sequence[str],
                     feeds: Mapping[str, np.ndarray], reference: RunnerFactory,
                     candidate: RunnerFactory | None, gains: Mapping[str, float],
                     unit_roundoff: float, tf32: bool = False, fp32_accumulation: bool = True
                     ) -> dict[str, NodeFacts]:
    """``NodeFacts`` of ``nodes`` (at most ``MAX_NODES``, in the given order) on one sample.

    Args:
        model: The FP32 model (nodes named).
        nodes: Node names to measure.
        feeds: One sample's inputs.
        reference / candidate: Model -> runner (ORT CPU FP32; the candidate's factory, or
            None to skip the candidate's operands).
        gains: Node -> local error gain (``layerwise.gain``); missing nodes get 0.
        unit_roundoff: u of the target format.
        tf32: Whether the engine rounds MatMul/Conv multiplicands to TF32.
        fp32_accumulation: Whether the candidate accumulates in FP32 (the emulator does).

    Returns:
        Node name -> facts (float64 arrays). Nodes not in the model are skipped.
    """
    by_name = {n.name: n for n in model.graph.node}
    chosen = [by_name[n] for n in dict.fromkeys(nodes) if n in by_name][:MAX_NODES]
    if not chosen:
        return {}
    consts = constant_values(model)
    tensors = [t for n in chosen for t in (*n.input, *n.output[:1]) if t and t not in consts]
    marked = mark_outputs(model, tensors)
    names = [o.name for o in marked.graph.output]
    inputs = {k: np.asarray(v) for k, v in feeds.items()}  # graph inputs cannot be marked
    ref = {**inputs, **_run(reference(marked), feeds, names)}
    with switched.one_plan():  # one run of one plan: not worth a switched session
        cand = ({**inputs, **_run(candidate(marked), feeds, names)}
                if candidate is not None else {})
    opset = opset_of(model)
    consumers: dict[str, list[str]] = {}
    for n in chosen:
        for t in n.input:
            consumers.setdefault(t, []).append(n.name)
    facts = {}
    for n in chosen:
        def value(t: str, run: Mapping[str, np.ndarray]) -> np.ndarray | None:
            a = consts.get(t) if t in consts else run.get(t)
            return None if a is None or a.dtype.kind != "f" else np.asarray(a, np.float64)

        ref_in = [value(t, ref) if t else None for t in n.input]
        cand_in = [value(t, cand) if t else None for t in n.input]
        out = value(n.output[0], ref) if n.output else None
        rank = ref_in[0].ndim if ref_in and ref_in[0] is not None else 0
        exponent = None
        if n.op_type == "Pow" and len(ref_in) > 1 and ref_in[1] is not None \
                and ref_in[1].size == 1:
            exponent = float(ref_in[1].ravel()[0])
        downstream = max((gains.get(c, 0.0) for c in consumers.get(n.output[0], ())),
                         default=0.0) if n.output else 0.0
        facts[n.name] = NodeFacts(
            n.name, n.op_type, gains.get(n.name, 0.0), ref_in, cand_in, out,
            _axes(n, consts, rank, opset), exponent, _reduced(n, ref_in, out), unit_roundoff,
            tf32, downstream if math.isfinite(downstream) else 0.0, fp32_accumulation)
    return facts


def _run(runner: Runner, feeds: Mapping[str, np.ndarray], names: Sequence[str]
         ) -> dict[str, np.ndarray]:
    with runner:
        result = runner.run(feeds)
    return {n: np.asarray(result[n]) for n in names if n in result}


__all__ = ["MAX_NODES", "measure_operands"]
