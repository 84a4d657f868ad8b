"""The INT8/FP8 workflows behind ``diagnose``/``fix --target int8|fp8``: run, render, write."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from rich.console import Console

from precision_doctor.api.pytorch import cli_model
from precision_doctor.api.quantizing import (
    QuantizedDiagnosis,
    QuantizedFix,
    diagnose_quantized,
    fix_quantized,
)
from precision_doctor.errors import InputError
from precision_doctor.report.files import check_writable, write_json
from precision_doctor.report.terminal.progress import progress_bar
from precision_doctor.report.terminal.quant import render_quant_diagnosis, render_quant_fix


def run_quant_diagnose(model_path: Path, *, data: str | None, preprocess: str | None,
                       target: str, tolerances: Sequence[str], max_samples: int | None,
                       json_path: Path | None, force: bool, console: Console,
                       quiet: bool = False, verbose: bool = False, calibrator: str = "max",
                       html_path: Path | None = None,
                       calibration_data: str | None = None) -> QuantizedDiagnosis:
    """Diagnose quantization, print the answer, write the JSON report.

    Raises:
        InputError: No ``--data``; ``--html`` (the quantized report is terminal and JSON).
        PrecisionDoctorError: Any user-facing problem (bad model, data, file).
    """
    check_writable([json_path], force, inputs=[model_path, data, calibration_data])
    if data is None:
        raise InputError("--data is required: the evaluation samples (an image "
                         "folder with --preprocess, .npy/.npz, Polygraphy inputs JSON)")
    if html_path is not None:
        raise InputError(f"--html is not available for --target {target} yet: use --json")
    with progress_bar(console, enabled=not quiet and console.is_terminal) as progress:
        report = diagnose_quantized(*cli_model(model_path, data), target=target,
                                          preprocess=preprocess, tolerance=list(tolerances),
                                          calibrator=calibrator, max_samples=max_samples,
                                          progress=progress, quiet=progress is None,
                                          calibration=calibration_data)
    if quiet:
        console.print(f"{report.verdict.upper()}: {model_path} in {target.upper()}",
                      markup=False)
    else:
        render_quant_diagnosis(report.result, console, layers=30 if verbose else 10)
    if json_path:
        write_json(json_path, report.to_dict(), force)
        if not quiet:
            console.print(f"JSON report: {json_path}", markup=False)
    return report


def run_quant_fix(model_path: Path, output: Path, *, data: str, preprocess: str | None,
                  target: str, tolerances: Sequence[str], metric: str | None,
                  threshold: float | None, no_rewrites: bool, max_samples: int | None,
                  max_evals: int, force: bool, console: Console, quiet: bool = False,
                  calibrator: str = "max", holdout: int | None = None,
                  calibration_data: str | None = None) -> QuantizedFix:
    """Run the quantized fix and write the Q/DQ model, its report and recipes.

    Raises:
        OutputPathError: An output cannot be written (checked before any work).
        TargetNotMetError: Not even every layer in FP16 meets the target.
        PrecisionDoctorError: Any user-facing problem; nothing is written then.
    """
    stem = Path(output).with_suffix("")
    side = [Path(f"{stem}.report.json"), Path(f"{stem}.recipes.md")]
    check_writable([output, *side], force, inputs=[model_path, data, calibration_data])
    with progress_bar(console, enabled=not quiet and console.is_terminal) as progress:
        fixed = fix_quantized(*cli_model(model_path, data), target=target, preprocess=preprocess,
                                    tolerance=list(tolerances), metric=metric,
                                    threshold=threshold, calibrator=calibrator,
                                    rewrites=not no_rewrites, max_samples=max_samples,
                                    max_evals=min(max_evals, 150), progress=progress,
                                    quiet=progress is None, holdout=holdout,
                                    calibration=calibration_data)
    paths = fixed.save(output, force=force)
    if quiet:
        console.print(f"{fixed.report['verdict'].upper()}: wrote {output}", markup=False)
    else:
        render_quant_fix(fixed.result, console, fixed.report.get("holdout"))
        for p in paths:
            console.print(f"wrote {p}", markup=False)
    return fixed
