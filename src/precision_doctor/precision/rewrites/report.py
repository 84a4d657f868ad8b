"""What the rewrites did: one ``RewriteRecord`` per application and per non-application.

A non-application carries the *reason* the rule's check gave ("Conv output has another
consumer", "epsilon is not a scalar constant"), in the spirit of the onnxscript rewriter's
``MatchResult.fail(reason)``: the report tells the user why a fusion did not fire.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from precision_doctor.formats import Precision
from precision_doctor.precision.plan import NodeDecision

REPORT_SCHEMA_VERSION = 1

Detail = float | int | str | bool


def _json_number(value: Detail) -> Detail:
    # JSON has no inf/nan: keep them readable and round-trippable as strings.
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def _from_json_number(value: Detail) -> Detail:
    if isinstance(value, str) and value in ("inf", "-inf", "nan"):
        return float(value)
    return value


@dataclass(frozen=True)
class RewriteRecord:
    """One application (or non-application) of one rewrite rule.

    Attributes:
        rule: Rule name (a key of ``REWRITES``, or ``convert-opset`` for the opset conversion
            that ``fuse-layernorm`` needs).
        applied: True when the graph was changed.
        nodes: ONNX node names matched (when applied: removed or replaced), graph order.
        new_nodes: Names of the nodes that implement the rewrite afterwards (empty when the
            rule only removed nodes or did not apply).
        reason: What was done, or why the rule did not apply (from the rule's check).
        details: Evidence as name -> number/string, e.g. ``bn_var_max`` or the FP16 range of
            folded weights (``weight_fp16_subnormal_fraction``).
        keep_fp32: Nodes the rewrite needs computed in FP32 for its effect (the argument
            reduction of ``reduce-periodic-argument`` and the argument's producers); ``fix``
            starts its plan with them in FP32 (reason ``rewrite``).
    """

    rule: str
    applied: bool
    nodes: tuple[str, ...] = ()
    new_nodes: tuple[str, ...] = ()
    reason: str = ""
    details: Mapping[str, Detail] = field(default_factory=dict)
    keep_fp32: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        """JSON-ready dict (stable key order; inf/nan written as strings)."""
        return {
            "rule": self.rule,
            "applied": self.applied,
            "nodes": list(self.nodes),
            "new_nodes": list(self.new_nodes),
            "reason": self.reason,
            "details": {k: _json_number(v) for k, v in sorted(self.details.items())},
            "keep_fp32": list(self.keep_fp32),
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> RewriteRecord:
        """Inverse of ``to_dict``.

        Raises:
            KeyError: ``rule`` or ``applied`` is missing.
        """
        return cls(
            rule=str(data["rule"]),
            applied=bool(data["applied"]),
            nodes=tuple(str(n) for n in data.get("nodes", ())),
            new_nodes=tuple(str(n) for n in data.get("new_nodes", ())),
            reason=str(data.get("reason", "")),
            details={str(k): _from_json_number(v)
                     for k, v in dict(data.get("details", {})).items()},
            keep_fp32=tuple(str(n) for n in data.get("keep_fp32", ())),
        )


@dataclass(frozen=True)
class RewriteReport:
    """Everything ``apply_rewrites`` did to a model, in the order it was done.

    Attributes:
        rules: The rules that were run, in run order.
        records: One record per application and per non-application.
        opset_before: Default-domain opset of the input model.
        opset_after: Default-domain opset of the rewritten model.
    """

    rules: tuple[str, ...]
    records: tuple[RewriteRecord, ...] = ()
    opset_before: int = 0
    opset_after: int = 0

    def applied(self, rule: str | None = None) -> tuple[RewriteRecord, ...]:
        """Records of applications, of ``rule`` only when given."""
        return tuple(r for r in self.records if r.applied and rule in (None, r.rule))

    def skipped(self, rule: str | None = None) -> tuple[RewriteRecord, ...]:
        """Records of non-applications (with their reasons), of ``rule`` only when given."""
        return tuple(r for r in self.records if not r.applied and rule in (None, r.rule))

    def counts(self) -> dict[str, dict[str, int]]:
        """Rule -> ``{"applied": n, "skipped": m}``, for every rule with a record."""
        out: dict[str, dict[str, int]] = {}
        for r in self.records:
            entry = out.setdefault(r.rule, {"applied": 0, "skipped": 0})
            entry["applied" if r.applied else "skipped"] += 1
        return out

    def fp32_decisions(self) -> dict[str, NodeDecision]:
        """Node -> FP32 decision (reason ``rewrite``) for every node an applied rewrite asks to
        keep in FP32 (``RewriteRecord.keep_fp32``), the detail naming the rule."""
        return dict(sorted(
            (name, NodeDecision(Precision.FP32, "rewrite", f"{r.rule}: {r.reason}"))
            for r in self.applied() for name in r.keep_fp32))

    @property
    def changed(self) -> bool:
        """True when at least one rewrite changed the model."""
        return any(r.applied for r in self.records)

    def to_dict(self) -> dict:
        """JSON-ready dict (stable key order)."""
        return {
            "schema_version": REPORT_SCHEMA_VERSION,
            "rules": list(self.rules),
            "opset_before": self.opset_before,
            "opset_after": self.opset_after,
            "counts": self.counts(),
            "records": [r.to_dict() for r in self.records],
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> RewriteReport:
        """Inverse of ``to_dict`` (``counts`` is derived, so it is ignored).

        Raises:
            KeyError: A record lacks ``rule`` or ``applied``.
        """
        return cls(
            rules=tuple(str(r) for r in data.get("rules", ())),
            records=tuple(RewriteRecord.from_dict(r) for r in data.get("records", ())),
            opset_before=int(data.get("opset_before", 0)),
            opset_after=int(data.get("opset_after", 0)),
        )

    def to_json(self) -> str:
        """``to_dict`` as indented JSON text."""
        return json.dumps(self.to_dict(), indent=2)
