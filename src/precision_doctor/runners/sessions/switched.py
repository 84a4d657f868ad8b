"""One open session of the switched emulation (``precision.emulate_switch``) per model, shared by
every ``EmulatorRunner`` of a plan it can express, while a ``sessions()`` scope is open.

On a GPU each new emulation of a plan costs a graph built in Python and a CUDA session, where
running it costs a few milliseconds (``benchmarks/probes/cuda_start.py``). Inside ``sessions()``,
on a CUDA device (``runners.device``), ``EmulatorRunner`` takes the switched session of its model
instead: built once, then every plan is one more feed. On the CPU nothing changes: a session there
opens in milliseconds, and the switched graph's extra ``Where`` per rounded tensor would slow every
run.

``diagnose`` and ``fix`` open the scope (``api``), as do the search's GPU workers; the session
closes when the scope ends or another model takes its place (one at a time: it holds a copy of
the weights in each precision).
On CUDA every change of input shape between two runs of the session makes ONNX Runtime's
convolutions build their cuDNN plans again (0.1-0.4 s a run against 24-106 ms on an unchanged
shape, PP-OCRv4 rec on an H200, ``benchmarks/probes/gpu_switched_runs.py``), so its callers run it
shape by shape (``runners.batching.run_batched``, ``diagnosis.causes.trials``, and a search's
evaluations through ``runners.batching.shapes_together``). One session per input shape was measured
and not kept: opening one takes 2.0-3.6 s (3520 nodes for rec); on rec's 28 crops and on det that
cost more than the re-plans it saved, and on rec's 256 strips what it saved came from the batch
checks now done once per model (H200, 2026-11-26, ``benchmarks/gpu_pipeline.py``). Under cuDNN's
exhaustive search (``runners.device``) a re-plan costs 0.4-1.0 s; a search's evaluations still
change shape once per shape they run (``fix`` of rec on its 28 crops: 123 switched runs instead of
179, 116.2 -> 98.3 s on an H200, 2026-11-27,
``benchmarks/results/gpu_pipeline_2026-11-27_2xh200_rec_fix_00db82a.json``).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import onnx

from precision_doctor.formats import Precision
from precision_doctor.precision.conv_bias import FUSED
from precision_doctor.precision.emulate_switch import SwitchableEmulation, emulate_switchable
from precision_doctor.runners import device
from precision_doctor.runners.ort import OrtRunner


@dataclass
class _Entry:
    model: onnx.ModelProto  # held so its id() stays its own
    default: Precision
    conv_bias: str
    where: device.Device
    emulation: SwitchableEmulation | None
    runner: OrtRunner | None


_lock = threading.RLock()
_depth = 0
_paused = 0
_on_cpu = False
_entry: _Entry | None = None


@contextmanager
def sessions(on_cpu: bool = False) -> Iterator[None]:
    """Allow ``EmulatorRunner`` to share switched sessions until the scope ends (nested
    scopes share the outermost's). ``on_cpu``: on the CPU too (tests, measurements)."""
    global _depth, _on_cpu
    with _lock:
        _depth += 1
        _on_cpu = _on_cpu or on_cpu
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _on_cpu = False
                _close()


def serves(where: device.Device) -> bool:
    """Whether an ``EmulatorRunner`` on ``where`` now takes switched sessions."""
    with _lock:
        return _depth > 0 and _paused == 0 and (where.is_cuda or _on_cpu)


@contextmanager
def one_plan() -> Iterator[None]:
    """Inside, ``EmulatorRunner`` builds the emulation of its own plan, as outside
    ``sessions()``, and the open switched session stays open for the runs after.

    For a stage that runs one plan of another model (marked outputs, a rewritten graph) a few
    times: opening a switched session for it takes 2-3 s on a GPU (PP-OCRv4 rec, H200), the
    per-plan emulation's session 0.2 s, and the new switched session would close the one the
    later stages share. Visible from every thread, like ``sessions()``.
    """
    global _paused
    with _lock:
        _paused += 1
    try:
        yield
    finally:
        with _lock:
            _paused -= 1


def lookup(model: onnx.ModelProto, default: Precision, conv_bias: str = FUSED
           ) -> tuple[SwitchableEmulation, OrtRunner] | None:
    """The open switched session of ``model`` on the current device, built on first use;
    None outside a ``sessions()`` scope, on the CPU, or when the model is not switchable.

    Raises:
        UnsupportedModelError: Shape inference of the model failed.
        BackendError: ONNX Runtime rejects the switched emulation model.
    """
    global _entry
    where = device.current()
    with _lock:
        if not serves(where):
            return None
        e = _entry
        if e is None or e.model is not model or e.default is not default \
                or e.conv_bias != conv_bias or e.where != where:
            _close()
            built = emulate_switchable(model, default, conv_bias)
            runner = None
            if built is not None:
                # it lives through every stage: between runs it keeps no activations
                runner = OrtRunner(built.model, name=f"emulate-{default.value}-switched",
                                   arena_shrinkage=True)
                runner.__enter__()
            e = _entry = _Entry(model, default, conv_bias, where, built, runner)
        if e.emulation is None or e.runner is None:
            return None
        return e.emulation, e.runner


def _close() -> None:
    global _entry
    if _entry is not None and _entry.runner is not None:
        _entry.runner.__exit__(None, None, None)
    _entry = None
