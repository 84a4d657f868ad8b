"""The diagnose workflow behind the CLI: files and option text in, a rendered report out."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from rich.console import Console

from precision_doctor.api.diagnosing import diagnose
from precision_doctor.api.options import invocation
from precision_doctor.api.pytorch import cli_model
from precision_doctor.api.results import Diagnosis
from precision_doctor.compare.tasks.accuracy import accuracy_line
from precision_doctor.errors import InputError
from precision_doctor.report.files import check_writable, write_json, write_text_atomic
from precision_doctor.report.terminal.diagnosis import render_diagnosis
from precision_doctor.report.terminal.progress import progress_bar


def run_diagnose(model_path: Path, *, data: str | None, preprocess: str | None, target: str,
                 runner: str, candidate_model: Path | None, plan_path: Path | None,
                 keep: Sequence[str], tolerances: Sequence[str], max_samples: int | None,
                 layerwise: bool, noise: bool, budget_bytes: int, json_path: Path | None,
                 html_path: Path | None, force: bool, console: Console, quiet: bool = False,
                 verbose: bool = False, candidate_results: str | None = None,
                 candidate_log: Path | None = None,
                 stress: bool = False, device: str = "auto",
                 labels: Path | None = None, engine: str | None = None) -> Diagnosis:
    """Load everything, diagnose, render, and write the requested reports.

    Raises:
        PrecisionDoctorError: Any user-facing problem (bad model, data, plan, runner, file).
    """
    recorded = candidate_results.split(":")[0] if candidate_results else None  # FILE[:RUNNER]
    check_writable([json_path, html_path], force, inputs=[
        model_path, candidate_model, plan_path, data, candidate_log, recorded])
    if data is None:
        raise InputError("--data is required: an image folder (with --preprocess), .npy/.npz, "
                         "Polygraphy inputs JSON, or random:... for seeded random inputs")
    if candidate_results and (runner != "emulate" or candidate_model):
        raise InputError("--candidate-results is the candidate: drop --runner/--candidate-"
                         "model (the emulator of --target/--plan/--keep is the cross-check)")
    if candidate_log and not candidate_results:
        raise InputError("--candidate-log goes with --candidate-results")
    model, samples = cli_model(model_path, data)  # a file, or package.module:factory
    with progress_bar(console, enabled=not quiet and console.is_terminal) as progress:
        report = diagnose(model, samples, target=target, preprocess=preprocess, runner=runner,
                          tolerance=list(tolerances), layerwise=layerwise, noise=noise,
                          keep=keep, plan=plan_path, candidate_model=candidate_model,
                          max_samples=max_samples, budget_mb=budget_bytes >> 20,
                          progress=progress, quiet=progress is None,
                          candidate_results=candidate_results,
                          candidate_log=candidate_log, stress=stress, device=device,
                          labels=labels, engine=engine)
    if quiet:
        console.print(f"{report.verdict.upper()}: {model_path} in {report.target.upper()}",
                      markup=False)
    else:
        render_diagnosis(report, console, layers=30 if verbose else 12)
        if report.accuracy:
            console.print(f"Accuracy against labels: {accuracy_line(report.accuracy)}",
                          markup=False)
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
