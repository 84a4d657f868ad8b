"""``fold-constants``: replace subgraphs whose inputs are all constant by their value.

Uses onnxscript's constant folder (``onnxscript.optimizer.fold_constants``): each foldable node
is evaluated once, in the model's own dtypes, by the ONNX reference evaluator (or an exact
numpy partial evaluator for shape ops), so the stored value is what the op computes at run time
up to the rounding of the op's own implementation. onnxscript's size limits apply (inputs up to
8192 elements, outputs up to 262144). ``Constant`` nodes left without readers by the folding are
removed; other dead nodes that were already in the model are left alone.
"""

from __future__ import annotations

from typing import ClassVar

import onnx_ir as ir
import onnxscript.optimizer

from precision_doctor.precision.rewrites.graph_edit import RewritePassResult
from precision_doctor.precision.rewrites.report import RewriteRecord


def _dead(graph: ir.Graph) -> set[ir.Node]:
    outputs = set(graph.outputs)
    return {n for n in graph
            if all(not v.uses() and v not in outputs for v in n.outputs)}


class FoldConstants(ir.passes.InPlacePass):
    """Pass: fold constant subgraphs; one record per folded node (with the initializer made)."""

    rule: ClassVar[str] = "fold-constants"

    def call(self, model: ir.Model) -> RewritePassResult:
        """Fold in place; one record per removed node (or one skipped record)."""
        graph = model.graph
        before = list(graph)
        dead_before = _dead(graph)
        initializers_before = set(graph.initializers)
        onnxscript.optimizer.fold_constants(model)
        # Constant producers that the folding left without readers (nothing else).
        removed_dead: list[ir.Node] = []
        changed = True
        while changed:
            changed = False
            for node in _dead(graph) - dead_before:
                if node.op_type == "Constant" and node.domain == "":
                    graph.remove(node, safe=True)
                    removed_dead.append(node)
                    changed = True
        still = set(graph)
        records: list[RewriteRecord] = []
        for node in before:
            if node in still:
                continue
            if node in removed_dead:
                records.append(RewriteRecord(self.rule, True, (node.name or "",), (),
                                             "Constant node no longer read after folding"))
                continue
            made = [v.name for v in node.outputs if v.name in graph.initializers
                    and v.name not in initializers_before]
            what = f"stored as initializer {', '.join(repr(m) for m in made)}" if made else \
                "its output is no longer needed"
            records.append(RewriteRecord(self.rule, True, (node.name or "",), (),
                                         f"{node.op_type} '{node.name}' has only constant inputs: "
                                         f"folded, {what}", {"op_type": node.op_type}))
        for value in graph.initializers.values():
            # onnxscript tags folded values with their sources; the record holds that now.
            value.metadata_props.pop(onnxscript.optimizer.FOLDED_FROM_KEY, None)
            value.meta.pop(onnxscript.optimizer.FOLDED_FROM_KEY, None)
        if not records:
            records.append(RewriteRecord(self.rule, False, (), (),
                                         "no node with only constant inputs within onnxscript's "
                                         "size limits"))
        return RewritePassResult(model, any(r.applied for r in records), tuple(records))
