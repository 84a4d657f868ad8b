"""The fix workflow behind the CLI: search, write the model, plan, recipes and reports."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from rich.console import Console

from precision_doctor.analysis.fix import FixResult, fix
from precision_doctor.analysis.objective import Objective
from precision_doctor.compare.tasks.registry import get_metric
from precision_doctor.errors import InputError, MetricError
from precision_doctor.graph.load import input_metadata, load_model
from precision_doctor.inputs import load_samples
from precision_doctor.report.files import (
    check_writable,
    write_bytes_atomic,
    write_json,
    write_text_atomic,
)
from precision_doctor.report.fix_terminal import render_fix
from precision_doctor.report.progress import progress_bar
from precision_doctor.runners.ort import OrtRunner
from precision_doctor.runners.ort_options import ort_providers
from precision_doctor.workflows.diagnose import invocation, parse_precision, parse_tolerances


def sidecar_paths(output: Path) -> dict[str, Path]:
    """Files written next to the fixed model: plan, recipes, JSON report, and the rewritten
    FP32 model (the base of the weakly typed TensorRT route: its node names are the plan's)."""
    stem = output.with_suffix("")
    return {"plan": Path(f"{stem}.plan.json"), "recipes": Path(f"{stem}.recipes.md"),
            "report": Path(f"{stem}.report.json"),
            "rewritten": Path(f"{stem}.rewritten-fp32.onnx")}


def build_objective(tolerances: Sequence[str], metric: str | None, threshold: float | None,
                    target) -> Objective:
    """A metric objective when ``metric`` is given, else a tolerance objective."""
    if metric:
        m = get_metric(metric)
        if threshold is None and m.default_threshold is None:
            raise MetricError(f"metric {metric!r} has no default threshold: pass --threshold")
        return Objective(metric=m, threshold=threshold)
    if threshold is not None:
        raise InputError("--threshold needs --metric")
    return Objective(tolerances=parse_tolerances(tolerances, target)
                     or parse_tolerances(["rel_l2=" + str(_default(target))], target))


def _default(target) -> float:
    from precision_doctor.compare.tolerance import default_tolerance

    return default_tolerance(target).rel_l2


def run_fix(model_path: Path, output: Path, *, data: str, preprocess: str | None, target: str,
            tolerances: Sequence[str], metric: str | None, threshold: float | None,
            keep: Sequence[str], force_low: Sequence[str], no_rewrites: bool,
            keep_io_types: bool, runner: str, max_samples: int | None, max_evals: int,
            html_path: Path | None, force: bool, console: Console, quiet: bool = False
            ) -> FixResult:
    """Run ``fix`` and write the fixed model, its plan, recipes and reports.

    Raises:
        PrecisionDoctorError: Any user-facing problem; nothing is written then.
        TargetNotMetError: The target cannot be met even in FP32 (nothing is written).
    """
    side = sidecar_paths(output)
    if output.resolve() == Path(model_path).resolve():
        raise InputError("-o must differ from the input model: precision-doctor never "
                         "overwrites your model")
    check_writable([output, *side.values(), html_path], force)
    precision = parse_precision(target)
    model = load_model(model_path)
    samples = load_samples(data, input_metadata(model), preprocess, max_samples)
    objective = build_objective(tolerances, metric, threshold, precision)
    factory = None
    if runner != "emulate":
        providers, options = ort_providers(runner)

        def factory(m):
            return OrtRunner(m, providers, options, name=runner)

    with progress_bar(console, enabled=not quiet and console.is_terminal) as progress:
        result = fix(model, samples, precision, objective, keep, force_low,
                     [] if no_rewrites else None, keep_io_types, factory, max_evals, progress)
    report = result.to_dict()
    report["model"] = {"input": str(model_path), "output": str(output)}
    recipes_md = _recipes(result, side, output, samples, report, model)
    write_bytes_atomic(output, result.model.SerializeToString(), force)
    write_bytes_atomic(side["rewritten"], result.rewritten.SerializeToString(), force)
    write_json(side["plan"], result.plan.to_dict(), force)
    write_text_atomic(side["recipes"], recipes_md, force)
    write_json(side["report"], report, force)
    if html_path:
        write_text_atomic(html_path, _fix_html(model, result, samples, precision, report), force)
    if not quiet:
        render_fix(result, console)
        for name, path in [("model", output), *side.items()] + (
                [("html", html_path)] if html_path else []):
            console.print(f"{name}: {path}", markup=False)
    else:
        console.print(f"{'PASS' if result.passed else 'FAIL'}: wrote {output}", markup=False)
    return result


def _fix_html(model, result: FixResult, samples, precision, report: dict) -> str:
    """HTML report headlined by the fix's objective (the user's task metric and threshold, or
    tolerance): the original model's naive score vs the fixed model's. Below it, the diagnosis
    of the written model (run by ONNX Runtime CPU) against the default tolerance, as secondary
    information, without the causes the fix removed (``analysis.fix_review``)."""
    from precision_doctor.analysis.candidates import onnxruntime
    from precision_doctor.analysis.diagnose import diagnose
    from precision_doctor.analysis.fix_review import review_fixed_diagnosis
    from precision_doctor.report.html import render_html

    after = diagnose(model, samples, precision,
                     onnxruntime(["cpu"], model=result.model, name="ort-cpu-fixed"),
                     noise=False, measure_impact=False, model_path=report["model"]["input"])
    after, resolved = review_fixed_diagnosis(after, result.model, result.plan, result.rewrites,
                                             result.writer)
    return render_html(after, fix=fix_summary(result, report, resolved), command=invocation())


def fix_summary(result: FixResult, report: dict, resolved=()) -> dict:
    """The ``fix`` argument of ``report.html.render_html`` (see ``render_fix_section``)."""
    plan_rows = [{"node": n, "op_type": next((x.op_type for x in result.model.graph.node
                                             if x.name == n), ""),
                  "precision": d.precision.value, "reason": d.reason, "detail": d.detail}
                 for n, d in result.plan.overrides.items()]
    threshold, higher = result.pass_mark
    return {"before": result.before, "after": result.after, "plan": plan_rows,
            "fp32_share_nodes": result.share["nodes"],
            "fp32_share_flops": result.share["flops"],
            "recipes": {k: v for k, v in report.get("recipes", {}).items()
                        if isinstance(v, str)},
            "verdict": "pass" if result.passed else "fail",
            "model": report.get("model", {}).get("output"),
            "objective": {"text": result.objective, "target": result.target,
                          "score_label": result.score_label, "threshold": threshold,
                          "higher_is_better": higher,
                          "before": {"value": result.score_before.value,
                                     "passed": result.score_before.passed},
                          "after": {"value": result.score_after.value,
                                    "passed": result.score_after.passed}},
            "resolved": [c.to_dict() for c in resolved]}


def _recipes(result: FixResult, side: dict[str, Path], output: Path, samples, report: dict,
             model) -> str:
    """Engine recipes as markdown (also stored in the JSON report)."""
    from precision_doctor.precision.recipes import build_recipes

    shapes: dict[str, list[list[int]]] = {}
    for s in samples:
        for k, v in s.feeds.items():
            shapes.setdefault(k, []).append(list(v.shape))
    dynamic = any(m.is_dynamic() for m in input_metadata(model))
    recipes = build_recipes(fixed_model=str(output), original_model=str(side["rewritten"]),
                            plan=result.plan, target=result.target, tf32=False,
                            input_shapes=shapes, dynamic=dynamic,
                            plan_json=str(side["plan"]))
    report["recipes"] = recipes.to_dict()
    return recipes.render_markdown()
