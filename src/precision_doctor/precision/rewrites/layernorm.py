"""``fuse-layernorm``: fuse decomposed LayerNorms into one ONNX ``LayerNormalization`` (opset 17).

Why: a decomposed LayerNorm in FP16 squares ``x - mean`` (overflow above |d| = 256) and adds an
epsilon that may flush to zero; engines warn about it ("LayerNorm may overflow in FP16", field
reports 1 and 2 of MISSION.md) and fix it by exporting at opset >= 17 so LayerNorm is one op they
can keep in FP32 internally (``stash_type``) or run with a fused kernel. PP-OCRv4 rec (opset 12)
has five decomposed LayerNorms.

The rule itself (pattern, check, rewrite) is in ``layernorm_rule``; this module runs it with the
onnxscript matcher and records every fusion and every non-fusion with its reason.
"""

from __future__ import annotations

from typing import ClassVar

import onnx_ir as ir
from onnxscript.rewriter import pattern

from precision_doctor.precision.rewrites.graph_edit import (
    RewritePassResult,
    default_opset,
    remove_dead_constants,
    taken_names,
    unique_name,
)
from precision_doctor.precision.rewrites.layernorm_rule import DecomposedLayerNorm, ShapeOracle
from precision_doctor.precision.rewrites.report import RewriteRecord

MIN_OPSET = 17  # LayerNormalization was added to the default domain in opset 17.
# Most complete variant first: each variant runs over the whole graph before the next.
VARIANTS = tuple((scale, bias, reciprocal) for scale, bias in
                 ((True, True), (True, False), (False, True), (False, False))
                 for reciprocal in (False, True))
NOT_A_LAYERNORM = ("not part of a complete decomposed LayerNorm (ReduceMean -> Sub -> Pow(2) or "
                   "Mul -> ReduceMean -> Add(eps) -> Sqrt -> Div or Reciprocal+Mul), or one of "
                   "its intermediate values is also used outside it")


def _ordered_names(graph: ir.Graph, nodes: list[ir.Node]) -> tuple[str, ...]:
    chosen = set(nodes)
    return tuple(n.name or "" for n in graph if n in chosen)


class FuseLayerNorm(ir.passes.InPlacePass):
    """Pass: fuse every decomposed LayerNorm of the main graph into ``LayerNormalization``.

    Args:
        dry_run: Only find what would be fused (records with ``applied=False`` and
            ``details["candidate"] = 1``), for models below opset 17 before deciding to convert.

    Raises:
        onnx_ir.passes.PreconditionError: (on call) not a dry run and the model's opset is < 17.
    """

    rule: ClassVar[str] = "fuse-layernorm"

    def __init__(self, dry_run: bool = False) -> None:
        super().__init__()
        self.dry_run = dry_run

    def requires(self, model: ir.Model) -> None:
        """Opset >= 17 unless ``dry_run``."""
        if not self.dry_run and default_opset(model) < MIN_OPSET:
            raise ir.passes.PreconditionError(
                f"LayerNormalization needs opset >= {MIN_OPSET}; the model has opset "
                f"{default_opset(model)}. Convert it first (apply_rewrites does).")

    def call(self, model: ir.Model) -> RewritePassResult:
        """Fuse in place (or only look, when ``dry_run``); one record per LayerNorm found,
        per failed check, and per ReduceMean that belongs to no LayerNorm."""
        graph = model.graph
        shapes = ShapeOracle(model)
        failures: dict[tuple[ir.Node, ir.Node], tuple[list[ir.Node], str]] = {}
        taken = taken_names(graph)
        done: dict[tuple[ir.Node, ir.Node], RewriteRecord] = {}
        near = _downstream_of_reduce_mean(graph)
        for with_scale, with_bias, reciprocal in VARIANTS:
            variant = DecomposedLayerNorm(with_scale, with_bias, reciprocal, shapes, failures)
            rules = pattern.RewriteRule(variant.pattern, variant.rewrite, variant.check,
                                        name=variant.name).commute()
            for node in list(graph):
                if node.graph is not graph or node not in near:  # removed by an earlier
                    continue  # fusion, or too far from any ReduceMean to end a LayerNorm
                for rule in rules:
                    record = self._try(model, graph, node, rule, variant, done, taken)
                    if record is not None:
                        break
        records = list(done.values())
        reported = {n for key in done for n in key}
        for key, (nodes, reason) in failures.items():
            if key not in done and all(n.graph is graph for n in nodes):
                records.append(RewriteRecord(self.rule, False, _ordered_names(graph, nodes), (),
                                             reason))
                reported.update(key)
        for node in graph:
            if node.op_type == "ReduceMean" and node.domain == "" and node not in reported:
                records.append(RewriteRecord(self.rule, False, (node.name or "",), (),
                                             f"ReduceMean '{node.name}' is {NOT_A_LAYERNORM}"))
        modified = not self.dry_run and any(r.applied for r in records)
        return RewritePassResult(model, modified, tuple(records))

    def _try(self, model: ir.Model, graph: ir.Graph, node: ir.Node, rule: pattern.RewriteRule,
             variant: DecomposedLayerNorm, done: dict, taken: set[str]) -> RewriteRecord | None:
        if self.dry_run:
            match = rule.match(model, graph, node)
            if not match or variant.plan is None:
                return None
            key = (match.bindings["mean"].producer(), match.bindings["var"].producer())
            if key in done:
                return done[key]
            plan = variant.plan
            done[key] = RewriteRecord(
                self.rule, False, _ordered_names(graph, list(match.nodes)), (),
                f"decomposed LayerNorm (axis={plan.axis}, epsilon={plan.epsilon:g}) can be fused "
                f"once the model is at opset >= {MIN_OPSET}", {"candidate": 1})
            return done[key]
        delta = rule.try_rewrite(model, graph, node)
        if delta is None:
            return None
        made = variant.plan
        assert made is not None  # check() succeeded just before rewrite()
        plan = made
        matched = list(delta.match.nodes)
        key = (delta.match.bindings["mean"].producer(), delta.match.bindings["var"].producer())
        names = _ordered_names(graph, matched)
        for init in delta.new_initializers:
            init.name = unique_name(init.name or "layernorm_param", taken)
            graph.register_initializer(init)
        fused = delta.new_nodes[-1]
        fused.name = unique_name(f"{names[0]}/LayerNormalization", taken)
        ir.convenience.replace_nodes_and_values(graph, node, matched, delta.new_nodes,
                                                delta.match.outputs, delta.new_outputs)
        removed = remove_dead_constants(graph, plan.dropped)
        ops = "/".join(dict.fromkeys(n.op_type for n in graph_order(matched, names)))
        partial = variant.failures.get(key)
        note = f"; a more complete match was not taken: {partial[1]}" if partial else ""
        done[key] = RewriteRecord(
            self.rule, True, names + tuple(removed), (fused.name,),
            f"{ops} fused into LayerNormalization '{fused.name}' (axis={plan.axis}, "
            f"epsilon={plan.epsilon:g}; output '{fused.outputs[0].name}' kept){note}",
            {"axis": plan.axis, "epsilon": plan.epsilon,
             "scale": int(variant.with_scale), "bias": int(variant.with_bias)})
        return done[key]


def graph_order(nodes: list[ir.Node], names: tuple[str, ...]) -> list[ir.Node]:
    """``nodes`` sorted like ``names`` (their graph order, taken before they were removed)."""
    rank = {name: i for i, name in enumerate(names)}
    return sorted(nodes, key=lambda n: rank.get(n.name or "", len(rank)))


# Nodes from a ReduceMean to the last node of a decomposed LayerNorm it may start: mean -> Sub ->
# Pow -> ReduceMean -> Add(eps) -> Sqrt -> Reciprocal -> Mul -> Mul(scale) -> Add(bias) is 9
# consumer steps; every pattern holds two ReduceMeans, so its last node is at most this far
# from one.
_PATTERN_DEPTH = 10


def _downstream_of_reduce_mean(graph: ir.Graph) -> set[ir.Node]:
    """Nodes within ``_PATTERN_DEPTH`` consumer steps of a ReduceMean (the ReduceMeans
    included): the only nodes a decomposed LayerNorm can end at. The patterns are tried at
    these nodes alone (PP-OCRv4 rec, 860 nodes with 10 ReduceMeans: ``apply_rewrites`` 0.67 s
    before, 0.27 s after; a model without ReduceMean tries none: det 0.26 -> 0.06 s;
    ``benchmarks/rewrites_speed.py``)."""
    frontier = [n for n in graph if n.op_type == "ReduceMean" and n.domain in ("", "ai.onnx")]
    near: set[ir.Node] = set(frontier)
    for _ in range(_PATTERN_DEPTH):
        step = []
        for node in frontier:
            for out in node.outputs:
                for use in out.uses():
                    if use.node not in near:
                        near.add(use.node)
                        step.append(use.node)
        frontier = step
    return near
