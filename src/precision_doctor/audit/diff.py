"""Compare two builds of the same model (e.g. an FP32 and an FP16 engine): precision counts and
times, and which layers and fused regions changed precision.

Layers are paired in three passes, each only over what is still unpaired: identical layer
names; identical ONNX node sets (from ``Metadata``/names); then, in engine order, layers of the
same kind (convolution, gemm, Myelin, pointwise, ...) with the same output shapes
(``difflib.SequenceMatcher`` alignment: approximate, and said so). The third pass pairs builds
exported with different node names, such as the two ControlNet builds in the shared data.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from precision_doctor.audit.findings import CONVERSION, NON_COMPUTE
from precision_doctor.audit.records import AuditReport, EngineLayer, opt_float, record_dict

MATCH_NAME, MATCH_NODES, MATCH_SHAPE = "name", "onnx-nodes", "type+shape"


@dataclass(frozen=True)
class LayerChange:
    """One layer (or fused region) of build A paired with one of build B.

    Attributes:
        a_layer: Layer name in A (None when only in B).
        b_layer: Layer name in B (None when only in A).
        a_precision: Its precision in A.
        b_precision: Its precision in B.
        a_time_ms: Its time in A (ms per inference), or None.
        b_time_ms: Its time in B, or None.
        match: ``name``, ``onnx-nodes``, ``type+shape`` (approximate) or ``unmatched``.
        fused: True for Myelin-fused layers.
    """

    a_layer: str | None
    b_layer: str | None
    a_precision: str | None
    b_precision: str | None
    a_time_ms: float | None = None
    b_time_ms: float | None = None
    match: str = "unmatched"
    fused: bool = False

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return record_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> LayerChange:
        """Inverse of ``to_dict``."""
        return cls(data.get("a_layer"), data.get("b_layer"), data.get("a_precision"),
                   data.get("b_precision"), opt_float(data.get("a_time_ms")),
                   opt_float(data.get("b_time_ms")), str(data.get("match", "unmatched")),
                   bool(data.get("fused", False)))


@dataclass(frozen=True)
class BuildDiff:
    """Differences between build A and build B.

    Attributes:
        a_source: Layer information of A.
        b_source: Layer information of B.
        a_summary: A's ``precision_summary``.
        b_summary: B's ``precision_summary``.
        a_total_ms: A's summed layer time (None without a profile).
        b_total_ms: B's summed layer time.
        matched: Pairing method -> number of compute layers paired that way.
        precision_changes: Paired layers whose precision differs, in A's order.
        regions: Every fused region of A and B with its partner (changed or not).
        only_in_a: Compute layers of A with no partner in B.
        only_in_b: Compute layers of B with no partner in A.
        reformat: ``{"a": {"layers": n, "time_ms": t}, "b": {...}}`` for precision conversions.
        notes: How to read the pairing.
    """

    a_source: str
    b_source: str
    a_summary: Mapping[str, Mapping[str, Any]]
    b_summary: Mapping[str, Mapping[str, Any]]
    a_total_ms: float | None
    b_total_ms: float | None
    matched: Mapping[str, int] = field(default_factory=dict)
    precision_changes: tuple[LayerChange, ...] = ()
    regions: tuple[LayerChange, ...] = ()
    only_in_a: tuple[str, ...] = ()
    only_in_b: tuple[str, ...] = ()
    reformat: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return record_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> BuildDiff:
        """Inverse of ``to_dict``."""
        nested = lambda d: {str(k): dict(v) for k, v in dict(d or {}).items()}  # noqa: E731
        return cls(
            str(data["a_source"]), str(data["b_source"]), nested(data.get("a_summary")),
            nested(data.get("b_summary")), opt_float(data.get("a_total_ms")),
            opt_float(data.get("b_total_ms")),
            {str(k): int(v) for k, v in dict(data.get("matched", {})).items()},
            tuple(LayerChange.from_dict(x) for x in data.get("precision_changes", ())),
            tuple(LayerChange.from_dict(x) for x in data.get("regions", ())),
            tuple(str(x) for x in data.get("only_in_a", ())),
            tuple(str(x) for x in data.get("only_in_b", ())), nested(data.get("reformat")),
            tuple(str(x) for x in data.get("notes", ())))


def layer_family(layer_type: str) -> str:
    """Coarse kind of a layer type, so that e.g. CaskConvolution and CaskGemmConvolution pair."""
    t = layer_type.lower()
    for family, keys in (("conv", ("conv",)), ("gemm", ("gemm", "matrixmultiply", "matmul")),
                         ("myelin", ("myelin", "kgen")), ("pool", ("pool",)),
                         ("pointwise", ("pointwise", "elementwise", "scale", "activation")),
                         ("norm", ("plugin", "normalization"))):
        if any(k in t for k in keys):
            return family
    return t


def _compute(layers: Sequence[EngineLayer]) -> list[EngineLayer]:
    return [x for x in layers if x.type not in CONVERSION and x.precision not in NON_COMPUTE]


def _signature(layer: EngineLayer) -> tuple:
    return layer_family(layer.type), tuple(t.shape for t in layer.outputs)


def pair_layers(a: Sequence[EngineLayer], b: Sequence[EngineLayer]) -> list[tuple[int, int, str]]:
    """Pairs ``(index in a, index in b, method)`` of compute layers (see module docstring)."""
    pairs: list[tuple[int, int, str]] = []
    free_a, free_b = set(range(len(a))), set(range(len(b)))
    b_names: dict[str, list[int]] = {}
    for j, layer in enumerate(b):
        b_names.setdefault(layer.name, []).append(j)
    for i, layer in enumerate(a):
        cands = [j for j in b_names.get(layer.name, []) if j in free_b]
        if cands:
            pairs.append((i, cands[0], MATCH_NAME))
            free_a.discard(i)
            free_b.discard(cands[0])
    b_nodes: dict[frozenset[str], list[int]] = {}
    for j in sorted(free_b):
        if b[j].onnx_nodes:
            b_nodes.setdefault(frozenset(b[j].onnx_nodes), []).append(j)
    for i in sorted(free_a):
        cands = [j for j in b_nodes.get(frozenset(a[i].onnx_nodes), []) if j in free_b]
        if a[i].onnx_nodes and cands:
            pairs.append((i, cands[0], MATCH_NODES))
            free_a.discard(i)
            free_b.discard(cands[0])
    rest_a, rest_b = sorted(free_a), sorted(free_b)
    matcher = difflib.SequenceMatcher(None, [_signature(a[i]) for i in rest_a],
                                      [_signature(b[j]) for j in rest_b], autojunk=False)
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            pairs.append((rest_a[block.a + k], rest_b[block.b + k], MATCH_SHAPE))
    return sorted(pairs)


def _reformat(report: AuditReport) -> dict[str, Any]:
    conv = [x for x in report.layers if x.precision == "mixed" and x.type in CONVERSION]
    times = [x.time_ms for x in conv if x.time_ms is not None]
    return {"layers": len(conv), "time_ms": sum(times) if times else None}


def _change(x: EngineLayer | None, y: EngineLayer | None, how: str) -> LayerChange:
    return LayerChange(x.name if x else None, y.name if y else None,
                       x.precision if x else None, y.precision if y else None,
                       x.time_ms if x else None, y.time_ms if y else None, how,
                       bool((x and x.fused) or (y and y.fused)))


def compare_builds(a: AuditReport, b: AuditReport) -> BuildDiff:
    """Compare two audits of builds of the same model.

    Args:
        a: Audit of the first build (e.g. FP32).
        b: Audit of the second build (e.g. FP16).

    Returns:
        ``BuildDiff`` with both precision summaries, totals, paired layers whose precision
        changed, all fused regions with their partners, unpaired layers and conversion costs.
    """
    ca, cb = _compute(a.layers), _compute(b.layers)
    pairs = pair_layers(ca, cb)
    matched: dict[str, int] = {}
    for _, _, how in pairs:
        matched[how] = matched.get(how, 0) + 1
    changes = tuple(_change(ca[i], cb[j], how) for i, j, how in pairs
                    if ca[i].precision != cb[j].precision)
    partner_a = {i: (j, how) for i, j, how in pairs}
    partner_b = {j: i for i, j, _ in pairs}
    regions = [(_change(ca[i], cb[partner_a[i][0]], partner_a[i][1]) if i in partner_a
                else _change(ca[i], None, "unmatched")) for i, x in enumerate(ca) if x.fused]
    regions += [_change(None, y, "unmatched") for j, y in enumerate(cb)
                if y.fused and j not in partner_b]
    notes = [f"{n} compute layers paired by {how}" for how, n in sorted(matched.items())]
    if matched.get(MATCH_SHAPE):
        notes.append("'type+shape' pairs follow engine order and output shapes only: "
                     "approximate (the builds name their layers differently)")
    if not a.detailed or not b.detailed:
        notes.append("one build lists layer names only: precisions are unknown there")
    return BuildDiff(
        a_source=a.source, b_source=b.source, a_summary=a.precision_summary,
        b_summary=b.precision_summary, a_total_ms=a.total_time_ms, b_total_ms=b.total_time_ms,
        matched=matched, precision_changes=changes, regions=tuple(regions),
        only_in_a=tuple(ca[i].name for i in range(len(ca)) if i not in partner_a),
        only_in_b=tuple(cb[j].name for j in range(len(cb)) if j not in partner_b),
        reformat={"a": _reformat(a), "b": _reformat(b)}, notes=tuple(notes))
