"""The ``precision-doctor`` command line: parse -> call the public API -> render.

Exit codes: 0 = pass, 1 = fail (the model does not meet the target), 2 = usage or input error.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from precision_doctor import __version__
from precision_doctor.errors import PrecisionDoctorError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Does your ONNX model survive FP16/BF16/TF32? Where and why does it "
                       "break, and which mixed-precision model meets your accuracy target?")
console = Console()
err_console = Console(stderr=True)


def _fail(exc: PrecisionDoctorError) -> None:
    err_console.print(f"error: {exc}", highlight=False, markup=False, style="red")
    raise typer.Exit(2)


def _version(value: bool) -> None:
    if value:
        console.print(f"precision-doctor {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the version and exit.")) -> None:
    """precision-doctor."""


@app.command()
def diagnose(
    model: Path = typer.Argument(..., help="The FP32 ONNX model."),
    data: Optional[str] = typer.Option(None, "--data", "-d", help="Images folder/glob, .npy, "
                                       ".npz, folder of arrays, Polygraphy inputs JSON, or "
                                       "random:seed=0,low=-1,high=1,count=2,shape=x:1x3x224x224"),
    preprocess: Optional[str] = typer.Option(None, "--preprocess", "-p", help="Image "
                                             "preprocessing: preset (imagenet, ppocr-det, "
                                             "ppocr-rec, ppocr-cls, none) and/or key=value "
                                             "overrides"),
    target: str = typer.Option("fp16", "--target", "-t", help="fp16, bf16 or tf32 (fp32 to "
                               "compare two FP32 engines)"),
    runner: str = typer.Option("emulate", "--runner", "-r", help="emulate, or an ONNX Runtime "
                               "spec: ort:cuda,tf32=0 | ort:tensorrt,fp16=1 | ort:cpu"),
    candidate_model: Optional[Path] = typer.Option(None, "--candidate-model", help="For ort "
                                                   "runners: run this model (e.g. the output "
                                                   "of fix) instead of MODEL"),
    plan: Optional[Path] = typer.Option(None, "--plan", help="Precision plan JSON for the "
                                        "emulator (default: every node in --target)"),
    keep: List[str] = typer.Option([], "--keep", help="Node name or op type to keep in FP32 "
                                   "(repeatable)"),
    tolerance: List[str] = typer.Option([], "--tolerance", help="rel_l2=1e-2,atol=..,rtol=..,"
                                        "statistic=p99 ; prefix OUTPUT: for one output"),
    max_samples: Optional[int] = typer.Option(None, "--max-samples", help="Use at most N "
                                              "samples"),
    layerwise: bool = typer.Option(True, "--layerwise/--no-layerwise", help="Compare every "
                                   "intermediate tensor"),
    noise: bool = typer.Option(True, "--noise/--no-noise", help="Measure the FP32 noise floor"),
    budget_mb: int = typer.Option(2048, "--budget-mb", help="Memory budget of one layerwise "
                                  "chunk (MiB)"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the JSON report here"),
    html_path: Optional[Path] = typer.Option(None, "--html", help="Write the HTML report here"),
    force: bool = typer.Option(False, "--force", help="Overwrite existing report files"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only the verdict line"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Longer tables"),
) -> None:
    """Diagnose MODEL in reduced precision against its FP32 reference, layer by layer."""
    from precision_doctor.workflows.diagnose import run_diagnose

    try:
        report = run_diagnose(
            model, data=data, preprocess=preprocess, target=target, runner=runner,
            candidate_model=candidate_model, plan_path=plan, keep=keep, tolerances=tolerance,
            max_samples=max_samples, layerwise=layerwise, noise=noise,
            budget_bytes=budget_mb << 20, json_path=json_path, html_path=html_path,
            force=force, console=console, quiet=quiet, verbose=verbose)
    except PrecisionDoctorError as exc:
        _fail(exc)
    raise typer.Exit(0 if report.passed else 1)


def run() -> None:  # pragma: no cover - console entry point helper
    """Entry point that never prints a bare traceback for user errors."""
    try:
        app()
    except PrecisionDoctorError as exc:
        err_console.print(f"error: {exc}", style="red", markup=False)
        sys.exit(2)
