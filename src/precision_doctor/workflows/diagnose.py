"""The diagnose workflow behind the CLI: files and option text in, a rendered report out."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Sequence

import onnx
from rich.console import Console

from precision_doctor.analysis.candidates import candidate_from_spec
from precision_doctor.analysis.diagnose import diagnose
from precision_doctor.analysis.diagnosis import DiagnosisReport
from precision_doctor.compare.tolerance import Tolerance, default_tolerance
from precision_doctor.errors import InputError
from precision_doctor.formats import Precision
from precision_doctor.graph.load import input_metadata, load_model
from precision_doctor.inputs import load_samples
from precision_doctor.precision.plan import PrecisionPlan, select_nodes
from precision_doctor.report.files import check_writable, write_json, write_text_atomic
from precision_doctor.report.progress import progress_bar
from precision_doctor.report.terminal import render_diagnosis


def invocation() -> str:
    """The command line that produced this run, shell-quoted (for "reproduce" sections)."""
    return shlex.join(["precision-doctor", *sys.argv[1:]])


def parse_precision(text: str) -> Precision:
    """``Precision.parse`` with an ``InputError`` for the CLI."""
    try:
        return Precision.parse(text)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def parse_tolerances(items: Sequence[str], target: Precision) -> dict[str, Tolerance]:
    """``rel_l2=1e-2,atol=1e-3`` (all outputs, key ``*``) or ``OUTPUT:rel_l2=...`` (one output).

    Raises:
        InputError: Unknown key or bad number.
    """
    result: dict[str, Tolerance] = {}
    for item in items:
        head, _, _ = item.partition("=")
        name, sep, _ = head.rpartition(":")
        output, spec = (name, item[len(name) + 1:]) if sep else ("*", item)
        base = result.get("*", default_tolerance(target))
        try:
            result[output] = Tolerance.parse(spec, base)
        except ValueError as exc:
            raise InputError(f"--tolerance {item!r}: {exc}") from None
    return result


def build_plan(model: onnx.ModelProto, target: Precision, plan_path: Path | None,
               keep: Sequence[str]) -> PrecisionPlan:
    """The plan to emulate: a plan file, or everything in ``target``; then ``keep`` in FP32.

    ``keep`` entries match node names exactly, or op types (``LayerNormalization``).

    Raises:
        PlanError: A ``keep`` entry matches no node or op type, or the plan file is invalid.
    """
    plan = PrecisionPlan.load(plan_path) if plan_path else PrecisionPlan(target)
    names = select_nodes(model, keep, "--keep")
    if names:
        plan = plan.keep_fp32(names, "user", "--keep")
    plan.validate(model)
    return plan


def run_diagnose(model_path: Path, *, data: str | None, preprocess: str | None, target: str,
                 runner: str, candidate_model: Path | None, plan_path: Path | None,
                 keep: Sequence[str], tolerances: Sequence[str], max_samples: int | None,
                 layerwise: bool, noise: bool, budget_bytes: int, json_path: Path | None,
                 html_path: Path | None, force: bool, console: Console, quiet: bool = False,
                 verbose: bool = False, stress: bool = False) -> DiagnosisReport:
    """Load everything, diagnose, render, and write the requested reports.

    Raises:
        PrecisionDoctorError: Any user-facing problem (bad model, data, plan, runner, file).
    """
    check_writable([json_path, html_path], force)
    precision = parse_precision(target)
    model = load_model(model_path)
    if data is None:
        raise InputError("--data is required: an image folder (with --preprocess), .npy/.npz, "
                         "Polygraphy inputs JSON, or random:... for seeded random inputs")
    samples = load_samples(data, input_metadata(model), preprocess, max_samples)
    plan = build_plan(model, precision, plan_path, keep)
    cand_model = load_model(candidate_model) if candidate_model else None
    candidate = candidate_from_spec(runner, plan, model, cand_model)
    with progress_bar(console, enabled=not quiet and console.is_terminal) as progress:
        report = diagnose(model, samples, precision, candidate,
                          parse_tolerances(tolerances, precision), layerwise=layerwise,
                          noise=noise, budget_bytes=budget_bytes, model_path=str(model_path),
                          progress=progress, stress=stress)
    if quiet:
        console.print(f"{report.verdict.upper()}: {model_path} in {report.target.upper()}",
                      markup=False)
    else:
        render_diagnosis(report, console, layers=30 if verbose else 12)
    if json_path:
        write_json(json_path, report.to_dict(), force)
        if not quiet:
            console.print(f"JSON report: {json_path}", markup=False)
    if html_path:
        from precision_doctor.report.html import render_html

        write_text_atomic(html_path, render_html(report, command=invocation()), force)
        if not quiet:
            console.print(f"HTML report: {html_path}", markup=False)
    return report
