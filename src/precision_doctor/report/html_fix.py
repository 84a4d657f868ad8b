"""The fix's sections of the HTML report: its verdict against the objective the user set, and
the fix summary (before/after metrics, FP32 share, the precision plan, engine recipes)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from precision_doctor.diagnosis.report import DiagnosisReport
from precision_doctor.graph.source import Source
from precision_doctor.numbers import fmt_vs
from precision_doctor.report.templating import COLLAPSE_ROWS, Section, model_name, render
from precision_doctor.runners.verify import VerifiedBy

FIX_METRICS = ("rel_l2", "max_abs", "p99_abs", "mean_abs", "cosine", "snr_db", "nan", "inf",
               "argmax_agreement")  # shown per output in the fix's before/after table
MAX_GROUPS = 30  # rows of the FP32 regions table (report.terminal.fix.MAX_PLAN_LINES)


def render_fix_section(fix_summary: Mapping[str, Any]) -> Section:
    """The fix summary: before/after metrics, FP32 share, the precision plan, engine recipes.

    Args:
        fix_summary: Plain dict. Keys (all optional): ``before`` / ``after``: metrics as
            ``{metric: value}`` or ``{output: {metric: value}}``; ``plan``: list of
            ``{"node", "op_type", "precision", "reason", "detail"}``; ``fp32_share_nodes`` /
            ``fp32_share_flops``: shares in [0, 1]; ``recipes``: ``{name: command}``;
            ``verdict``: ``pass``/``fail`` of the fixed model; ``model``: written model path;
            ``objective``: ``{"text", "target", "score_label", "threshold",
            "higher_is_better", "before": {"value", "passed"}, "after": {...}, "accuracy"}``
            (``accuracy``: the FP32 / low precision / fixed accuracy line; with it, the
            page is headlined by ``fix_verdict_section``); ``resolved``: list of
            ``ResolvedCause.to_dict()`` (causes the fix removed); ``verification``:
            ``FixResult.verification`` (the runner that verified the written model, why, and
            why not the others); ``plan_groups``: the FP32 nodes by region
            (``report.terminal.fix.fp32_groups``), shown in at most ``MAX_GROUPS`` rows above
            the full plan; ``range_bound``: ``FixResult.range_bound`` (its ``message``);
            ``sources``: FP32 node -> ``Source.to_dict()`` (``report["fp32_sources"]``),
            shown beside each plan row; ``torch``: ``report["torch"]`` of a fixed
            ``torch.nn.Module`` (``api.pytorch_recipe``): its modules kept in float32, the
            snippet and its errors under autocast beside the ONNX plan's.

    Returns:
        The section (id ``fix``).
    """
    before, after = _flatten(fix_summary.get("before") or {}), _flatten(
        fix_summary.get("after") or {})
    rows = [(k, before.get(k), after.get(k), _ratio(before.get(k), after.get(k)),
             6 if k.endswith(("cosine", "agreement")) else 3)
            for k in list(before) + [k for k in after if k not in before]]
    plan = [dict(p) for p in fix_summary.get("plan") or ()]
    groups = [dict(g) for g in fix_summary.get("plan_groups") or ()]
    more = groups[MAX_GROUPS - 1:] if len(groups) > MAX_GROUPS else []
    return Section("fix", "Fix", render(
        "fix.j2", rows=rows, plan=plan, collapse=len(plan) > COLLAPSE_ROWS,
        groups=groups[:MAX_GROUPS - 1] if more else groups,
        more_groups=(len(more), sum(len(g["nodes"]) for g in more)),
        range_bound=(fix_summary.get("range_bound") or {}).get("message", ""),
        share_nodes=fix_summary.get("fp32_share_nodes"),
        share_flops=fix_summary.get("fp32_share_flops"),
        recipes=dict(fix_summary.get("recipes") or {}), verdict=fix_summary.get("verdict"),
        model=fix_summary.get("model"), verification=fix_summary.get("verification") or {},
        sources={n: Source.from_dict(v) for n, v in (fix_summary.get("sources") or {}).items()},
        torch=fix_summary.get("torch") or {}))


def fix_verdict_section(report: DiagnosisReport, fix_summary: Mapping[str, Any]) -> Section:
    """The headline of a fix report: the fixed model against the objective the user set (task
    metric + threshold, or tolerance), beside the original model's naive score, and the causes
    the fix removed.

    Args:
        report: The diagnosis of the fixed model (for the model name).
        fix_summary: See ``render_fix_section``; uses ``objective`` and ``resolved``;
            ``objective["holdout"]`` (``FixResult.holdout``) adds the held-out samples' row
            and the overfitting verdict.
    """
    o = fix_summary["objective"]
    threshold, higher = o.get("threshold"), bool(o.get("higher_is_better"))
    before, after = o.get("before") or {}, o.get("after") or {}
    fx = {"passed": bool(after.get("passed")), "before_passed": bool(before.get("passed")),
          "target": o.get("target") or report.target, "objective": o.get("text", ""),
          "score_label": o.get("score_label", "score"),
          "threshold": "–" if threshold is None else f"{float(threshold):g}",
          "op": "≥" if higher else "≤", "accuracy": o.get("accuracy", ""),
          "before_text": fmt_vs(_number(before.get("value")), threshold, higher),
          "after_text": fmt_vs(_number(after.get("value")), threshold, higher),
          "runner": _verifier_title(fix_summary.get("verification")),
          "holdout": _holdout(o.get("holdout"), threshold, higher)}
    return Section("verdict", "Verdict", render(
        "fix_verdict.j2", fx=fx, model_name=model_name(report),
        resolved=[dict(c) for c in fix_summary.get("resolved") or ()]))


def _holdout(holdout: Mapping[str, Any] | None, threshold: Any, higher: bool) -> dict:
    """The held-out check for the verdict template: ``repair.holdout.HoldoutCheck``'s dict
    with ``score_text``; {} without one."""
    if not holdout:
        return {}
    return {**holdout, "score_text": fmt_vs(_number(holdout.get("score")), threshold, higher)
            if holdout.get("score") is not None else "–"}


def _verifier_title(verification: Mapping[str, Any] | None) -> str:
    """The runner that verified the fixed model, in words (ONNX Runtime CPU before it was
    recorded)."""
    return VerifiedBy.from_dict(verification).title if verification else "ONNX Runtime CPU"


def _number(x: Any) -> float | None:
    """A JSON number (``"inf"``/``"nan"`` strings too) as a float; None stays None."""
    return None if x is None else float(x)


def _flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{output: {metric: v}}`` -> ``{"output · metric": v}``; OutputMetrics dicts keep only
    ``FIX_METRICS``; JSON's "inf"/"nan" strings become floats."""
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, Mapping):
            keep = ({k: value[k] for k in FIX_METRICS if k in value} if "rel_l2" in value
                    else value)
            flat.update(_flatten(keep, f"{prefix}{key} · "))
        else:
            flat[f"{prefix}{key}"] = float(value) if value in ("inf", "-inf", "nan") else value
    return flat


def _ratio(before: Any, after: Any) -> float | None:
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                  for v in (before, after))
    return after / before if numbers and before != 0 else None
