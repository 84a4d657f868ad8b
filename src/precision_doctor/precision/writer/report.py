"""``WriterReport``: what ``write_mixed_precision`` did to a model, frozen and JSON-ready."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from precision_doctor.formats import Precision
from precision_doctor.precision.plan import NodeDecision, PrecisionPlan

WRITER_REPORT_SCHEMA_VERSION = 1

# Reasons a node the plan puts in FP16/BF16 is written in FP32.
KEEP_REASONS = {
    "parameter-out-of-range": "a float parameter does not fit the format (|x| > its max)",
    "type-not-allowed": "the ONNX op does not accept the format at this opset",
    "shape-computation": "float arithmetic on tensor shapes (Shape/Size), kept exact",
    "subgraph": "If/Loop/Scan bodies are not converted",
    "unsupported-op": "no ONNX schema (custom domain): its types cannot be checked",
}


@dataclass(frozen=True)
class KeptNode:
    """A node the plan asked for in FP16/BF16 that the writer kept in FP32, and why.

    Attributes:
        node: Node name.
        op_type: Its op type.
        requested: The precision the plan asked for (``fp16`` or ``bf16``).
        reason: A key of ``KEEP_REASONS``.
        detail: One sentence with the numbers.
        tensor: The parameter that does not fit (``parameter-out-of-range``), else empty.
        max_abs: Largest finite |x| of that parameter.
        limit: The format's largest finite value (65504 for FP16).
        count_over: How many of its values exceed ``limit``.
    """

    node: str
    op_type: str
    requested: str
    reason: str
    detail: str
    tensor: str = ""
    max_abs: float | None = None
    limit: float | None = None
    count_over: int = 0

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> KeptNode:
        """Inverse of ``to_dict``."""
        return cls(**dict(data))


@dataclass(frozen=True)
class WriterReport:
    """What the strongly typed writer did.

    Attributes:
        opset_before: Default-domain opset of the input model.
        opset_after: Opset of the written model (raised for BF16 Casts/ops, see ``writer``).
        ir_version_before: IR version of the input model.
        ir_version_after: IR version of the written model.
        keep_io_types: Whether float graph inputs/outputs were kept FP32.
        casts_inserted: Cast nodes added (each one a precision boundary of one tensor).
        casts_at_inputs: Of those, casts reading a graph input.
        casts_at_outputs: Of those, casts producing a graph output (``keep_io_types``).
        cast_nodes_retargeted: Original ``Cast(to=FLOAT)`` nodes now casting to FP16/BF16.
        initializers_converted: Float initializers converted in place (one precision used them).
        initializers_duplicated: Low-precision copies added for initializers that FP32 (or both
            FP16 and BF16) consumers also read.
        constants_converted: ``Constant``/``ConstantOfShape`` nodes whose value was converted.
        constants_duplicated: ``Constant`` nodes copied for consumers of another precision.
        nodes_per_precision: ``fp32``/``fp16``/``bf16`` -> number of nodes handling float data
            in that storage format (Constant nodes and nodes without float values excluded).
        node_precisions: Node name -> storage precision written (same nodes, named ones).
        tf32_nodes: Nodes the plan runs in TF32: FP32 in the model, TF32 is an engine setting.
        fp32_pinned: Data-movement nodes the plan names FP32, written in FP32: the emulator
            keeps the constants they read in FP32 only where the plan names them (a Where of
            an FP16 tensor and a constant of 1.3e5 is inf in FP16, found by tests/fuzz).
        kept_fp32: Nodes the plan wanted in FP16/BF16 and the writer kept in FP32.
        subgraph_nodes: Nodes inside If/Loop/Scan bodies, left unchanged (FP32).
        io_dtypes: Graph input/output name -> element type written (``float32``, ``float16``).
        ort_validated: True when an ONNX Runtime CPU session was built on the written model.
        warnings: Everything else the user should know (flushed parameters, skipped checks).
    """

    opset_before: int
    opset_after: int
    ir_version_before: int
    ir_version_after: int
    keep_io_types: bool
    casts_inserted: int = 0
    casts_at_inputs: int = 0
    casts_at_outputs: int = 0
    cast_nodes_retargeted: tuple[str, ...] = ()
    initializers_converted: int = 0
    initializers_duplicated: int = 0
    constants_converted: int = 0
    constants_duplicated: int = 0
    nodes_per_precision: dict[str, int] = field(default_factory=dict)
    node_precisions: dict[str, str] = field(default_factory=dict)
    tf32_nodes: tuple[str, ...] = ()
    fp32_pinned: tuple[str, ...] = ()
    kept_fp32: tuple[KeptNode, ...] = ()
    subgraph_nodes: int = 0
    io_dtypes: dict[str, str] = field(default_factory=dict)
    ort_validated: bool = False
    warnings: tuple[str, ...] = ()

    def effective_plan(self) -> PrecisionPlan:
        """The plan the written model (plus the TF32 engine setting) actually implements.

        Default FP32; every named node written in FP16/BF16 is listed, TF32 nodes keep
        ``tf32`` and kept-FP32 nodes are listed as FP32 with their reason. Feed it to
        ``emulate`` to emulate exactly what was written (data-movement nodes follow their
        producer there too).
        """
        overrides = {name: NodeDecision(Precision(p), "writer") for name, p in
                     self.node_precisions.items() if p != Precision.FP32.value}
        overrides.update({k.node: NodeDecision(Precision.FP32, k.reason, k.detail)
                          for k in self.kept_fp32 if k.node})
        overrides.update({name: NodeDecision(Precision.FP32, "writer", "data movement in FP32")
                          for name in self.fp32_pinned})
        overrides.update({name: NodeDecision(Precision.TF32, "writer", "TF32 engine setting")
                          for name in self.tf32_nodes})
        return PrecisionPlan(Precision.FP32, dict(sorted(overrides.items())))

    def to_dict(self) -> dict:
        """JSON-ready dict (stable key order)."""
        data = asdict(self)
        data["schema_version"] = WRITER_REPORT_SCHEMA_VERSION
        data["kept_fp32"] = [k.to_dict() for k in self.kept_fp32]
        for key in ("cast_nodes_retargeted", "tf32_nodes", "fp32_pinned", "warnings"):
            data[key] = list(data[key])
        return data

    @classmethod
    def from_dict(cls, data: Mapping) -> WriterReport:
        """Inverse of ``to_dict``."""
        data = {k: v for k, v in dict(data).items() if k != "schema_version"}
        data["kept_fp32"] = tuple(KeptNode.from_dict(k) for k in data.get("kept_fp32", ()))
        for key in ("cast_nodes_retargeted", "tf32_nodes", "fp32_pinned", "warnings"):
            data[key] = tuple(data.get(key, ()))
        for key in ("nodes_per_precision", "node_precisions", "io_dtypes"):
            data[key] = dict(data.get(key, {}))
        return cls(**data)
