"""Myelin-fused regions of an engine, what ONNX nodes they hold, and which are sensitive.

TensorRT 8.6 shows a Myelin region as one ``{ForeignNode[first...last]}`` layer; TensorRT 10
shows the kernels of one Myelin graph as ``kgen``/``gemm``/``shape_call`` layers sharing a
``_mylN_`` suffix. Sensitive ops are the ones PyTorch CUDA autocast keeps in FP32 ("ops that
autocast to float32": pow, exp, log, softmax, log_softmax, layer_norm, group_norm, norm, sum,
prod, cumsum, reciprocal, rsqrt), mapped to ONNX op types, plus the ReduceMean/Sqrt of a
decomposed LayerNorm.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Sequence

import onnx

from precision_doctor.audit.names import myelin_graph_id, parse_foreign_node
from precision_doctor.audit.onnx_map import OnnxIndex, claimed_nodes, resolve_fused
from precision_doctor.audit.records import EngineLayer, FusedRegion, SensitiveNode

SENSITIVE_OPS = frozenset({
    "LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
    "RMSNormalization", "GroupNormalization", "InstanceNormalization", "Softmax", "LogSoftmax",
    "ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL2", "ReduceLogSumExp", "ReduceProd",
    "Pow", "Exp", "Log", "Sqrt", "Reciprocal", "CumSum",
})
# Name patterns, most specific first: (label, regex). Used only without an ONNX model.
_NAME_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (label, re.compile(rx, re.IGNORECASE)) for label, rx in (
        ("Softmax", r"softmax"),
        ("LayerNormalization", r"layer_?norm"),
        ("GroupNormalization", r"group_?norm"),
        ("InstanceNormalization", r"instance_?norm"),
        ("LayerNorm (a norm inside a transformer block)",
         r"transformer.*(^|[/._])norm\d*([/._]|$)"),
        ("normalization", r"(^|[/._])(norm\d*|ln_?\d*|ln_f)([/._]|$)"),
        ("ReduceMean", r"reduce_?mean"),
        ("Pow", r"(^|[/._])pow(_\d+)?$"),
        ("Sqrt", r"(^|[/._])sqrt(_\d+)?$"),
        ("Exp", r"(^|[/._])exp(_\d+)?$"),
        ("Reciprocal", r"(^|[/._])reciprocal(_\d+)?$"),
    ))
_TYPE_RULES = (("Softmax", re.compile(r"softmax", re.IGNORECASE)),
               ("normalization", re.compile(r"normali[sz]ation", re.IGNORECASE)))


def op_from_name(name: str) -> str | None:
    """The ONNX op type exporters put at the end of node names, or None.

    PyTorch names nodes ``/scope/sub/OpType`` or ``/scope/OpType_3`` (``OpType_123`` in old
    exporters); the last path component, without a ``_N`` suffix, is an op type when ONNX
    defines an op of that name.
    """
    last = re.sub(r"_\d+$", "", name.rstrip("/").rsplit("/", 1)[-1])
    return last if last and onnx.defs.has(last) else None


def sensitive_by_name(name: str) -> str | None:
    """The sensitive op a node/layer name suggests (e.g. ``Softmax``), or None.

    The op type at the end of an exporter-style name decides when there is one (so
    ``/norm/Mul`` is a Mul, not a normalization); otherwise name patterns do (``norm1.weight``
    inside ``transformer_blocks`` is a LayerNorm's weight).
    """
    op = op_from_name(name)
    if op is not None:
        return op if op in SENSITIVE_OPS else None
    for label, rx in _NAME_RULES:
        if rx.search(name):
            return label
    return None


def find_sensitive(nodes: Sequence[str], index: OnnxIndex | None,
                   layer_type: str = "") -> tuple[SensitiveNode, ...]:
    """Sensitive nodes among ``nodes``.

    Args:
        nodes: ONNX node names (or endpoint names of a region).
        index: The ONNX model index; when given, op types decide; otherwise names do.
        layer_type: Engine layer type, also checked by name (e.g. ``CudaSoftMax``).

    Returns:
        One ``SensitiveNode`` per match, in the order of ``nodes``.
    """
    out: list[SensitiveNode] = []
    for node in nodes:
        if index is not None and node in index.op_types:
            op = index.op_types[node]
            if op in SENSITIVE_OPS:
                out.append(SensitiveNode(node, op, "op type in the ONNX model"))
            continue
        if index is not None and index.index_of(node) is not None:
            continue  # a tensor/initializer of the model: its consumers are listed as nodes
        label = sensitive_by_name(node)
        if label:
            out.append(SensitiveNode(node, label, f"inferred from the name {node!r}"))
    if not out and layer_type:
        for label, rx in _TYPE_RULES:
            if rx.search(layer_type):
                out.append(SensitiveNode(nodes[0] if nodes else layer_type, label,
                                         f"inferred from the layer type {layer_type!r}"))
                break
    return tuple(out)


def _combined(precisions: Sequence[str]) -> str:
    known = sorted({p for p in precisions if p not in ("none", "unknown", "int", "bool")})
    if not known:
        return "unknown"
    return known[0] if len(known) == 1 else "mixed"


def _sum_time(layers: Sequence[EngineLayer]) -> tuple[float | None, float | None]:
    times = [x.time_ms for x in layers if x.time_ms is not None]
    shares = [x.time_share for x in layers if x.time_share is not None]
    return (sum(times) if times else None), (sum(shares) if shares else None)


def build_regions(layers: Sequence[EngineLayer], index: OnnxIndex | None,
                  ) -> tuple[tuple[EngineLayer, ...], tuple[FusedRegion, ...]]:
    """Group fused layers into regions and resolve their ONNX nodes when a model is given.

    Args:
        layers: Parsed (and possibly profiled) layers.
        index: ONNX model index, or None.

    Returns:
        ``(layers, regions)``: layers with the ONNX nodes of ForeignNode layers resolved (when
        ``index`` is given), and the regions in engine order.
    """
    layers = list(layers)
    claimed = claimed_nodes(layers, index) if index is not None else {}
    groups: dict[str, list[int]] = {}
    for i, layer in enumerate(layers):
        if not layer.fused:
            continue
        key = myelin_graph_id(layer.name) if parse_foreign_node(layer.name) is None else None
        groups.setdefault(key or f"#{i}", []).append(i)
    regions: list[FusedRegion] = []
    for key, members in groups.items():
        first: tuple[str, ...] = ()
        last: tuple[str, ...] = ()
        foreign = parse_foreign_node(layers[members[0]].name)
        if foreign is not None:
            first, last = foreign
        if index is not None and foreign is not None and len(members) == 1:
            layer = layers[members[0]]
            nodes, method = resolve_fused(layer, layers, index, claimed, first, last)
            if nodes:
                layers[members[0]] = replace(layer, onnx_nodes=nodes, nodes_source=method)
        member_layers = [layers[i] for i in members]
        nodes = tuple(dict.fromkeys(n for m in member_layers for n in m.onnx_nodes))
        sources = {m.nodes_source for m in member_layers if m.onnx_nodes}
        source = sources.pop() if len(sources) == 1 else ("mixed" if sources else "none")
        resolved = source.startswith("onnx-")
        probe = nodes if resolved else nodes + tuple(n for n in (*first, *last) if n not in nodes)
        sensitive = find_sensitive(probe, index)
        time_ms, share = _sum_time(member_layers)
        name = (layers[members[0]].name if not key.startswith("myl") else
                f"Myelin graph {key} ({len(members)} kernel{'s' if len(members) > 1 else ''})")
        regions.append(FusedRegion(
            name=name, layers=tuple(m.name for m in member_layers),
            precision=_combined([m.precision for m in member_layers]), first=first, last=last,
            onnx_nodes=nodes, nodes_source=source, sensitive=sensitive, time_ms=time_ms,
            time_share=share))
    return tuple(layers), tuple(regions)
