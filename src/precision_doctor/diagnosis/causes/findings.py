"""Root causes: combine output metrics, the layerwise table and the hazard scan into findings.

Each finding has a kind, the ONNX node and tensor, the evidence (numbers), a remedy, and, where
it could be measured, its impact: the share of the output error that disappears when the
finding's nodes alone are kept in FP32 (one extra emulated evaluation per finding).

Kinds:
    parameter-out-of-range  a weight/statistic does not fit the format (becomes inf)
    activation-overflow     an activation exceeded the format max (it overflowed: the reference
                            exceeds the max, or Inf is born there from finite inputs)
    headroom                an activation came within 2 bits of the format max but did not
                            overflow (a warning: a 4x larger input would overflow)
    underflow               non-zero values flush to zero (epsilons, small activations)
    nan-source              where NaN/Inf is first produced from finite inputs
    periodic-argument       Sin/Cos/Tan of an argument whose spacing in the format exceeds
                            2^-4 rad (``mechanisms.periodic_rule``); its cure is the argument
                            kept in FP32 through the periodic ops (``cures.periodic_cures``)
    accumulated-rounding    no single event: rounding error grows and is amplified by a node
    reference-mismatch      two FP32 evaluations disagree beyond the noise floor

A node (or a multi-node pattern such as a decomposed LayerNorm) appears in one finding only,
with its strongest cause: the first kind of ``KIND_PRIORITY`` that applies (a concrete event
such as an out-of-range parameter explains more than the amplification it causes). After the
impact is measured, findings whose measured impact is below ``MINOR_IMPACT`` (1% of the output
error: less than the spread of repeated measurements on a few samples) form the ``minor``
group, which reports collapse; the others are the ``main`` group.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Mapping, Sequence

from precision_doctor.diagnosis.causes.cures import periodic_cures
from precision_doctor.diagnosis.causes.hazards import Hazard
from precision_doctor.diagnosis.causes.mechanisms import periodic_rule, spacing
from precision_doctor.diagnosis.causes.mechanisms import remedy as mechanism_remedy
from precision_doctor.formats import FORMATS, Precision
from precision_doctor.graph.source import Source
from precision_doctor.jsonable import from_json_float, json_float
from precision_doctor.layerwise.compare import LayerRecord, LayerwiseResult
from precision_doctor.layerwise.gain import top_gains

LOW_HEADROOM_BITS = 2.0  # < 2 bits: a 4x larger input overflows
MAX_FINDINGS = 12
SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}  # measuring order; sort tie-break
MINOR_IMPACT = 0.01  # measured impact below 1% of the output error: the "minor" group
# Kinds whose cure is the overflow region of the node (``diagnosis.causes.cures``), not the
# node alone.
REGION_KINDS = ("activation-overflow", "nan-source")
KIND_PRIORITY = ("parameter-out-of-range", "nan-source", "activation-overflow", "underflow",
                 "reference-mismatch", "periodic-argument", "accumulated-rounding", "headroom")

REMEDIES = {
    "parameter-out-of-range": "keep {node} in FP32, or bring the parameter into range",
    "activation-overflow": "keep {node} (and the ops computing the large values) in FP32, or "
                           "rescale its inputs",
    "headroom": "nothing needed on these inputs; if inputs can be larger, keep {node} in FP32 "
                "or rescale its inputs",
    "underflow": "keep {node} in FP32 or raise the epsilon/scale so it stays representable",
    "nan-source": "keep {node} in FP32; NaN/Inf propagates from here to the outputs",
    "accumulated-rounding": "keep {node} in FP32 (it amplifies upstream rounding error most); "
                            "`precision-doctor fix` searches the smallest such set",
    "reference-mismatch": "disable TF32 (CUDA EP use_tf32=0, TensorRT --noTF32), compare with "
                          "deterministic algorithms, and check conditioning at {node}",
}
# Op-specific remedies that keep low precision (what `precision-doctor fix` rewrites).
OP_REMEDIES = {
    ("parameter-out-of-range", "BatchNormalization"):
        "fold {node} into the preceding Conv/Gemm (computed in float64: the out-of-range "
        "variance disappears; `precision-doctor fix` does this), or keep it in FP32",
    ("parameter-out-of-range", "Where"):
        "use a fill value in range (e.g. -65504 = -max FP16, or finfo(float16).min) for the "
        "mask; -inf is harmless for Softmax unless a whole row is masked (then NaN)",
    ("parameter-out-of-range", "Add"):
        "if this is an attention mask, use a fill value in range (-65504); else keep {node} in "
        "FP32",
}
# An out-of-range constant that only masks (hazard evidence ``masking_only``).
MASKING_REMEDY = ("`precision-doctor fix` clamps the mask constant to the format's lowest finite "
                  "value (saturate-constants, as TensorRT's weight conversion does) and keeps "
                  "{node} in low precision; or keep {node} in FP32")
LAYERNORM_REMEDY = ("fuse the decomposed LayerNorm into one LayerNormalization (opset >= 17), "
                    "whose statistics engines compute in FP32 (`precision-doctor fix` does "
                    "this), or keep its nodes in FP32")


@dataclass(frozen=True)
class Finding:
    """One explained problem.

    Attributes:
        kind: See the module docstring.
        node: ONNX node name.
        op_type: Its op type.
        tensor: The tensor the evidence is about.
        summary: One sentence with the numbers.
        evidence: The numbers (JSON scalars).
        remedy: What to do.
        severity: ``error`` (measured to break the output), ``warning`` (risk), ``info``.
        nodes: Nodes the remedy keeps in FP32.
        impact: Share of the output error removed when ``nodes`` run in FP32 (0..1), or None.
        group: ``main`` (ranked list) or ``minor`` (measured impact < ``MINOR_IMPACT``;
            reports collapse this group).
        not_measured: Why ``impact`` is None (``NOT_MEASURED``'s reasons), else "".
        source: The Python line and module ``node`` was exported from (``graph.source``:
            dynamo metadata, or a TorchScript node name's module path), or None.
    """

    kind: str
    node: str
    op_type: str
    tensor: str
    summary: str
    evidence: dict
    remedy: str
    severity: str = "warning"
    nodes: tuple[str, ...] = ()
    impact: float | None = None
    group: str = "main"
    not_measured: str = ""
    source: Source | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["nodes"] = list(self.nodes)
        d["source"] = self.source.to_dict() if self.source is not None else None
        d["evidence"] = {k: json_float(v) for k, v in self.evidence.items()}
        return d

    @classmethod
    def from_dict(cls, data: Mapping) -> Finding:
        d = dict(data)
        d["nodes"] = tuple(d.get("nodes", ()))
        d["source"] = Source.from_dict(d["source"]) if d.get("source") else None
        d["evidence"] = {k: from_json_float(v) if v in ("inf", "-inf", "nan") else v
                         for k, v in d.get("evidence", {}).items()}
        return cls(**d)


# Why a finding's impact is None: a short phrase, rendered after "not measured: ".
NOT_MEASURED = {
    "limit": "beyond the first {limit} findings measured one by one (errors first)",
    "budget": "the {seconds:.0f} s findings budget went to the {done} findings measured before",
    "engine": "a real engine is the candidate: cures are measured in the emulation only",
    "off": "impact measurement was turned off",
    "passed": "every output meets its tolerance: there is nothing to cure",
    "no-error": "the output error is 0",
}


def _remedy(kind: str, node: str, op_type: str = "", in_layernorm: bool = False) -> str:
    if in_layernorm and kind in ("activation-overflow", "nan-source", "underflow", "headroom"):
        return LAYERNORM_REMEDY
    return OP_REMEDIES.get((kind, op_type), REMEDIES[kind]).format(node=node)


def _fmt(x: float) -> str:
    return f"{x:.3g}"


@dataclass
class _Builder:
    """Collects findings; a node inside a multi-node pattern (a decomposed LayerNorm) is
    reported once for the whole pattern, whose nodes become the finding's remedy set."""

    target: Precision
    outputs_fail: bool = True
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    regions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    cures: dict[str, tuple[str, ...]] = field(default_factory=dict)  # periodic op -> its cure
    findings: list[Finding] = field(default_factory=list)
    seen: dict[tuple[str, ...], int] = field(default_factory=dict)  # nodes -> findings index

    def add(self, kind: str, rec_or_node, summary: str, evidence: dict, severity: str,
            op_type: str = "", tensor: str = "") -> None:
        if isinstance(rec_or_node, LayerRecord):
            node, op_type, tensor = rec_or_node.node, rec_or_node.op_type, rec_or_node.tensor
        else:
            node = rec_or_node
        nodes = self.groups.get(node) or self.cures.get(node) or (
            self.regions.get(node) if kind in REGION_KINDS else None) or (node,)
        if nodes in self.seen:  # one finding per node: keep the strongest cause
            i = self.seen[nodes]
            old = self.findings[i]
            if KIND_PRIORITY.index(kind) >= KIND_PRIORITY.index(old.kind):
                if kind != old.kind and "also" not in old.evidence:
                    self.findings[i] = replace(old, evidence={**old.evidence, "also": kind})
                return
            evidence = {**evidence, "also": old.kind}
        else:
            self.seen[nodes] = len(self.findings)
            i = -1
        if severity == "error" and not self.outputs_fail:
            severity = "warning"  # measured locally, but the outputs still meet the target
        if len(nodes) > 1 and node in self.groups:
            summary += f" (inside a decomposed LayerNorm of {len(nodes)} nodes, {nodes[0]} .. " \
                       f"{nodes[-1]})"
        elif len(nodes) > 1 and node not in self.cures:
            summary += (f"; its overflow region is {len(nodes)} nodes ({nodes[0]} .. "
                        f"{nodes[-1]}): those computing and reading the values above the "
                        "format max")
        remedy = (mechanism_remedy(kind, nodes) if kind == "periodic-argument"
                  else _remedy(kind, node, op_type, node in self.groups))
        if len(nodes) > 1 and node not in self.groups and node not in self.cures:
            remedy = (f"keep the {len(nodes)} nodes of its overflow region in FP32 ({nodes[0]} "
                      f".. {nodes[-1]}; one node alone is read back in the low format and "
                      "overflows again), or rescale its inputs")
        finding = Finding(kind, node, op_type, tensor, summary, evidence, remedy, severity,
                          nodes)
        if i >= 0:
            self.findings[i] = finding
        else:
            self.findings.append(finding)


def build_findings(hazards: Sequence[Hazard], layerwise: LayerwiseResult | None,
                   target: Precision, outputs_fail: bool,
                   inputs_of: Mapping[str, Sequence[str]] | None = None,
                   tf32: bool | None = None,
                   regions: Mapping[str, tuple[str, ...]] | None = None) -> list[Finding]:
    """Findings from the hazard scan and the layerwise table (impact not yet measured).

    Args:
        hazards: Static hazards.
        layerwise: Layerwise comparison, or None when it was not run.
        target: Target precision.
        outputs_fail: Whether any output failed its tolerance.
        inputs_of: Tensor -> input tensors of its producer (for error amplification).
        tf32: Whether the candidate engine may use TF32 (FP32 comparisons only).
        regions: Node -> its overflow region (``diagnosis.causes.cures.overflow_regions``): the
            nodes an ``activation-overflow`` / ``nan-source`` finding keeps in FP32.

    Returns:
        Findings in detection order.
    """
    fmt = FORMATS[target]
    layernorms = {n: h.nodes for h in hazards if h.kind == "decomposed-layernorm"
                  for n in h.nodes}
    b = _Builder(target, outputs_fail, layernorms, regions or {})
    recs = {r.tensor: r for r in layerwise.records} if layerwise else {}
    for h in hazards:
        if h.kind == "parameter-out-of-range":
            b.add("parameter-out-of-range", h.node, h.detail, dict(h.evidence), "error",
                  op_type=h.op_type, tensor=h.tensor)
        elif h.kind in ("parameter-underflow", "epsilon-underflow") and h.severity != "low":
            b.add("underflow", h.node, h.detail, dict(h.evidence),
                  "warning", op_type=h.op_type, tensor=h.tensor)
    if layerwise:
        birth = recs.get(layerwise.nan_birth) if layerwise.nan_birth else None
        if birth:
            overflowed = birth.overflow > 0 or birth.ref_max_abs > fmt.max
            kind = "activation-overflow" if overflowed else "nan-source"
            b.add(kind, birth, f"{birth.op_type} {birth.node} produces {birth.cand_inf} Inf and "
                  f"{birth.cand_nan} NaN from finite inputs (reference max |x| "
                  f"{_fmt(birth.ref_max_abs)} vs {fmt.name.upper()} max {fmt.max:g}): "
                  "NaN/Inf is born here", _rec_evidence(birth), "error")
        for r in layerwise.records:
            if r.overflow and r.ref_nonfinite == 0:
                b.add("activation-overflow", r, f"{r.op_type} {r.node} output {r.tensor} reaches "
                      f"{_fmt(r.ref_max_abs)} > {fmt.name.upper()} max {fmt.max:g} "
                      f"({r.overflow} elements)", _rec_evidence(r), "error")
        for arg, periodic, nodes in periodic_cures(layerwise, inputs_of or {}):
            b.cures.update({r.node: nodes for r in periodic})
            top = max(periodic, key=lambda r: r.rel_l2 if math.isfinite(r.rel_l2) else 0.0)
            names = " and ".join(f"{r.op_type} {r.node}" for r in periodic)
            b.add("periodic-argument", top, f"{names}: "
                  f"{periodic_rule(top.op_type, arg.ref_max_abs, fmt.unit_roundoff)} (rel L2 "
                  f"{_fmt(top.rel_l2)}; its argument {arg.tensor} comes from {arg.op_type} "
                  f"{arg.node})", {**_rec_evidence(top), "argument_max_abs": arg.ref_max_abs,
                                   "spacing": spacing(arg.ref_max_abs, fmt.unit_roundoff),
                                   "argument": arg.tensor, "mechanism": "periodic-argument"},
                  "error" if top.rel_l2 > layerwise.threshold else "warning")
        for r in layerwise.records:
            if 0 <= r.headroom_bits < LOW_HEADROOM_BITS and r.ref_max_abs > 0 and not r.overflow:
                b.add("headroom", r, f"{r.op_type} {r.node} output {r.tensor} peaks at "
                      f"{_fmt(r.ref_max_abs)}: only {r.headroom_bits:.2f} bits of headroom below "
                      f"{fmt.max:g} (a {2 ** r.headroom_bits:.1f}x larger input overflows)",
                      _rec_evidence(r), "warning")
        for r in layerwise.records:
            if r.flush_to_zero > 0.01 * max(r.numel, 1) and r.rel_l2 > layerwise.threshold:
                b.add("underflow", r, f"{r.op_type} {r.node}: {r.flush_to_zero} non-zero "
                      f"reference values are below half the smallest {fmt.name.upper()} "
                      f"subnormal ({fmt.min_subnormal / 2:.3g}) and flush to zero",
                      _rec_evidence(r), "error")
        for h in hazards:
            if h.kind == "decomposed-layernorm":
                rec = recs.get(h.tensor)
                if rec is not None and rec.headroom_bits < LOW_HEADROOM_BITS:
                    kind = "activation-overflow" if rec.overflow else "headroom"
                    b.add(kind, rec, f"squared deviation {rec.tensor} peaks "
                          f"at {_fmt(rec.ref_max_abs)} (headroom {rec.headroom_bits:.2f} bits)",
                          _rec_evidence(rec), "error" if rec.overflow else "warning")
        if outputs_fail and target is Precision.FP32:
            _reference_mismatch(b, layerwise, inputs_of or {}, tf32)
        elif outputs_fail:
            for r, gain, upstream in top_amplifiers(layerwise, inputs_of or {}, 3):
                b.add("accumulated-rounding", r, f"{r.op_type} {r.node} amplifies the error of "
                      f"its inputs (rel_l2 {_fmt(upstream)}) {gain:.3g}x to rel_l2 "
                      f"{_fmt(r.rel_l2)}: an ill-conditioned step (e.g. cancellation) that "
                      "magnifies ordinary rounding", {**_rec_evidence(r), "gain": gain,
                                                      "input_rel_l2": upstream}, "warning")
    return [replace(f, remedy=MASKING_REMEDY.format(node=f.node))
            if f.kind == "parameter-out-of-range" and f.evidence.get("masking_only") is True
            else f for f in b.findings]


TF32_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")


def _reference_mismatch(b: _Builder, layerwise: LayerwiseResult,
                        inputs_of: Mapping[str, Sequence[str]], tf32: bool | None) -> None:
    """Two FP32 evaluations disagree: localize where and classify why.

    Classes: ``tf32`` (the engine may round MatMul/Conv inputs to 10 mantissa bits and the
    first divergence is such an op), ``ill-conditioned`` (a node multiplies the small
    difference it receives by > 10x: any FP32 reordering is magnified there), otherwise
    ``algorithm-choice`` (different kernels or summation order, not amplified).
    """
    first = layerwise.record(layerwise.first_divergence) if layerwise.first_divergence else None
    amplifiers = top_amplifiers(layerwise, inputs_of, 3)
    if first is not None:
        cause = ("tf32" if tf32 and first.op_type in TF32_OPS else "algorithm-choice")
        b.add("reference-mismatch", first,
              f"the two FP32 engines first differ beyond {layerwise.threshold:g} (rel L2) at "
              f"{first.op_type} {first.node} ({first.tensor}: rel L2 {_fmt(first.rel_l2)}); "
              f"cause: {cause}" + (" (TF32 is on: CUDA EP use_tf32 defaults to 1)"
                                   if tf32 else ""),
              {**_rec_evidence(first), "cause": cause, "tf32": bool(tf32)}, "error")
    for r, gain, upstream in amplifiers:
        if gain > 10:
            b.add("reference-mismatch", r,
                  f"{r.op_type} {r.node} is ill-conditioned: it magnifies the FP32 difference it "
                  f"receives (rel L2 {_fmt(upstream)}) {gain:.3g}x to {_fmt(r.rel_l2)}",
                  {**_rec_evidence(r), "cause": "ill-conditioned", "gain": gain,
                   "input_rel_l2": upstream}, "warning")


def _rec_evidence(r: LayerRecord) -> dict:
    return {"ref_max_abs": r.ref_max_abs, "headroom_bits": r.headroom_bits, "rel_l2": r.rel_l2,
            "overflow": r.overflow, "cand_inf": r.cand_inf, "cand_nan": r.cand_nan,
            "lost_to_zero": r.lost_to_zero, "numel": r.numel}


def top_amplifiers(layerwise: LayerwiseResult, inputs_of: Mapping[str, Sequence[str]], k: int
                   ) -> list[tuple[LayerRecord, float, float]]:
    """The ``k`` tensors whose error grows most over the error of their producer's inputs.

    The local gain of ``layerwise.gain`` (rel_l2 over the producer inputs' rel_l2, floored at
    the format's unit roundoff); only tensors that end above the divergence threshold and
    gains > 2 count.

    Returns:
        (record, gain, input rel_l2) triples, largest gain first.
    """
    u = FORMATS[Precision(layerwise.target)].unit_roundoff
    return [(g.record, g.gain, g.input_rel_l2)
            for g in top_gains(layerwise.records, inputs_of, u, layerwise.threshold, k)]
