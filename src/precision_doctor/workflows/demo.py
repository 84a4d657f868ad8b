"""``precision-doctor demo``: diagnose and fix a real model on real photos, no user files needed.

The model is the PP-OCRv4 text detector shipped inside the ``rapidocr_onnxruntime`` 1.4.4 wheel
(``rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx``, Apache-2.0); the images are the
two text photos bundled in the scikit-image wheel (``skimage.data.text()``, a photo of a
painted text sign, and ``skimage.data.page()``, a scanned book page). Both come from the
``precision-doctor[demo]`` extra, so the demo runs offline once installed.

Steps (the library API, no subprocess): write the photos as RGB PNGs to ``OUT/inputs/``;
``diagnose`` the detector in emulated FP16 (expected: FAIL, with the root cause named); ``fix``
it against the detector's own task metric (mask IoU of the binarised probability map, every
sample >= 0.99) and write a mixed-precision model; print a short summary.

Files written under ``OUT`` (never overwritten without ``force``)::

    inputs/text.png, inputs/page.png
    diagnosis.json, diagnosis.html
    det_fp16.onnx (+ .plan.json, .recipes.md, .report.json, .rewritten-fp32.onnx), fix.html
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image
from rich.console import Console
from rich.markup import escape

from precision_doctor.diagnosis.report import DiagnosisReport
from precision_doctor.errors import BackendUnavailable
from precision_doctor.layerwise.compare import LAYERWISE_BUDGET
from precision_doctor.numbers import fmt3, fmt_vs
from precision_doctor.repair.result import FixResult
from precision_doctor.report.files import check_writable, write_bytes_atomic
from precision_doctor.report.terminal.fix import applied_rewrites
from precision_doctor.workflows.diagnose import run_diagnose
from precision_doctor.workflows.fix import run_fix, sidecar_paths

INSTALL_HINT = 'pip install "precision-doctor[demo]"'
# The same file (sha256 identical) ships in rapidocr_onnxruntime 1.4.4 (Python < 3.13) and in
# its successor rapidocr 2.x/3.x (Python >= 3.13 too): either package provides the demo model.
MODEL_PACKAGES = ("rapidocr_onnxruntime", "rapidocr")
MODEL_FILE = "models/ch_PP-OCRv4_det_infer.onnx"

# RapidOCR's own detection preprocessing (inputs/preprocess.py "ppocr-det": min side 736,
# multiples of 32) enlarges the 172x448 / 191x384 photos to 736x1920 / 736x1472, as RapidOCR
# would; the whole demo takes ~1.5 min on 2 CPU cores.
FULL_PREPROCESS = "ppocr-det"
# --quick (tests): the photos shrunk to max side 320 (~10 s), no noise floor.
QUICK_PREPROCESS = "ppocr-det:resize=max-side,side=320"
METRIC = "mask-iou:threshold=0.3"  # DB detector: RapidOCR config.yaml Det thresh 0.3
THRESHOLD = 0.99  # every sample's mask IoU vs the FP32 mask must stay >= 0.99


@dataclass(frozen=True)
class DemoImage:
    """One bundled photo: its file name under ``inputs/`` and the scikit-image loader name."""

    file: str
    loader: str
    description: str


DEMO_IMAGES = (
    DemoImage("text.png", "text", "photo of a painted text sign (skimage.data.text)"),
    DemoImage("page.png", "page", "scanned book page (skimage.data.page)"),
)


def _missing(what: str) -> BackendUnavailable:
    return BackendUnavailable(f"the demo needs {what}, which is not installed: run "
                              f"{INSTALL_HINT}", backend="demo")


def find_demo_model() -> Path:
    """Locate the PP-OCRv4 det model inside an installed RapidOCR wheel.

    The packages (``MODEL_PACKAGES``, in order) are located with ``importlib.util.find_spec``
    and not imported: importing them imports OpenCV, which needs system libraries (libGL) that
    the demo does not.

    Returns:
        Path of ``<package>/models/ch_PP-OCRv4_det_infer.onnx``.

    Raises:
        BackendUnavailable: No package holds the model file (with the install hint).
    """
    found = []
    for name in MODEL_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        found.append(name)
        for folder in spec.submodule_search_locations:
            path = Path(folder) / MODEL_FILE
            if path.is_file():
                return path
    if found:
        raise BackendUnavailable(
            f"{' and '.join(found)} installed but without {MODEL_FILE} (another version?): "
            f"run {INSTALL_HINT} to get the pinned one", backend="demo")
    raise _missing(f"{MODEL_PACKAGES[0]} (it ships the PP-OCRv4 text detector)")


def load_demo_images() -> dict[str, np.ndarray]:
    """The bundled scikit-image photos as uint8 RGB arrays (HxWx3), keyed by file name.

    ``skimage.data.text()`` and ``page()`` read PNGs shipped in the scikit-image wheel
    (``skimage/data/text.png``, ``page.png``); nothing is downloaded.

    Raises:
        BackendUnavailable: scikit-image is not installed (with the install hint).
    """
    if importlib.util.find_spec("skimage") is None:
        raise _missing("scikit-image (it ships the demo photos)")
    try:
        data = importlib.import_module("skimage.data")
    except ImportError as exc:
        raise _missing(f"a working scikit-image ({exc})") from None
    images = {}
    for item in DEMO_IMAGES:
        pixels = np.asarray(getattr(data, item.loader)())
        images[item.file] = np.asarray(Image.fromarray(pixels).convert("RGB"))
    return images


def demo_paths(out_dir: Path) -> dict[str, Path]:
    """Every file the demo writes, by role (``inputs/<name>`` for each photo)."""
    paths = {f"inputs/{i.file}": out_dir / "inputs" / i.file for i in DEMO_IMAGES}
    paths.update(diagnosis_json=out_dir / "diagnosis.json",
                 diagnosis_html=out_dir / "diagnosis.html",
                 model=out_dir / "det_fp16.onnx")
    paths.update({f"model {k}": v for k, v in sidecar_paths(paths["model"]).items()})
    paths["fix_html"] = out_dir / "fix.html"
    return paths


def _png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def run_demo(out_dir: Path, console: Console, force: bool = False, quick: bool = False,
             clock: Callable[[], float] = time.perf_counter) -> int:
    """Diagnose and fix the PP-OCRv4 text detector in FP16 on bundled photos.

    Args:
        out_dir: Folder for the inputs, reports and fixed model (created with its missing
            parent folders).
        console: Where the progress, the reports and the summary are printed.
        force: Overwrite files of an earlier demo run.
        quick: Photos shrunk to max side 320 and no noise floor (~10 s; for tests).
        clock: Seconds counter for the timings in the summary.

    Returns:
        0 when the demo showed what it should (diagnosis FAIL, fix PASS), else 1.

    Raises:
        BackendUnavailable: The ``demo`` extra is not installed (message: the pip command).
        OutputExistsError: A demo file exists and ``force`` is False (checked before any work).
        OutputPathError: ``out_dir`` cannot be written (checked before any work).
        PrecisionDoctorError: Any other problem of the diagnose or fix workflows.
    """
    paths = demo_paths(out_dir)
    check_writable(paths.values(), force, folders=[out_dir])
    model = find_demo_model()
    images = load_demo_images()
    (out_dir / "inputs").mkdir(parents=True, exist_ok=True)
    for item in DEMO_IMAGES:
        write_bytes_atomic(paths[f"inputs/{item.file}"], _png(images[item.file]), force)
    preprocess = QUICK_PREPROCESS if quick else FULL_PREPROCESS
    inputs = out_dir / "inputs"
    console.print(f"[bold]precision-doctor demo[/]: PP-OCRv4 text detector ({escape(str(model))})"
                  f" on {len(DEMO_IMAGES)} photos, target FP16\n")
    console.rule("1/2  diagnose: does it survive FP16, and if not, why?")
    start = clock()
    report = run_diagnose(model, data=str(inputs), preprocess=preprocess, target="fp16",
                          runner="emulate", candidate_model=None, plan_path=None, keep=[],
                          tolerances=[], max_samples=None, layerwise=True, noise=not quick,
                          budget_bytes=LAYERWISE_BUDGET, json_path=paths["diagnosis_json"],
                          html_path=paths["diagnosis_html"], force=force, console=console)
    diagnosed = clock()
    console.rule(f"2/2  fix: keep the fewest nodes in FP32 so {METRIC} >= {THRESHOLD}")
    result = run_fix(model, paths["model"], data=str(inputs), preprocess=preprocess,
                     target="fp16", tolerances=[], metric=METRIC, threshold=THRESHOLD, keep=[],
                     force_low=[], no_rewrites=False, keep_io_types=True, runner="emulate",
                     max_samples=None, max_evals=60, html_path=paths["fix_html"], force=force,
                     console=console)
    fixed = clock()
    render_summary(report, result, paths, out_dir, preprocess, console,
                   {"diagnose": diagnosed - start, "fix": fixed - diagnosed})
    if report.passed or not result.passed:
        console.print("[yellow]unexpected:[/] the demo expects naive FP16 to fail and the fix to "
                      "pass; see the reports above and please report this with your versions")
        return 1
    return 0


def render_summary(report: DiagnosisReport, result: FixResult, paths: dict[str, Path],
                   out_dir: Path, preprocess: str, console: Console,
                   seconds: dict[str, float]) -> None:
    """The closing summary: verdict, root cause, fix, files, and how to run it on your model."""
    console.rule("summary")
    verdict = "[bold red]FAIL[/]" if not report.passed else "[bold green]PASS[/]"
    worst = max(report.outputs, key=lambda o: o.metrics.rel_l2, default=None)
    detail = (f" (output {escape(worst.name)}: rel L2 {fmt3(worst.metrics.rel_l2)}, tolerance "
              f"{fmt3(worst.tolerance.rel_l2)})" if worst else "")
    console.print(f"naive FP16: {verdict}{detail}  [{seconds['diagnose']:.0f} s]")
    cause = next((f for f in report.findings if f.severity == "error"),
                 report.findings[0] if report.findings else None)
    if cause:
        console.print(f"root cause: {escape(cause.summary)} [dim](node {escape(cause.node)}, "
                      f"{escape(cause.op_type)})[/]")
    else:
        console.print("root cause: none found")
    s = result.share
    fixed = "[bold green]PASS[/]" if result.passed else "[bold red]FAIL[/]"
    before, after = (fmt_vs(x.value, THRESHOLD) for x in (result.score_before,
                                                         result.score_after))
    console.print(f"fix: {fixed} against the objective {METRIC} >= {THRESHOLD}: worst sample "
                  f"{before} (original, naive FP16) -> {after} (fixed); "
                  f"{s['fp32_nodes']} of {s['compute_nodes']} "
                  f"compute nodes in FP32 ({s['flops']:.1%} of FLOPs)  "
                  f"[{seconds['fix']:.0f} s]")
    applied = applied_rewrites(result)
    if applied:
        console.print("     numerically safe rewrites applied first: " + ", ".join(
            f"{k} x{v}" for k, v in sorted(applied.items())))
    console.print("files:")
    for path in paths.values():
        if path.exists():
            console.print(f"  {escape(str(path))}")
    console.print(f"\n[bold]open {escape(str(paths['diagnosis_html']))}[/] in a browser "
                  f"(and {escape(str(paths['fix_html']))} for the fixed model)")
    data = escape(str(out_dir / "inputs"))
    console.print(f"\nthe same on your model:\n  precision-doctor diagnose MODEL.onnx --data "
                  f"{data} --preprocess {preprocess} --html report.html\n  precision-doctor fix "
                  f"MODEL.onnx -o fixed.onnx --data {data} --preprocess {preprocess} "
                  f"--metric {METRIC} --threshold {THRESHOLD}", highlight=False)
