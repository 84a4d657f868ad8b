"""Shared fixtures: the location of ../shared (tests that need it skip cleanly without it), the
real-model runs several test files check (one run per model and options for the whole test
run), and what keeps the suite correct and fast under pytest-xdist (``-n auto``), where each
worker process runs some of the tests:

* a test module's ``RNG = np.random.default_rng(seed)`` restarts for every test from its state
  right after import, so a test draws the same numbers whichever tests ran before it in its
  process (``_same_module_rng_in_every_test``);
* ONNX Runtime sessions do not spin (``session.intra_op.allow_spinning`` = 0): by default its
  worker threads busy-wait after each run, taking the cores the other workers need (on the
  2-core machine, loaded, 2026-11-28: the six-crop recognizer diagnosis took 10.0-10.2 CPU-s
  spinning and 7.7-8.0 without);
* a session whose options leave the thread count to ONNX Runtime runs on one intra-op thread:
  each worker already keeps a core busy, and a second thread per session only adds hand-offs
  (two recognizer diagnoses at once on the 2-core machine, 2026-11-28: 21-22 CPU-s each with
  one thread, 23-25 with ONNX Runtime's default of two). The numbers do not change: ONNX
  Runtime 1.32 CPU gives bitwise identical outputs with 1 and 2 threads for PP-OCRv4
  det/rec/cls and the six zoo models, FP32 and their FP16/BF16 emulations (27 of 27), and the
  default count is the machine's core count anyway. Counts set explicitly are kept;
* a real-model run that tests in several files check is computed once per test run: the first
  worker to need it computes it and leaves it pickled for the others (``_once_per_run``;
  ``--dist loadgroup`` cannot group them: pytest-xdist 3.8 renames ``item._nodeid``, which
  pytest 9 no longer reads).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

import numpy as np
import pytest

# ../shared next to the checkout; PRECISION_DOCTOR_SHARED overrides it (e.g. from a git worktree).
SHARED = Path(os.environ.get("PRECISION_DOCTOR_SHARED")
              or Path(__file__).resolve().parents[1].parent / "shared")
_SPIN_KEY = "session.intra_op.allow_spinning"
_RNG_STATES: dict[str, dict[str, Any]] = {}
T = TypeVar("T")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # a pytest-xdist worker
        _sessions_share_the_cores()


# The tests that take longest (seconds each on the 2-core machine), run first in this order:
# ``--dist worksteal`` hands each worker a contiguous block and lets a worker that runs out take
# the untouched tail of another's, so a long test that starts last keeps one core busy alone
# while the other idles. A module named whole keeps its module fixtures on one worker.
SLOW_FIRST = (
    "tests/acceptance/test_fix_real_models.py::test_fix_det_gives_the_ocr_client_identical_boxes",
    "tests/acceptance/test_diagnose_real_models.py::test_rec_decision_flips_on_the_paddleocr_crops",
    "tests/cli/test_demo.py::test_quick_demo_diagnoses_fail_and_fixes_pass",
    "tests/acceptance/test_quantized.py",
    "tests/acceptance/test_real_detectors.py",
    "tests/acceptance/test_truth_zoo.py",
    "tests/acceptance/test_recorded_det.py",
    "tests/acceptance/test_api_real_models.py",
    "tests/acceptance/test_diagnose_real_models.py",
    "tests/acceptance/test_fix_real_models.py",
    "tests/acceptance/test_metric_matrix.py",
    "tests/api/test_pytorch.py::test_a_scaled_layernorm_of_bert_gets_its_line_and_a_bf16_recipe_"
    "that_meets_it",
    "tests/api/test_pytorch.py::test_bert_layernorm_maps_to_the_transformers_line",
    "tests/api/test_pytorch.py::test_diagnose_a_module_fails_fp16_and_names_the_python_line",
    "tests/api/test_torch_recipe.py::test_compare_autocast_says_which_causes_autocast_avoids",
    "tests/graph/test_torch_export.py::test_export_gives_the_model_feeds_and_dynamic_axes",
    "tests/fuzz/test_invariants.py::test_written_model_emulates_its_plan",
    "tests/fuzz/test_invariants.py::test_data_dependent_shapes_are_reported_and_kept",
    "tests/forensics/test_forensics_synthetic.py::test_names_the_mismatch",
    "tests/forensics/test_forensics_real.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``SLOW_FIRST``'s tests move to the front, in its order (a stable sort: the same order in
    every xdist worker, as xdist requires)."""

    def rank(item: pytest.Item) -> int:
        nodeid = item.nodeid
        for i, prefix in enumerate(SLOW_FIRST):
            if nodeid == prefix or nodeid.startswith((prefix + "::", prefix + "[")):
                return i
        return len(SLOW_FIRST)

    items.sort(key=rank)


def _sessions_share_the_cores() -> None:
    """Every ``onnxruntime.InferenceSession`` of this process is created with spinning off,
    unless its options set the key themselves, and with one intra-op thread, unless its
    options set a count."""
    import onnxruntime as ort

    cls = ort.InferenceSession
    if getattr(cls.__init__, "_no_spin", False):
        return
    original = cls.__init__

    def __init__(self, path_or_bytes, sess_options=None, providers=None,
                 provider_options=None, **kwargs):
        options = sess_options if sess_options is not None else ort.SessionOptions()
        if not options.intra_op_num_threads:
            options.intra_op_num_threads = 1
        try:
            options.get_session_config_entry(_SPIN_KEY)
        except RuntimeError:  # not set by the caller
            options.add_session_config_entry(_SPIN_KEY, "0")
        original(self, path_or_bytes, options, providers, provider_options, **kwargs)

    __init__._no_spin = True  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def _same_module_rng_in_every_test(request: pytest.FixtureRequest) -> None:
    """Reset the test module's ``RNG`` (a ``numpy.random.Generator``) to its state after
    import: the state the module's first test sees in any process."""
    rng = getattr(request.module, "RNG", None)
    if isinstance(rng, np.random.Generator):
        state = _RNG_STATES.setdefault(request.module.__name__, rng.bit_generator.state)
        rng.bit_generator.state = state


@pytest.fixture
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared is not present")
    return SHARED


@pytest.fixture(scope="session")
def shared_root() -> Path:
    """``shared_dir`` for session fixtures."""
    if not SHARED.is_dir():
        pytest.skip("../shared is not present")
    return SHARED


def _once_per_run(factory: pytest.TempPathFactory, name: str, make: Callable[[], T]) -> T:
    """``make()``, computed once for the whole test run.

    Without pytest-xdist it is just called (the session fixture caches it). Under xdist the
    first worker to ask computes it under an exclusive lock (``fcntl.flock``) and pickles it to
    ``NAME.pickle`` in the run's temporary folder (the parent of every worker's ``basetemp``);
    the others wait for the lock and read the pickle. When ``make`` raises (a skip), nothing is
    written and the next worker tries again.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return make()
    import fcntl
    import pickle

    root = factory.getbasetemp().parent
    path = root / f"{name}.pickle"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if path.is_file():
                return pickle.loads(path.read_bytes())
            value = make()
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(pickle.dumps(value))
            tmp.replace(path)
            return value
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# PP-OCRv4 model -> (data folder under data/ocr, --preprocess) of ``cli_diagnose_at_80_columns``
CLI_REAL_MODELS = {"det": ("full_images", "ppocr-det:resize=max-side,side=480"),
                   "rec": ("rec_crops/paddleocr", "ppocr-rec")}


@dataclass(frozen=True)
class CliRun:
    """One ``precision-doctor diagnose`` run through the CLI (typer's ``CliRunner``).

    Attributes:
        exit_code: The command's exit code.
        output: What it printed (stdout and stderr).
        report: Its ``--json`` report, or None when none was written.
        diagnosis: The ``Diagnosis`` that ``pd.diagnose`` returned to the CLI, or None.
    """

    exit_code: int
    output: str
    report: dict | None
    diagnosis: Any


def _cli_diagnose(root: Path, folder: Path, model: str) -> dict[str, Any]:
    """``diagnose MODEL --data DATA --preprocess P --max-samples 6 --no-noise --json`` with
    ``COLUMNS=80``; the ``Diagnosis`` is taken on its way from ``pd.diagnose`` to the CLI's
    renderer (a wrapper that calls the real function and keeps what it returns). Returns
    ``CliRun``'s fields (a dict pickles without importing this module by name)."""
    import json

    from rich.console import Console
    from typer.testing import CliRunner

    from precision_doctor import cli
    from precision_doctor.workflows import diagnose as workflow

    data, preprocess = CLI_REAL_MODELS[model]
    real, seen = workflow.diagnose, []

    def keep(*args: Any, **kwargs: Any) -> Any:
        seen.append(real(*args, **kwargs))
        return seen[-1]

    out = folder / "r.json"
    with pytest.MonkeyPatch.context() as mp:
        # a Console created without COLUMNS reads it at every print (rich Console.size)
        mp.delenv("COLUMNS", raising=False)
        mp.setattr(cli, "console", Console())
        mp.setattr(workflow, "diagnose", keep)
        res = CliRunner().invoke(cli.app, [
            "diagnose", str(root / f"models/ppocrv4/{model}.onnx"), "--data",
            str(root / "data/ocr" / data), "--preprocess", preprocess, "--max-samples", "6",
            "--no-noise", "--json", str(out)], env={"COLUMNS": "80"})
    report = json.loads(out.read_text()) if out.is_file() else None
    return {"exit_code": res.exit_code, "output": res.output, "report": report,
            "diagnosis": seen[0] if seen else None}


@pytest.fixture(scope="session")
def cli_diagnose_at_80_columns(shared_root: Path, tmp_path_factory: pytest.TempPathFactory
                               ) -> Callable[[str], CliRun]:
    """``get("det")`` / ``get("rec")``: the CLI's FP16 diagnosis of that PP-OCRv4 model on its
    real inputs (``CLI_REAL_MODELS``; det: the 3 full images at max side 480, rec: the first 6
    PaddleOCR crops), without the noise floor, at 80 columns (a ``CliRun``; shared, do not
    modify)."""
    runs: dict[str, CliRun] = {}

    def get(model: str) -> CliRun:
        if model not in runs:
            fields = _once_per_run(tmp_path_factory, f"cli_diagnose_{model}", lambda: _cli_diagnose(
                shared_root, tmp_path_factory.mktemp(f"cli_{model}"), model))
            runs[model] = CliRun(**fields)
        return runs[model]

    return get


@pytest.fixture(scope="session")
def rec_fp16_on_six_crops(cli_diagnose_at_80_columns: Callable[[str], CliRun]):
    """``pd.diagnose`` of the PP-OCRv4 recognizer in FP16 on the first six PaddleOCR crops,
    without the noise floor, as the CLI called it (a ``Diagnosis``; shared, do not modify)."""
    run = cli_diagnose_at_80_columns("rec")
    assert run.diagnosis is not None, run.output
    return run.diagnosis


@pytest.fixture(scope="session")
def det_fp16_at_480(cli_diagnose_at_80_columns: Callable[[str], CliRun]):
    """``pd.diagnose`` of the PP-OCRv4 detector in FP16 on the 3 full images at max side 480,
    without the noise floor, as the CLI called it (a ``Diagnosis``; shared, do not modify)."""
    run = cli_diagnose_at_80_columns("det")
    assert run.diagnosis is not None, run.output
    return run.diagnosis


@pytest.fixture(scope="session")
def det_fix_mask_iou_480(shared_root: Path, tmp_path_factory: pytest.TempPathFactory):
    """``pd.fix`` of the PP-OCRv4 detector for FP16 against mask IoU (threshold 0.3) >= 0.99 on
    two full images at max side 480 (a ``Fix``; shared: its model is only read, ``save`` may
    be called)."""
    import precision_doctor as pd

    return _once_per_run(tmp_path_factory, "det_fix_mask_iou_480", lambda: pd.fix(
        shared_root / "models/ppocrv4/det.onnx", shared_root / "data/ocr/full_images",
        preprocess="ppocr-det:resize=max-side,side=480", metric="mask-iou:threshold=0.3",
        threshold=0.99, max_samples=2, quiet=True))
