"""The fix's HTML page (``Fix.to_html``): a diagnosis of the fixed model with the fix's
objective, plan and recipes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from precision_doctor.api.options import parse_precision
from precision_doctor.repair.result import FixResult
from precision_doctor.report.terminal.fix import fp32_groups
from precision_doctor.runners.verify import VerifiedBy


def fix_html(fixed: Any, command: str | None) -> str:
    """The HTML page of ``Fix.to_html``: the fixed model diagnosed (on the runner that
    verified it) against the FP32 reference on the calibration samples, headlined by the
    fix's objective, with the plan, its module groups and the recipes.

    Args:
        fixed: An ``api.fixing.Fix`` holding its model, result, source and samples.
        command: The command line shown on the page, if any.
    """
    from precision_doctor.diagnosis.diagnose import diagnose
    from precision_doctor.layerwise.candidates import verified
    from precision_doctor.repair.review import review_fixed_diagnosis
    from precision_doctor.report.html import render_html
    from precision_doctor.runners.kernels.engines import conv_bias_of

    result = fixed.result
    assert result is not None and fixed.model is not None and fixed.source is not None
    source = (fixed.report.get("model") or {}).get("input")
    # the fixed model diagnosed with the runner that verified it (ONNX Runtime CPU cannot
    # run most BF16 models: then its exact emulation, runners.verify)
    verifier = VerifiedBy.from_dict(result.verification) if result.verification else \
        VerifiedBy("ort-cpu-fixed", "ort:cpu", "the default verifier")
    after = diagnose(fixed.source, list(fixed.samples), parse_precision(result.target),
                     verified(verifier, fixed.model, conv_bias_of(result.engine or None)),
                     noise=False, measure_impact=False,
                     model_path=source)
    # the page is headlined by the fix's objective; the default-tolerance diagnosis is
    # secondary and leaves out the causes the fix removed (folded BatchNorms, FP32 nodes)
    after, resolved = review_fixed_diagnosis(after, fixed.model, result.plan, result.rewrites,
                                             result.writer)
    shipped = {k: v for k, v in (fixed.report.get("model") or {}).items()
               if k in ("shipped_precision", "reference")}  # graph.upcast.Upcast.model_info
    if shipped:
        after = replace(after, model={**after.model, **shipped})
    ops = {n.name: n.op_type for n in fixed.model.graph.node}
    plan_rows = [{"node": n, "op_type": ops.get(n, ""), "precision": d.precision.value,
                  "reason": d.reason, "detail": d.detail}
                 for n, d in result.plan.overrides.items()]
    recipes = fixed.report.get("recipes", {})
    summary = {"before": result.before, "after": result.after, "plan": plan_rows,
               "fp32_share_nodes": result.share["nodes"],
               "fp32_share_flops": result.share["flops"],
               "recipes": {k: v for k, v in recipes.items() if isinstance(v, str)},
               "verdict": result.verdict,
               "model": (fixed.report.get("model") or {}).get("output"),
               "objective": objective_summary(result),
               "resolved": [c.to_dict() for c in resolved],
               "verification": result.verification,
               "plan_groups": fp32_groups(result), "range_bound": result.range_bound,
               "sources": fixed.report.get("fp32_sources") or {},
               "torch": fixed.report.get("torch")}
    return render_html(after, fix=summary, command=command)


def objective_summary(result: FixResult) -> dict:
    """The ``objective`` entry of ``report.html.render_fix_section``'s summary: what the fix
    was judged against and the original (naive) and fixed scores."""
    threshold, higher = result.pass_mark
    from precision_doctor.compare.tasks.accuracy import accuracy_line

    return {"text": result.objective, "target": result.target,
            "accuracy": accuracy_line(result.accuracy),
            "score_label": result.score_label, "threshold": threshold,
            "higher_is_better": higher,
            "before": {"value": result.score_before.value,
                       "passed": result.score_before.passed},
            "after": {"value": result.score_after.value, "passed": result.score_after.passed},
            "holdout": result.holdout}
