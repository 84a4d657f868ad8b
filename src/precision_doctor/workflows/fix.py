"""The fix workflow behind the CLI: search, write the model, plan, recipes and reports."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from precision_doctor.analysis.evalpool import resolve_jobs
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
            html_path: Path | None, force: bool, console: Console, quiet: bool = False,
            jobs: int | str = 1) -> FixResult:
    """Run ``fix`` and write the fixed model, its plan, recipes and reports.

    Raises:
        PrecisionDoctorError: Any user-facing problem; nothing is written then.
        TargetNotMetError: The target cannot be met even in FP32 (nothing is written).
        InputError: ``jobs`` is neither a positive integer nor ``auto``.
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
    workers = resolve_jobs(jobs, len(samples))
    factory = None
    if runner != "emulate":
        providers, options = ort_providers(runner)

        def factory(m, intra_op_threads: int = 0):
            return OrtRunner(m, providers, options, name=runner,
                             intra_op_threads=intra_op_threads)

    with progress_bar(console, enabled=not quiet and console.is_terminal) as progress:
        result = fix(model, samples, precision, objective, keep, force_low,
                     [] if no_rewrites else None, keep_io_types, factory, max_evals, progress,
                     workers)
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
        console.print(f"{'PASS' if result.passed else 'FAIL'}: wrote {output} "
                      f"({resources_line(result.resources)})", markup=False)
    return result


def _fix_html(model, result: FixResult, samples, precision, report: dict) -> str:
    """HTML report: a diagnosis of the written model (run by ONNX Runtime CPU) against the
    FP32 reference, plus the fix section (before/after, plan, recipes)."""
    from precision_doctor.analysis.candidates import onnxruntime
    from precision_doctor.analysis.diagnose import diagnose
    from precision_doctor.report.html import render_html

    after = diagnose(model, samples, precision,
                     onnxruntime(["cpu"], model=result.model, name="ort-cpu-fixed"),
                     noise=False, measure_impact=False, model_path=report["model"]["input"])
    plan_rows = [{"node": n, "op_type": next((x.op_type for x in result.model.graph.node
                                             if x.name == n), ""),
                  "precision": d.precision.value, "reason": d.reason, "detail": d.detail}
                 for n, d in result.plan.overrides.items()]
    summary = {"before": result.before, "after": result.after, "plan": plan_rows,
               "fp32_share_nodes": result.share["nodes"],
               "fp32_share_flops": result.share["flops"],
               "recipes": {k: v for k, v in report.get("recipes", {}).items()
                           if isinstance(v, str)}}
    return render_html(after, fix=summary, command=invocation())


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


def resources_line(r: dict) -> str:
    """``12 evaluations (40 sample runs), 95.2 s wall (150.1 s CPU), peak RSS 812 MiB``."""
    if not r:
        return ""
    workers = (f", {r['jobs']} jobs (largest worker {r['peak_rss_workers_mb']:.0f} MiB)"
               if r.get("jobs", 1) > 1 else "")
    return (f"{r['evaluations']} evaluations ({r['samples_run']} sample runs), "
            f"{r['wall_s']:.1f} s wall ({r['cpu_s']:.1f} s CPU), peak RSS "
            f"{r['peak_rss_mb']:.0f} MiB{workers}")


def render_fix(result: FixResult, console: Console) -> None:
    """Before/after table, FP32 share and the nodes kept in FP32."""
    ok = result.passed
    console.print(f"[bold {'green' if ok else 'red'}]{'PASS' if ok else 'FAIL'}[/] "
                  f"{result.target.upper()} target: {escape(result.objective)}")
    t = Table(title="Before / after (relative L2 vs FP32 reference)", title_justify="left")
    for col in ("output", "naive (emulated)", "fixed (ORT CPU)", "fixed (emulated)"):
        t.add_column(col)
    for name in result.before:
        t.add_row(escape(name), f"{result.before[name]['rel_l2']:.3g}",
                  f"{result.after[name]['rel_l2']:.3g}",
                  f"{result.after_emulated[name]['rel_l2']:.3g}")
    console.print(t)
    console.print(f"objective score: before {result.score_before.value:.4g} -> after "
                  f"{result.score_after.value:.4g}")
    s = result.share
    console.print(f"FP32: {s['fp32_nodes']} of {s['compute_nodes']} compute nodes "
                  f"({s['nodes']:.1%}), {s['flops']:.1%} of FLOPs, {s['params']:.1%} of "
                  f"parameters")
    console.print(resources_line(result.resources), markup=False)
    applied = [r for r in result.rewrites.get("records", []) if r.get("applied")]
    if applied:
        counts: dict[str, int] = {}
        for r in applied:
            counts[r["rule"]] = counts.get(r["rule"], 0) + 1
        console.print("rewrites: " + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())))
    for name, d in result.plan.overrides.items():
        console.print(f"  FP32 {escape(name)}: {d.reason} {escape(d.detail)}")
    for t in result.near_ties:
        console.print(f"near-tie (left out of the target): {escape(t.sample)}: FP32 top-1 vs "
                      f"top-2 margin {t.margin:.3g} < 2 x FP32 noise {t.noise:.3g}")
    for note in result.notes:
        console.print(f"note: {escape(note)}")
    for w in result.warnings:
        console.print(f"[yellow]warning:[/] {escape(w)}")


