"""Phase 1 of the writer: the storage format of every float tensor and what each node needs.

Rules (one pass forward in topological order, one pass backward for what is still open):

* compute node: the plan's precision (TF32 -> FP32 storage), unless it must stay FP32
  (``writer_checks.keep_reason``): every float input bound to the same schema type parameter as
  its data gets that format, outputs too. Inputs of fixed type (Resize ``scales``) stay FP32.
* data-movement node (``DATA_MOVEMENT_OPS``): follows the storage of its float data inputs
  (majority when they differ), so no Cast pair appears around it. When all its float inputs
  are constants or still open, it is decided backward. Only a plan override naming it FP32
  (``--keep Where``; an engine without its BF16 kernel) makes it a compute node in FP32, with
  Casts around it: the values it moves are the same either way.
* backward (open values: ``Cast(to=FLOAT)``, ``ConstantOfShape``, data movement on constants,
  graph inputs when ``keep_io_types`` is off): the one format all consumers ask for, else FP32.
* constants are not given a storage: each consumer gets the format it needs
  (``writer_apply`` converts them once per format).
* If/Loop/Scan nodes and ops without an ONNX schema are opaque: FP32 in and out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import onnx_ir as ir

from precision_doctor.formats import Precision
from precision_doctor.precision.plan import DATA_MOVEMENT_OPS, PrecisionPlan
from precision_doctor.precision.writer.checks import (
    LOW,
    ConstantMemo,
    ConstantView,
    first_allowing,
    keep_reason,
    misfit_node,
)
from precision_doctor.precision.writer.report import KeptNode
from precision_doctor.precision.writer.schema import (
    TypeGroup,
    domain_opset,
    function_body_opset,
    has_subgraph,
    subgraph_nodes,
    type_groups,
)

FLOAT = ir.DataType.FLOAT
PRECISION_OF = {FLOAT: Precision.FP32, ir.DataType.FLOAT16: Precision.FP16,
                ir.DataType.BFLOAT16: Precision.BF16}
FOLLOW_OPS = DATA_MOVEMENT_OPS - {"Constant", "Cast", "ConstantOfShape"}
SHAPE_OPS = frozenset({"Shape", "Size"})
TF32_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose"})  # as in ``emulate``
BF16_CAST_OPSET = 13  # Cast gained tensor(bfloat16) in opset 13


@dataclass
class NodeTyping:
    """What one node becomes.

    Attributes:
        kind: ``compute``, ``follow``, ``cast``, ``fill`` (ConstantOfShape), ``constant`` or
            ``opaque``.
        precision: Storage format of its float data; None when it handles no float data.
        inputs: Input index -> element type that input must have (absent: any type is fine).
        outputs: Float output index -> element type written.
        retarget: New ``to`` of an original ``Cast(to=FLOAT)`` / type of a ``ConstantOfShape``
            value, when it becomes FP16/BF16.
    """

    kind: str
    precision: Precision | None = None
    inputs: dict[int, ir.DataType] = field(default_factory=dict)
    outputs: dict[int, ir.DataType] = field(default_factory=dict)
    retarget: ir.DataType | None = None


@dataclass
class Decisions:
    """Everything phase 2 (``writer_apply``) needs, plus report material."""

    typings: dict[ir.Node, NodeTyping]
    storage: dict[ir.Value, ir.DataType]
    constants: ConstantView
    kept: list[KeptNode]
    tf32: list[str]
    needed_opset: int
    upgrades: dict[str, int]
    unknown_dtype: list[str]
    subgraph_nodes: int
    dtypes: Mapping[str, ir.DataType] = field(default_factory=dict)

    def dtype_of(self, v: ir.Value) -> ir.DataType | None:
        """Element type of ``v`` after the rewrite (float32 tensors) or as inferred (others)."""
        return self.storage.get(v) or v.dtype or self.dtypes.get(v.name or "")


class _Decider:
    """Mutable state of one decision pass over an ``ir.Model`` (never modified here)."""

    def __init__(self, model: ir.Model, plan: PrecisionPlan, keep_io_types: bool,
                 dtypes: Mapping[str, ir.DataType], upgrade_to: int,
                 memo: ConstantMemo | None = None) -> None:
        self.graph = model.graph
        self.plan = plan
        self.keep_io = keep_io_types
        self.opsets = dict(model.opset_imports)
        self.opset = domain_opset(self.opsets, "") or 1
        self.upgrade_to = max(upgrade_to, self.opset)
        self.needed = self.opset
        self.upgrades: dict[str, int] = {}
        self.dtypes = dtypes
        self.consts = ConstantView(self.is_f32, memo)
        self.storage: dict[ir.Value, ir.DataType | None] = {}
        self.typings: dict[ir.Node, NodeTyping] = {}
        self.pending: list[tuple[ir.Node, TypeGroup | None]] = []
        self.kept: list[KeptNode] = []
        self.tf32: list[str] = []
        self.unknown: list[str] = []
        self.data_dep: dict[ir.Value, bool] = {}
        self.shape_dep: dict[ir.Value, bool] = {}

    # -- small queries -------------------------------------------------------------------
    def is_f32(self, v: ir.Value | None) -> bool:
        if v is None:
            return False
        dtype = v.dtype if v.dtype is not None else self.dtypes.get(v.name or "")
        if dtype is None and v.producer() is not None and v.name and v.name not in self.unknown:
            self.unknown.append(v.name)
        return dtype == FLOAT

    def _allowed(self, node: ir.Node, group: TypeGroup, dtype: ir.DataType) -> bool:
        """Whether ``group`` accepts ``dtype`` now or after the opset raise we may do."""
        if dtype == FLOAT or group.allows(dtype):
            return True
        first = first_allowing(node, dtype, self.opset + 1, self.upgrade_to)
        if first is not None:
            self._need(node.op_type, first)
        return first is not None

    def _need_body(self, node: ir.Node, dtype: ir.DataType, opset: int) -> None:
        """Raise the opset where the op's ONNX function body takes ``dtype`` only later
        (``schema.function_body_opset``: a BF16 Clip needs 16, for Where)."""
        if node.domain not in ("", "ai.onnx"):
            return
        body = function_body_opset(node.op_type, dtype, len(node.inputs), max(opset, self.opset),
                                   self.upgrade_to)
        if body is not None:
            self._need(f"{node.op_type}'s function body", body)

    def _need(self, what: str, opset: int) -> None:
        if opset > self.opset:
            self.needed = max(self.needed, opset)
            self.upgrades[what] = max(self.upgrades.get(what, 0), opset)

    # -- the forward pass ----------------------------------------------------------------
    def run(self) -> Decisions:
        for v in self.graph.inputs:
            if self.is_f32(v):
                self.storage[v] = FLOAT if self.keep_io else None
            self.data_dep[v], self.shape_dep[v] = True, False
        for node in self.graph:
            self._track_dependency(node)
            self.typings[node] = self._visit(node)
        self._resolve_pending()
        if not self.keep_io:
            for v in self.graph.inputs:
                if v in self.storage and self.storage[v] is None:
                    self.storage[v] = self._consensus(v)
        storage = {v: (d if d is not None else FLOAT) for v, d in self.storage.items()}
        if any(d == ir.DataType.BFLOAT16 for d in storage.values()) or any(
                t.retarget == ir.DataType.BFLOAT16 for t in self.typings.values()):
            self._need("Cast", BF16_CAST_OPSET)
        inner = sum(len(subgraph_nodes(n)) for n in self.graph if has_subgraph(n))
        return Decisions(self.typings, storage, self.consts, self.kept, self.tf32, self.needed,
                         dict(sorted(self.upgrades.items())), self.unknown, inner, self.dtypes)

    def _track_dependency(self, node: ir.Node) -> None:
        """Mark outputs computed from data (graph inputs) and from tensor shapes."""
        ins = [v for v in node.inputs if v is not None]
        if node.op_type in SHAPE_OPS:
            data, shape = False, True
        else:
            data = any(self.data_dep.get(v, False) for v in ins) or (
                not ins and node.op_type != "Constant")
            shape = any(self.shape_dep.get(v, False) for v in ins)
        for v in node.outputs:
            self.data_dep[v], self.shape_dep[v] = data, shape

    def _shape_computation(self, node: ir.Node) -> bool:
        ins = [v for v in node.inputs if v is not None]
        return not any(self.data_dep.get(v, False) for v in ins) and \
            any(self.shape_dep.get(v, False) for v in ins)

    def _visit(self, node: ir.Node) -> NodeTyping:
        default_domain = node.domain in ("", "ai.onnx")
        if default_domain and node.op_type == "Constant":
            return NodeTyping("constant")
        groups = None if has_subgraph(node) else type_groups(
            node, domain_opset(self.opsets, node.domain) or 1)
        if groups is None:
            return self._opaque(node, "subgraph" if has_subgraph(node) else "unsupported-op")
        pinned = self._pinned_fp32(node)
        if default_domain and node.op_type in ("Cast", "ConstantOfShape"):
            return self._source(node, pinned)
        if default_domain and node.op_type in FOLLOW_OPS and not pinned:
            return self._follow(node, groups)
        return self._compute(node, groups)

    def _pinned_fp32(self, node: ir.Node) -> bool:
        """Whether the plan names ``node`` FP32 explicitly (an override, not the default)."""
        decision = self.plan.overrides.get(node.name or "")
        return decision is not None and decision.precision is Precision.FP32

    def _fixed(self, node: ir.Node, typing: NodeTyping, groups: tuple[TypeGroup, ...]) -> None:
        """Float inputs/outputs bound to no type parameter (fixed ``tensor(float)``) stay FP32."""
        bound_in = {i for g in groups for i in g.inputs}
        bound_out = {o for g in groups for o in g.outputs}
        for i, v in enumerate(node.inputs):
            if i not in bound_in and self.is_f32(v):
                typing.inputs[i] = FLOAT
        for o, v in enumerate(node.outputs):
            if o not in bound_out and self.is_f32(v):
                typing.outputs[o] = FLOAT
                self.storage[v] = FLOAT

    def _opaque(self, node: ir.Node, reason: str) -> NodeTyping:
        typing = NodeTyping("opaque")
        self._fixed(node, typing, ())
        if typing.inputs or typing.outputs:
            typing.precision = Precision.FP32
            requested = self.plan.precision_of(node.name or "")
            if requested in LOW:
                self.kept.append(KeptNode(node.name or "", node.op_type, requested.value, reason,
                                          f"{node.op_type} node kept FP32: {reason}"))
        return typing

    def _compute(self, node: ir.Node, groups: tuple[TypeGroup, ...]) -> NodeTyping:
        typing = NodeTyping("compute")
        float_groups = [g for g in groups if any(self.is_f32(node.inputs[i]) for i in g.inputs)]
        # Main groups carry the data to the outputs; the others (Resize roi, BatchNormalization-15
        # scale/mean/var) are independent and follow only where the op accepts the format.
        main = [g for g in float_groups
                if any(self.is_f32(node.outputs[o]) for o in g.outputs)] or float_groups
        p = self.plan.precision_of(node.name or "")
        if p is Precision.TF32:
            if node.op_type in TF32_OPS and float_groups:
                self.tf32.append(node.name or "")
            p = Precision.FP32
        aux = [g for g in float_groups if g not in main and p in LOW and g.allows(LOW[p])]
        if p in LOW and float_groups:
            kept, needed = keep_reason(node, main, aux, p, self.consts,
                                       self._shape_computation(node), self.opset, self.upgrade_to)
            if kept is not None:
                self.kept.append(kept)
                p, aux = Precision.FP32, []
            else:
                self._need(node.op_type, needed)
                self._need_body(node, LOW[p], needed)
        target = LOW.get(p, FLOAT)
        for g in groups:
            ins = [i for i in g.inputs if self.is_f32(node.inputs[i])]
            dtype = target if g in main or g in aux else FLOAT
            typing.inputs.update({i: dtype for i in ins})
            for o in g.outputs:
                if self.is_f32(node.outputs[o]):
                    typing.outputs[o] = self.storage[node.outputs[o]] = dtype
        self._fixed(node, typing, groups)
        if typing.inputs or typing.outputs:
            typing.precision = p if float_groups else Precision.FP32
        return typing

    def _follow(self, node: ir.Node, groups: tuple[TypeGroup, ...]) -> NodeTyping:
        typing = NodeTyping("follow")
        for g in groups:
            ins = [i for i in g.inputs if self.is_f32(node.inputs[i])]
            outs = [o for o in g.outputs if self.is_f32(node.outputs[o])]
            if not outs and len(g.inputs) <= 1:
                continue  # Shape, ArgMax, ... read any type: nothing to match
            if not ins:
                for o in outs:
                    typing.outputs[o] = self.storage[node.outputs[o]] = FLOAT
                continue
            votes: Counter[ir.DataType] = Counter()
            for i in ins:
                seen = self.storage.get(node.inputs[i])  # type: ignore[arg-type]
                if seen is not None:  # constants and open values do not vote
                    votes[seen] += 1
            if not votes:
                self.pending.append((node, g))
                for o in outs:
                    self.storage[node.outputs[o]] = None
                continue
            self._assign(node, typing, g, self._settle(node, g, votes.most_common(1)[0][0]))
        self._fixed(node, typing, groups)
        return typing

    def _settle(self, node: ir.Node, group: TypeGroup, dtype: ir.DataType) -> ir.DataType:
        """``dtype`` for a data-movement group, or FLOAT when the op or a constant forbids it."""
        if dtype == FLOAT or not self._allowed(node, group, dtype):
            return FLOAT
        for i in group.inputs:
            kept = misfit_node(node, node.inputs[i], PRECISION_OF[dtype], self.consts)
            if kept is not None:
                self.kept.append(kept)
                return FLOAT
        return dtype

    def _assign(self, node: ir.Node, typing: NodeTyping, group: TypeGroup,
                dtype: ir.DataType) -> None:
        for i in group.inputs:
            if self.is_f32(node.inputs[i]):
                typing.inputs[i] = dtype
        for o in group.outputs:
            if self.is_f32(node.outputs[o]):
                typing.outputs[o] = dtype
                self.storage[node.outputs[o]] = dtype
        if typing.precision is None or dtype != FLOAT:
            typing.precision = PRECISION_OF[dtype]

    def _source(self, node: ir.Node, pinned: bool = False) -> NodeTyping:
        """``Cast(to=FLOAT)`` and float ``ConstantOfShape``: decided by their consumers (FP32
        when the plan names the node FP32)."""
        kind = "cast" if node.op_type == "Cast" else "fill"
        typing = NodeTyping(kind)
        out = node.outputs[0]
        if pinned and self.is_f32(out):
            typing.outputs[0] = self.storage[out] = FLOAT
            typing.precision = Precision.FP32
        elif self.is_f32(out):
            self.pending.append((node, None))
            self.storage[out] = None
        return typing

    # -- the backward pass ---------------------------------------------------------------
    def _demands(self, v: ir.Value) -> set[ir.DataType]:
        wanted: set[ir.DataType] = set()
        for use in v.uses():
            typing = self.typings.get(use.node)
            if typing is None:  # a node inside an If/Loop body reads it: keep FP32
                wanted.add(FLOAT)
            elif use.idx in typing.inputs:
                wanted.add(typing.inputs[use.idx])
        if v.is_graph_output() and self.keep_io:
            wanted.add(FLOAT)
        return wanted

    def _consensus(self, v: ir.Value) -> ir.DataType:
        wanted = self._demands(v)
        return wanted.pop() if len(wanted) == 1 else FLOAT

    def _resolve_pending(self) -> None:
        for node, group in reversed(self.pending):
            typing = self.typings[node]
            if group is not None:
                outs = [node.outputs[o] for o in group.outputs if self.is_f32(node.outputs[o])]
                wanted: set[ir.DataType] = set()
                for v in outs:
                    wanted |= self._demands(v)
                dtype = wanted.pop() if len(wanted) == 1 else FLOAT
                self._assign(node, typing, group, self._settle(node, group, dtype))
                continue
            out = node.outputs[0]
            dtype = self._consensus(out)
            if dtype != FLOAT and node.op_type == "ConstantOfShape":
                value = node.attributes.get("value")
                kept = None if value is None else misfit_node(node, out, PRECISION_OF[dtype],
                                                              self.consts)
                if kept is not None:
                    self.kept.append(kept)
                    dtype = FLOAT
            typing.outputs[0] = self.storage[out] = dtype
            typing.precision = PRECISION_OF[dtype]
            if dtype != FLOAT:
                typing.retarget = dtype


def decide(model: ir.Model, plan: PrecisionPlan, keep_io_types: bool,
           dtypes: Mapping[str, ir.DataType], upgrade_to: int,
           memo: ConstantMemo | None = None) -> Decisions:
    """Decide storage formats for ``model`` under ``plan`` (the model is not modified).

    Args:
        model: The model, as ``onnx_ir``.
        plan: Node name -> precision (unnamed nodes take the plan's default).
        keep_io_types: Keep float graph inputs and outputs FP32.
        dtypes: Tensor name -> element type from ONNX shape inference (for values the model
            does not annotate).
        upgrade_to: Ops that accept FP16/BF16 only at a higher opset count as accepting it up
            to this opset; ``Decisions.needed_opset`` says which opset the result needs.
        memo: Facts about the constants shared with other writes of the same unchanged model
            (``checks.ConstantMemo``), or None.

    Returns:
        The decisions.
    """
    return _Decider(model, plan, keep_io_types, dtypes, upgrade_to, memo).run()
