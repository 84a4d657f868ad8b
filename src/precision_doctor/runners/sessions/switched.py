"""One open session of the switched emulation (``precision.emulate_switch``) per model, shared by
every ``EmulatorRunner`` of a plan it can express, while a ``sessions()`` scope is open.

On a GPU each new emulation of a plan costs a graph built in Python and a CUDA session, where
running it costs a few milliseconds (``benchmarks/cuda_start.py``). Inside ``sessions()``, on a
CUDA device (``runners.device``), ``EmulatorRunner`` takes the switched session of its model
instead: built once, then every plan is one more feed. On the CPU nothing changes: a session
there opens in milliseconds, and the switched graph's extra ``Where`` per rounded tensor would
slow every run.

``diagnose`` and ``fix`` open the scope (``api``), as do the search's GPU workers; the session
closes when the scope ends or another model takes its place (one at a time: it holds a copy of
the weights in each precision).

On CUDA a signature of input shapes that keeps coming back gets a session of its own
(``ShapeSessions``): ONNX Runtime's CUDA convolution rebuilds its cuDNN plan whenever its input
shape differs from the run before, and the stages and evaluations of a diagnosis feed samples of
several shapes in turn (a search's evaluation walks every batch shape of the calibration set,
the next one starts again). Measured on an H200 (``benchmarks/gpu_switched_runs.py``,
2026-11-26; the switched emulation of PP-OCRv4 rec, 6 strips at 48x320, every run another plan,
the arena given back after each run): 24 ms a run on one shape with cuDNN's exhaustive search
and the 32 MiB workspace cap (250 MiB of GPU memory), 106 ms with its heuristic (2.3 GiB); when
every other run has 2 strips instead, 0.41-0.52 s and 0.13-0.41 s a run. But a session of the
switched graph takes 2.0-3.6 s to open: one per signature from the start (``gpu_pipeline.py
--src``, same machine, diagnose) took PP-OCRv4 rec on 256 strips from 90.9 to 74.6 s (its 198
switched runs 41.8 -> 13.9 s) and det on 3 images from 14.4 to 22.1 s (4 signatures, 12 runs).
So a signature gets its own session only once it has made the shared one re-plan
``REPLANS_FOR_SESSION`` times: 16 re-plans at 0.1-0.4 s cost about what opening a session does.
Where the order of the runs is known in advance the stages avoid re-plans instead
(``runners.batching.run_batched`` groups each signature; ``diagnosis.causes.trials`` runs its
trials shape by shape); a search's evaluations, chosen as it goes, cannot.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.errors import BackendError
from precision_doctor.formats import Precision
from precision_doctor.graph.segments import weight_bytes
from precision_doctor.precision.conv_bias import FUSED
from precision_doctor.precision.emulate_switch import SwitchableEmulation, emulate_switchable
from precision_doctor.runners import device
from precision_doctor.runners.base import TensorMeta
from precision_doctor.runners.ort import OrtRunner

SHAPE_SESSIONS = 4  # sessions of one switched emulation at most, the shared one included ...
SHAPE_SESSIONS_BYTES = 1 << 30  # ... and fewer where their weights would pass 1 GiB together
REPLANS_FOR_SESSION = 16  # re-plans of the shared session before a shape gets its own


class ShapeSessions:
    """Sessions of one model: a shared one, and one of its own for each input-shape signature
    that keeps coming back (module docstring). Runs go to the shared session until a signature
    has made it rebuild its convolution plans ``REPLANS_FOR_SESSION`` times (a run on it after
    a run on another); that signature then gets a session of its own while fewer than
    ``limit`` are open. Every session gives its device arena back after each run
    (``OrtRunner``'s ``arena_shrinkage``: the shared emulation outlives every stage). Offers
    the ``OrtRunner`` methods ``EmulatorRunner`` uses; safe to call from several threads.

    Args:
        model: The model every session runs.
        name: The sessions' label.
        where: Their device. On CUDA the shared session keeps the device's convolution search
            (cuDNN's heuristic: a re-plan costs less); a signature's own session sees one
            shape, searches once, and gets ``device.bounded_workspace``.
        limit: Sessions at most, the shared one included (>= 1; 1 = the shared one only).
    """

    def __init__(self, model: onnx.ModelProto, name: str, where: device.Device,
                 limit: int) -> None:
        self.model, self.name, self.limit = model, name, max(1, limit)
        self.where = where
        self._lock = threading.Lock()
        self._shared: OrtRunner | None = None
        self._shared_last: object = None  # the signature the shared session ran last
        self._replans: dict[object, int] = {}
        self._own: dict[object, OrtRunner] = {}

    def __enter__(self) -> ShapeSessions:
        self._shared = self._open(self.where)  # now: an invalid model fails here, not mid-stage
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            sessions = [self._shared, *self._own.values()]
            self._shared, self._own, self._replans = None, {}, {}
        for runner in sessions:
            if runner is not None:
                runner.__exit__(None, None, None)

    def _open(self, where: device.Device) -> OrtRunner:
        return OrtRunner(self.model, where.providers(), where.provider_options(),
                         name=self.name, arena_shrinkage=True).__enter__()

    def _for(self, feeds: Mapping[str, object]) -> OrtRunner:
        key = tuple(sorted((k, _shape(v)) for k, v in feeds.items()))
        with self._lock:
            if self._shared is None:
                raise BackendError(f"{self.name}: the sessions are closed", runner=self.name)
            own = self._own.get(key)
            if own is not None:
                return own
            if self._shared_last is not None and self._shared_last != key:
                self._replans[key] = self._replans.get(key, 0) + 1
                if self._replans[key] >= REPLANS_FOR_SESSION and \
                        1 + len(self._own) < self.limit:
                    own = self._own[key] = self._open(device.bounded_workspace(self.where))
                    return own
            self._shared_last = key
            return self._shared

    def input_metadata(self) -> list[TensorMeta]:
        shared = self._shared
        if shared is None:
            raise BackendError(f"{self.name}: the sessions are closed", runner=self.name)
        return shared.input_metadata()

    def output_names(self) -> list[str]:
        return [o.name for o in self.model.graph.output]

    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str] | None = None
            ) -> dict[str, np.ndarray]:
        return self._for(feeds).run(feeds, output_names)

    def run_resident(self, feeds: Mapping[str, object],
                     output_names: Sequence[str] | None = None) -> dict[str, object]:
        return self._for(feeds).run_resident(feeds, output_names)

    def sessions(self) -> int:
        """Sessions open now (the shared one included)."""
        with self._lock:
            return (self._shared is not None) + len(self._own)


def _shape(value: object) -> tuple[int, ...]:
    """An array's or an ``onnxruntime.OrtValue``'s shape (``OrtValue.shape`` is a method)."""
    shape = getattr(value, "shape", ())
    return tuple(shape() if callable(shape) else shape)


@dataclass
class _Entry:
    model: onnx.ModelProto  # held so its id() stays its own
    default: Precision
    conv_bias: str
    where: device.Device
    emulation: SwitchableEmulation | None
    runner: ShapeSessions | None


_lock = threading.RLock()
_depth = 0
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
        return _depth > 0 and (where.is_cuda or _on_cpu)


def lookup(model: onnx.ModelProto, default: Precision, conv_bias: str = FUSED
           ) -> tuple[SwitchableEmulation, ShapeSessions] | None:
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
                limit = min(SHAPE_SESSIONS,
                            SHAPE_SESSIONS_BYTES // max(1, weight_bytes(built.model)))
                runner = ShapeSessions(built.model, f"emulate-{default.value}-switched", where,
                                       limit).__enter__()
            e = _entry = _Entry(model, default, conv_bias, where, built, runner)
        if e.emulation is None or e.runner is None:
            return None
        return e.emulation, e.runner


def _close() -> None:
    global _entry
    if _entry is not None and _entry.runner is not None:
        _entry.runner.__exit__(None, None, None)
    _entry = None
