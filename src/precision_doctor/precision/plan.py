"""``PrecisionPlan``: which precision every node computes in, and why.

A plan is a default precision plus per-node overrides, each with a reason. It is frozen, JSON
round-trips, and is validated against a model so that a plan naming a node that does not exist is
a clear ``PlanError`` instead of a silent no-op.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import onnx

from precision_doctor.errors import PlanError
from precision_doctor.formats import Precision
from precision_doctor.graph.shapes import infer_types

PLAN_SCHEMA_VERSION = 1

# Ops that carry no floating arithmetic of their own; they are never "compute" and never need
# a precision decision (their outputs inherit the producer's format).
DATA_MOVEMENT_OPS = frozenset({
    "Constant", "ConstantOfShape", "Shape", "Size", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
    "Transpose", "Concat", "Split", "Slice", "Gather", "GatherElements", "GatherND", "Expand",
    "Identity", "Tile", "Pad", "DepthToSpace", "SpaceToDepth", "Cast", "CastLike", "NonZero",
    "Range", "TopK", "ArgMax", "ArgMin", "Equal", "Less", "Greater", "LessOrEqual",
    "GreaterOrEqual", "Not", "And", "Or", "Xor", "Where", "ScatterND", "ScatterElements",
    "Trilu", "OneHot", "Compress", "ReverseSequence",
})
# Element types a plan rounds (the emulator and the writer treat these as floating point).
FLOAT_ELEM_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE,
                              onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16})
CAST_OPS = frozenset({"Cast", "CastLike"})


def candidate_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes a ``PrecisionPlan`` decides: every top-level node that computes a
    floating-point value, in graph order.

    The one definition the emulator, the writer, the search, attribution and the impact trials
    share, so that the plan with every candidate in FP32 is the FP32 model (the invariant
    ``search.invariant`` checks):

    * a node that is not pure data movement (``DATA_MOVEMENT_OPS``) and reads or writes a
      floating-point tensor, in any domain: arithmetic, DequantizeLinear, the float scale of
      DynamicQuantizeLinear, custom-domain ops. Integer-only operators (MatMulInteger,
      ConvInteger, QuantizeLinear's integer output alone) are not: they have no float value;
    * a ``Cast``/``CastLike`` that writes a floating-point tensor, whatever it reads: an int32
      accumulator or a position id (from Shape/Range) becomes float there, and the engine stores
      it in the node's format (an int32 of 1.2e5 overflows FP16).

    Element types come from ONNX shape inference (``graph.shapes.infer_types``), and for
    contrib ops (``com.microsoft``) and what follows them from ONNX Runtime's schemas, as the
    emulator types them; a value whose type stays unknown counts as non-float, as the emulator
    treats it.

    Args:
        model: The model (nodes named).

    Returns:
        The candidate nodes, graph order.
    """
    elem = {k: t.tensor_type.elem_type for k, t in infer_types(model).items()
            if t.HasField("tensor_type")}
    if any(n.domain not in ("", "ai.onnx") for n in model.graph.node):
        # contrib ops ONNX inference cannot type, and what follows them: the emulator types
        # them from ONNX Runtime's schemas (``precision.emulate``), so the plan must too
        from precision_doctor.errors import UnsupportedModelError
        from precision_doctor.precision.writer.validate import inferred_dtypes

        try:
            elem.update({k: int(v) for k, v in inferred_dtypes(model).items() if k not in elem})
        except UnsupportedModelError:
            pass

    def is_float(name: str) -> bool:
        return bool(name) and elem.get(name) in FLOAT_ELEM_TYPES

    out = []
    for node in model.graph.node:
        if node.op_type in CAST_OPS:
            if any(is_float(o) for o in node.output):
                out.append(node)
        elif node.op_type not in DATA_MOVEMENT_OPS and (
                any(is_float(o) for o in node.output) or any(is_float(i) for i in node.input)):
            out.append(node)
    return out


@dataclass(frozen=True)
class NodeDecision:
    """The precision of one node and why it was chosen.

    Attributes:
        precision: The node's compute precision.
        reason: Short machine-readable reason: ``default``, ``hazard``, ``search``, ``rewrite``,
            ``user``, ``engine``, ``length`` (a rounded length near its boundary:
            ``diagnosis.lengths.guard``).
        detail: Human-readable evidence (e.g. "running variance max 9.8e7 > 65504").
    """

    precision: Precision
    reason: str = "default"
    detail: str = ""


@dataclass(frozen=True)
class PrecisionPlan:
    """Node name -> precision, with a default for every node not listed.

    Attributes:
        default: Precision of every node without an override (e.g. ``fp16``).
        overrides: Node name -> decision. Node names are ONNX ``NodeProto.name`` values.
    """

    default: Precision
    overrides: Mapping[str, NodeDecision] = field(default_factory=dict)

    def precision_of(self, node_name: str) -> Precision:
        """The precision of ``node_name`` (its override, else the default)."""
        decision = self.overrides.get(node_name)
        return decision.precision if decision else self.default

    def with_overrides(self, decisions: Mapping[str, NodeDecision]) -> PrecisionPlan:
        """A new plan with ``decisions`` added (replacing existing overrides of those nodes)."""
        merged = dict(self.overrides)
        merged.update(decisions)
        return PrecisionPlan(self.default, dict(sorted(merged.items())))

    def keep_fp32(self, names: Iterable[str], reason: str, detail: str = "") -> PrecisionPlan:
        """A new plan with ``names`` forced to FP32 for ``reason``."""
        return self.with_overrides(
            {n: NodeDecision(Precision.FP32, reason, detail) for n in names})

    def fp32_nodes(self) -> list[str]:
        """Names of the overridden nodes that run in FP32, sorted."""
        return sorted(n for n, d in self.overrides.items() if d.precision is Precision.FP32)

    def validate(self, model: onnx.ModelProto) -> None:
        """Check every override names a node of ``model``.

        Raises:
            PlanError: An override names a node that is not in the graph; the message lists up to
                five close names.
        """
        names = {n.name for n in model.graph.node}
        missing = sorted(set(self.overrides) - names)
        if missing:
            import difflib

            hints = difflib.get_close_matches(missing[0], sorted(names), n=5)
            hint = f" Did you mean: {', '.join(hints)}?" if hints else ""
            raise PlanError(
                f"the precision plan names {len(missing)} node(s) not in the model, e.g. "
                f"{missing[0]!r}.{hint} Node names are case-sensitive; list them with "
                "`precision-doctor diagnose --json` (layerwise table).", node=missing[0])

    def to_dict(self) -> dict:
        """JSON-ready dict (stable key order)."""
        return {
            "schema_version": PLAN_SCHEMA_VERSION,
            "default": self.default.value,
            "overrides": {
                name: {"precision": d.precision.value, "reason": d.reason, "detail": d.detail}
                for name, d in sorted(self.overrides.items())
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> PrecisionPlan:
        """Inverse of ``to_dict``.

        Raises:
            PlanError: Unknown precision or malformed structure.
        """
        try:
            default = Precision.parse(data["default"])
            overrides = {
                str(name): NodeDecision(Precision.parse(d["precision"]),
                                        str(d.get("reason", "user")), str(d.get("detail", "")))
                for name, d in dict(data.get("overrides", {})).items()
            }
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise PlanError(f"malformed precision plan: {exc}. Expected "
                            '{"default": "fp16", "overrides": {"node": {"precision": "fp32"}}}'
                            ) from exc
        return cls(default, dict(sorted(overrides.items())))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PrecisionPlan:
        """Read a plan written by ``to_dict`` from a JSON file.

        Raises:
            PlanError: The file is missing, not JSON, or malformed.
        """
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            raise PlanError(f"cannot read precision plan {path}: {exc}", file=str(path)) from exc


def select_nodes(model: onnx.ModelProto, entries: Iterable[str], option: str,
                 hint: str = "") -> list[str]:
    """Node names matched by ``entries``: each an exact node name or an op type.

    Args:
        model: The model whose nodes are searched.
        entries: Node names or op types (e.g. ``LayerNormalization``), as given on the CLI.
        option: The option the entries came from (``--keep``), for the error message.
        hint: Extra sentence for the error message.

    Raises:
        PlanError: An entry matches no node name or op type.
    """
    names: list[str] = []
    for entry in entries:
        matched = [n.name for n in model.graph.node if n.name == entry or n.op_type == entry]
        if not matched:
            raise PlanError(f"{option} {entry!r} matches no node name or op type of the model"
                            + (f" {hint}" if hint else ""), node=entry)
        names.extend(matched)
    return names
