"""The model up to its decisions: the sub-model that computes given tensors (a duration
predictor's float durations) and nothing after them.

A destroyed duration predictor makes the candidate's audio several times longer; the layers
after the decision (a vocoder over 4x the frames) then cost minutes per run and tens of GB (the
int8 Kokoro voice ran out of 19 GB in the layerwise pass). What broke is before the decision,
so that is where the layerwise comparison and the measured cures run: on this sub-model, whose
outputs are the decisions' float inputs, of the same shape in both runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from precision_doctor.diagnosis.lengths.sites import input_cone
from precision_doctor.graph.shapes import infer_types


@dataclass(frozen=True)
class ConeSample:
    """A sample of the sub-model: its name and the feeds the sub-model reads."""

    name: str
    feeds: Mapping[str, np.ndarray]


def cone_model(model: onnx.ModelProto, outputs: Sequence[str]) -> onnx.ModelProto:
    """The sub-model of ``model`` that computes ``outputs`` (module docstring).

    Args:
        model: The model (nodes named; not modified). Nodes keep their names, so a
            ``PrecisionPlan`` of ``model`` applies to the sub-model as it is.
        outputs: Tensor names to compute, each produced by a node of the top-level graph.

    Returns:
        A model with the nodes ``outputs`` depend on (graph order), the graph inputs and
        initializers they read, ``outputs`` as its outputs (types from ONNX shape inference,
        element type float when unknown), and ``model``'s opsets, IR version and metadata.
    """
    keep = set(input_cone(model, list(outputs)))
    nodes = [n for n in model.graph.node if n.name in keep]
    read = {i for n in nodes for i in n.input if i}
    for n in nodes:  # subgraphs may read outer-scope values
        for a in n.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                read |= {i for sub in g.node for i in sub.input if i}
    types = infer_types(model)
    outs = []
    for name in outputs:
        vi = onnx.ValueInfoProto(name=name)
        if name in types:
            vi.type.CopyFrom(types[name])
        else:
            vi.type.CopyFrom(helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, None))
        outs.append(vi)
    graph = helper.make_graph(
        nodes, f"{model.graph.name}-decisions",
        [i for i in model.graph.input if i.name in read], outs,
        [t for t in model.graph.initializer if t.name in read],
        value_info=[v for v in model.graph.value_info if v.name in read])
    sub = helper.make_model(graph, opset_imports=list(model.opset_import),
                            ir_version=model.ir_version, producer_name=model.producer_name,
                            producer_version=model.producer_version)
    sub.metadata_props.extend(model.metadata_props)
    sub.functions.extend(model.functions)
    return sub


def cone_samples(sub: onnx.ModelProto, samples: Sequence) -> list[ConeSample]:
    """``samples`` with only the feeds ``sub`` reads (a sub-model refuses extra inputs)."""
    names = [i.name for i in sub.graph.input]
    return [ConeSample(getattr(s, "name", str(k)), {n: s.feeds[n] for n in names})
            for k, s in enumerate(samples)]


__all__ = ["ConeSample", "cone_model", "cone_samples"]
