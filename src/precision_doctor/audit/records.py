"""Result records of the engine audit: frozen dataclasses that round-trip through JSON.

``to_dict()`` returns JSON-ready dicts (tuples become lists, stable key order) and
``from_dict()`` is its exact inverse, so a report written on the machine that built the engine
can be re-rendered or compared on another one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

AUDIT_SCHEMA_VERSION = 1

# Precision labels of a layer. Float labels are the ``formats.Precision`` values; the others say
# what is known: "mixed" (inputs and outputs differ: a conversion), "int8" (quantized),
# "int"/"bool" (only shape/index tensors), "none" (no tensors), "unknown" (not reported).
FLOAT_PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8", "fp4", "fp64")
REDUCED_PRECISIONS = ("fp16", "bf16", "fp8", "fp4", "int8", "int4")

# Finding kinds and confidence levels.
KIND_FP32_NOT_HONORED = "fp32-not-honored"
KIND_TF32 = "tf32-tactic"
KIND_REFORMAT = "reformat"
KIND_UNREADABLE = "unreadable"
KIND_SENSITIVE = "sensitive-op"
CONFIRMED, LIKELY, POSSIBLE = "confirmed", "likely", "possible"


def _plain(value: Any) -> Any:
    """Tuples -> lists, recursively; records -> dicts."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def record_dict(obj: Any) -> dict:
    return {f.name: _plain(getattr(obj, f.name)) for f in fields(obj)}


def _strs(values: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in (values or ()))


def opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class TensorInfo:
    """One input or output tensor of an engine layer, as TensorRT describes it.

    Attributes:
        name: Tensor name (an ONNX tensor name, or one TensorRT made up for reformats).
        dtype: Data type parsed from ``format``: ``fp32``, ``fp16``, ``bf16``, ``fp8``, ``int8``,
            ``int32``, ``int64``, ``bool``, ... or ``unknown``.
        format: The raw ``Format/Datatype`` string (e.g. "Channel major FP16 format where
            channel % 8 == 0", or "Half" in TensorRT 10 Myelin kernels).
        shape: ``Dimensions`` (``-1`` for dynamic), or empty when not reported.
    """

    name: str
    dtype: str
    format: str
    shape: tuple[int, ...] = ()

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return record_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> TensorInfo:
        """Inverse of ``to_dict``."""
        return cls(str(data["name"]), str(data["dtype"]), str(data["format"]),
                   tuple(int(d) for d in data.get("shape", ())))


@dataclass(frozen=True)
class EngineLayer:
    """One layer of a built TensorRT engine, with the precision it ran in and why we think so.

    Attributes:
        index: Position in the engine's layer list (execution order).
        name: TensorRT layer name.
        type: ``LayerType`` (e.g. ``CaskConvolution``, ``Myelin``, ``kgen``, ``Reformat``).
        precision: See ``FLOAT_PRECISIONS`` and the labels above; ``tf32`` means FP32 tensors
            computed by a TF32 tensor-core tactic.
        input_precision: Dominant precision of the inputs (None when there are none).
        output_precision: Dominant precision of the outputs (None when there are none).
        evidence: Human-readable facts behind ``precision`` (formats, tactic, weights type).
        inputs: Input tensors.
        outputs: Output tensors.
        onnx_nodes: ONNX node names this layer covers.
        nodes_source: Where ``onnx_nodes`` came from: ``metadata`` (exact, TensorRT >= 8.6),
            ``layer-name`` (split from the layer name), ``foreign-node-endpoints`` (only the
            first/last names of a fused region), ``onnx-graph`` / ``onnx-topological-range``
            (resolved against the ONNX model), or ``none``.
        fused: True for Myelin-fused layers (``{ForeignNode[...]}``, ``__myl_*``/kgen kernels).
        tactic: ``TacticName`` (kernel name), when reported.
        time_ms: Average time per inference in milliseconds (from the profile), or None.
        time_share: Fraction of the total profiled time (0..1), or None.
        unparsed_keys: Keys of the raw layer JSON this tool did not understand.
    """

    index: int
    name: str
    type: str
    precision: str
    input_precision: str | None = None
    output_precision: str | None = None
    evidence: tuple[str, ...] = ()
    inputs: tuple[TensorInfo, ...] = ()
    outputs: tuple[TensorInfo, ...] = ()
    onnx_nodes: tuple[str, ...] = ()
    nodes_source: str = "none"
    fused: bool = False
    tactic: str | None = None
    time_ms: float | None = None
    time_share: float | None = None
    unparsed_keys: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return record_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> EngineLayer:
        """Inverse of ``to_dict``."""
        return cls(
            index=int(data["index"]), name=str(data["name"]), type=str(data["type"]),
            precision=str(data["precision"]),
            input_precision=data.get("input_precision"),
            output_precision=data.get("output_precision"),
            evidence=_strs(data.get("evidence")),
            inputs=tuple(TensorInfo.from_dict(t) for t in data.get("inputs", ())),
            outputs=tuple(TensorInfo.from_dict(t) for t in data.get("outputs", ())),
            onnx_nodes=_strs(data.get("onnx_nodes")),
            nodes_source=str(data.get("nodes_source", "none")),
            fused=bool(data.get("fused", False)), tactic=data.get("tactic"),
            time_ms=opt_float(data.get("time_ms")), time_share=opt_float(data.get("time_share")),
            unparsed_keys=_strs(data.get("unparsed_keys")))


@dataclass(frozen=True)
class SensitiveNode:
    """A numerically sensitive ONNX node (normalization, softmax, pow/exp/log, reductions).

    Attributes:
        node: ONNX node name (or the engine name it was recognised in).
        op: ONNX op type, or the kind recognised from the name (e.g. ``LayerNorm``).
        evidence: ``op_type from the ONNX model`` or ``inferred from the name ...``.
    """

    node: str
    op: str
    evidence: str

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return record_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> SensitiveNode:
        """Inverse of ``to_dict``."""
        return cls(str(data["node"]), str(data["op"]), str(data["evidence"]))


@dataclass(frozen=True)
class FusedRegion:
    """A Myelin-fused region: one ``{ForeignNode[...]}`` layer (TensorRT 8.6) or the kernels of
    one Myelin graph ``__myl_*_mylN_k`` (TensorRT 10).

    Attributes:
        name: The ForeignNode layer name, or ``myelin graph mylN``.
        layers: Names of the engine layers of the region.
        precision: Precision at the region boundary (internal precision is not reported).
        first: Names listed before ``...`` in ``{ForeignNode[first...last]}``.
        last: Names listed after ``...``.
        onnx_nodes: ONNX nodes known or resolved to be inside.
        nodes_source: How ``onnx_nodes`` were found (see ``EngineLayer.nodes_source``).
        sensitive: Sensitive nodes inside the region.
        time_ms: Total average time of the region's layers, or None.
        time_share: Fraction of the total profiled time, or None.
    """

    name: str
    layers: tuple[str, ...]
    precision: str
    first: tuple[str, ...] = ()
    last: tuple[str, ...] = ()
    onnx_nodes: tuple[str, ...] = ()
    nodes_source: str = "none"
    sensitive: tuple[SensitiveNode, ...] = ()
    time_ms: float | None = None
    time_share: float | None = None

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return record_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> FusedRegion:
        """Inverse of ``to_dict``."""
        return cls(
            name=str(data["name"]), layers=_strs(data.get("layers")),
            precision=str(data["precision"]), first=_strs(data.get("first")),
            last=_strs(data.get("last")), onnx_nodes=_strs(data.get("onnx_nodes")),
            nodes_source=str(data.get("nodes_source", "none")),
            sensitive=tuple(SensitiveNode.from_dict(s) for s in data.get("sensitive", ())),
            time_ms=opt_float(data.get("time_ms")), time_share=opt_float(data.get("time_share")))


@dataclass(frozen=True)
class AuditFinding:
    """One thing the user should know about the engine.

    Attributes:
        kind: ``fp32-not-honored``, ``tf32-tactic``, ``reformat``, ``sensitive-op`` or
            ``unreadable``.
        layer: The engine layer (or region) concerned.
        nodes: ONNX nodes concerned.
        evidence: What in the layer information shows it.
        remedy: What to do, concretely (flags, tools).
        confidence: ``confirmed`` (read from tensor formats/tactic), ``likely`` (boundary
            formats of a fused region), ``possible`` (precision not visible).
        time_ms: Time of the layer, when profiled.
        time_share: Share of the total time, when profiled.
    """

    kind: str
    layer: str
    nodes: tuple[str, ...]
    evidence: str
    remedy: str
    confidence: str = CONFIRMED
    time_ms: float | None = None
    time_share: float | None = None

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return record_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> AuditFinding:
        """Inverse of ``to_dict``."""
        return cls(str(data["kind"]), str(data["layer"]), _strs(data.get("nodes")),
                   str(data["evidence"]), str(data["remedy"]),
                   str(data.get("confidence", CONFIRMED)), opt_float(data.get("time_ms")),
                   opt_float(data.get("time_share")))


@dataclass(frozen=True)
class Fp32Check:
    """Where one node that was wanted in FP32 actually ran.

    Attributes:
        node: ONNX node name (an exact match of ``pattern``).
        source: ``plan`` (a PrecisionPlan FP32 override) or ``user`` (``--expect-fp32``).
        pattern: The plan node name or the user's glob pattern.
        layers: Engine layers (or regions) that cover the node.
        ran_in: Precision it ran in, ``unknown``, or ``not-found``.
        status: ``honored``, ``not-honored``, ``unknown`` or ``not-found``.
        confidence: ``confirmed``, ``likely`` or ``possible`` (for ``not-honored``).
    """

    node: str
    source: str
    pattern: str
    layers: tuple[str, ...]
    ran_in: str
    status: str
    confidence: str = CONFIRMED

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return record_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> Fp32Check:
        """Inverse of ``to_dict``."""
        return cls(str(data["node"]), str(data["source"]), str(data["pattern"]),
                   _strs(data.get("layers")), str(data["ran_in"]), str(data["status"]),
                   str(data.get("confidence", CONFIRMED)))


@dataclass(frozen=True)
class AuditReport:
    """The audit of one engine build.

    Attributes:
        source: Layer-information file (or ``<object>``).
        trt_version_guess: ``8.0-8.5``, ``8.6``, ``10.x`` or ``unknown``.
        trt_version_evidence: Why (which fields/layer types were seen).
        detailed: False when the file holds layer names only (no formats, no tactics).
        layers: Every layer, in engine order.
        regions: Myelin-fused regions.
        findings: What to look at, most important kinds first.
        fp32_checks: One entry per node that was wanted in FP32.
        warnings: What could not be read or matched.
        precision_summary: precision -> ``{"layers": n, "time_ms": t, "time_share": s}``
            (time entries None without a profile).
        total_time_ms: Sum of the layers' average times (None without a profile).
        profile_source: Profile file, when given.
        onnx_source: ONNX model, when given.
    """

    source: str
    trt_version_guess: str
    trt_version_evidence: str
    detailed: bool
    layers: tuple[EngineLayer, ...]
    regions: tuple[FusedRegion, ...] = ()
    findings: tuple[AuditFinding, ...] = ()
    fp32_checks: tuple[Fp32Check, ...] = ()
    warnings: tuple[str, ...] = ()
    precision_summary: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    total_time_ms: float | None = None
    profile_source: str | None = None
    onnx_source: str | None = None

    def to_dict(self) -> dict:
        """JSON-ready dict with a ``schema_version``."""
        return {"schema_version": AUDIT_SCHEMA_VERSION, **record_dict(self)}

    @classmethod
    def from_dict(cls, data: Mapping) -> AuditReport:
        """Inverse of ``to_dict``."""
        return cls(
            source=str(data["source"]), trt_version_guess=str(data["trt_version_guess"]),
            trt_version_evidence=str(data.get("trt_version_evidence", "")),
            detailed=bool(data.get("detailed", True)),
            layers=tuple(EngineLayer.from_dict(x) for x in data.get("layers", ())),
            regions=tuple(FusedRegion.from_dict(x) for x in data.get("regions", ())),
            findings=tuple(AuditFinding.from_dict(x) for x in data.get("findings", ())),
            fp32_checks=tuple(Fp32Check.from_dict(x) for x in data.get("fp32_checks", ())),
            warnings=_strs(data.get("warnings")),
            precision_summary={str(k): dict(v) for k, v in
                               dict(data.get("precision_summary", {})).items()},
            total_time_ms=opt_float(data.get("total_time_ms")),
            profile_source=data.get("profile_source"), onnx_source=data.get("onnx_source"))
