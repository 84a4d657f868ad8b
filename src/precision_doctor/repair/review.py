"""What a diagnosis of a *fixed* model may say: causes the fix removed are not its causes.

``fix`` writes a model whose BatchNorms were folded into convolutions (and decomposed
LayerNorms fused) and whose sensitive nodes run in FP32. Its HTML report diagnoses that model
against the FP32 reference; the diagnosis is computed on the original graph, so its static
hazards and findings may still name a node that the rewrites removed (a BatchNormalization with
variance 9.8e7) or that the plan keeps in FP32. Those are causes the fix *resolved*: showing
one as the fixed model's main cause would be false.

``review_fixed_diagnosis`` splits them off:

- a node that an applied rewrite replaced and that is not in the written model:
  ``removed by the <rule> rewrite``;
- any other node absent from the written model: ``not in the fixed model``;
- a finding or hazard whose nodes all run in FP32 in the written model (the plan's overrides
  and the nodes the writer kept in FP32): ``kept in FP32 by the fix``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

import onnx

from precision_doctor.diagnosis.report import DiagnosisReport
from precision_doctor.formats import Precision
from precision_doctor.precision.plan import PrecisionPlan


@dataclass(frozen=True)
class ResolvedCause:
    """A finding or hazard of the original model that the fix removed.

    Attributes:
        kind: The finding/hazard kind (e.g. ``parameter-out-of-range``).
        node: The node it was about.
        op_type: That node's op type.
        summary: The original sentence (finding summary or hazard detail).
        how: How the fix removed it (``removed by the fold-batchnorm rewrite``, ``kept in FP32
            by the fix``, ``not in the fixed model``).
    """

    kind: str
    node: str
    op_type: str
    summary: str
    how: str

    def to_dict(self) -> dict:
        return {"kind": self.kind, "node": self.node, "op_type": self.op_type,
                "summary": self.summary, "how": self.how}


def fp32_nodes(plan: PrecisionPlan, writer: Mapping) -> frozenset[str]:
    """Nodes that run in FP32 in the written model: FP32 overrides of ``plan`` and the nodes the
    writer kept in FP32 (``writer`` is ``WriterReport.to_dict()``)."""
    names = {n for n, d in plan.overrides.items() if d.precision is Precision.FP32}
    names.update(k.get("node") for k in writer.get("kept_fp32", ()) if k.get("node"))
    if plan.default is Precision.FP32:
        names.add("*")
    return frozenset(names)


def _how(nodes: Iterable[str], node: str, present: set[str], rewritten: Mapping[str, str],
         fp32: frozenset[str]) -> str | None:
    if node and node not in present:
        rule = rewritten.get(node)
        return f"removed by the {rule} rewrite" if rule else "not in the fixed model"
    listed = [n for n in nodes if n] or ([node] if node else [])
    if listed and ("*" in fp32 or all(n in fp32 or n not in present for n in listed)):
        return "kept in FP32 by the fix"
    return None


def review_fixed_diagnosis(report: DiagnosisReport, fixed: onnx.ModelProto, plan: PrecisionPlan,
                           rewrites: Mapping, writer: Mapping
                           ) -> tuple[DiagnosisReport, tuple[ResolvedCause, ...]]:
    """Drop the findings and hazards the fix resolved from a diagnosis of the fixed model.

    Args:
        report: Diagnosis of the fixed model (computed on the original FP32 graph).
        fixed: The written mixed-precision model.
        plan: The fix's final precision plan.
        rewrites: ``RewriteReport.to_dict()`` of the rewrites the fix applied (``records``
            with ``rule``, ``applied``, ``nodes``).
        writer: ``WriterReport.to_dict()`` (its ``kept_fp32`` nodes).

    Returns:
        ``(report without the resolved findings and hazards, the resolved causes)``; the
        resolved causes list each node once per kind, findings first, in report order.
    """
    present = {n.name for n in fixed.graph.node}
    rewritten = {n: r.get("rule", "?") for r in rewrites.get("records", ()) if r.get("applied")
                 for n in r.get("nodes", ())}
    fp32 = fp32_nodes(plan, writer)
    resolved: dict[tuple[str, str], ResolvedCause] = {}
    findings = []
    for f in report.findings:
        how = _how(f.nodes, f.node, present, rewritten, fp32)
        if how is None:
            findings.append(f)
        else:
            resolved.setdefault((f.kind, f.node),
                                ResolvedCause(f.kind, f.node, f.op_type, f.summary, how))
    hazards = []
    for h in report.hazards:
        how = _how(h.nodes, h.node, present, rewritten, fp32)
        if how is None:
            hazards.append(h)
        elif h.severity != "low":
            resolved.setdefault((h.kind, h.node),
                                ResolvedCause(h.kind, h.node, h.op_type, h.detail, how))
    kept = replace(report, findings=tuple(findings), hazards=tuple(hazards))
    return kept, tuple(resolved.values())
