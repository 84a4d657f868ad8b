"""The fix workflow behind the CLI: search, write the model, plan, recipes and reports."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from rich.console import Console

from precision_doctor.api.fixing import fix, sidecar_paths
from precision_doctor.api.options import invocation
from precision_doctor.api.pytorch import cli_model, is_module_spec
from precision_doctor.repair.result import FixResult
from precision_doctor.report.files import check_writable
from precision_doctor.report.terminal.fix import render_fix, resources_line
from precision_doctor.report.terminal.progress import progress_bar
from precision_doctor.report.terminal.sources import fix_lines
from precision_doctor.workflows.collect import collect_section


def run_fix(model_path: Path, output: Path, *, data: str, preprocess: str | None, target: str,
            tolerances: Sequence[str], metric: str | None, threshold: float | None,
            keep: Sequence[str], force_low: Sequence[str], no_rewrites: bool,
            keep_io_types: bool, runner: str, max_samples: int | None, max_evals: int,
            html_path: Path | None, force: bool, console: Console, quiet: bool = False,
            jobs: int | str = 1, device: str = "auto", labels: Path | None = None,
            engine: str | None = None, holdout: int | None = None) -> FixResult:
    """Run ``fix`` and write the fixed model, its plan, recipes and reports.

    Raises:
        OutputPathError: An output cannot be written (or is the input model): checked before
            the model is loaded, nothing is written.
        PrecisionDoctorError: Any user-facing problem; nothing is written then.
        TargetNotMetError: The target cannot be met even in FP32 (nothing is written).
        InputError: ``jobs`` is neither a positive integer nor ``auto``.
    """
    side = sidecar_paths(output)
    if is_module_spec(model_path):  # Fix.save writes the autocast recipe too
        side["torch"] = Path(f"{Path(output).with_suffix('')}.torch.py")
    check_writable([output, *side.values(), html_path], force, inputs=[model_path, data])
    model, samples = cli_model(model_path, data)  # a file, or package.module:factory
    with progress_bar(console, enabled=not quiet and console.is_terminal) as progress:
        fixed = fix(model, samples, target=target, preprocess=preprocess,
                    tolerance=list(tolerances), metric=metric, threshold=threshold, keep=keep,
                    force_low=force_low, rewrites=not no_rewrites, keep_io_types=keep_io_types,
                    runner=runner, max_samples=max_samples, max_evals=max_evals, jobs=jobs,
                    device=device, progress=progress, quiet=progress is None, labels=labels,
                    engine=engine, holdout=holdout)
    from precision_doctor.formats import Precision

    # the TensorRT collect commands name an ONNX file: none for a module
    extra = "" if is_module_spec(model_path) else collect_section(
        Path(model_path), output, data, preprocess, fixed.samples, Precision.parse(target),
        max_samples, fixed.source)
    fixed.save(output, force=force, extra_recipes=extra)
    if html_path:
        fixed.to_html(html_path, force=force, command=invocation())
    result = fixed.result
    assert result is not None
    if not quiet:
        render_fix(result, console)
        for line in fix_lines(result, fixed.report.get("torch"), console.width):
            console.print(line, markup=False)  # by module; the PyTorch recipe (graph.source)
        note = fixed.report.get("device", {}).get("note")
        if note:
            console.print(note, markup=False, style="yellow")
        for name, path in [("model", output), *side.items()] + (
                [("html", html_path)] if html_path else []):
            console.print(f"{name}: {path}", markup=False)
    else:
        console.print(f"{result.verdict.upper()}: wrote {output} "
                      f"({resources_line(result.resources)})", markup=False)
    return result
