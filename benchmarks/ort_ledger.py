"""Where a diagnosis spends its ONNX Runtime time, session by session, from every thread.

cProfile sees the main thread only, and the package runs its sessions from worker threads (the
sample pool, the layerwise side thread), so a profile of a GPU diagnosis shows 80% of its time
as a lock wait. This ledger wraps ``precision_doctor.runners.ort.OrtRunner`` at class level in
the measured process: every session's creation (``__enter__``) and every run (``run``,
``run_resident``), with its runner name, the provider, the thread, the input shapes, and the
progress stage reported last. A run is *first* when its session had not yet seen those input
shapes: on CUDA that run carries cuDNN's algorithm choice for every convolution (the
exhaustive search, or the heuristic's workspace allocation) and the lazy loading of kernels.

``benchmarks/gpu_pipeline.py`` installs it when ``PD_ORT_LEDGER`` is set (any value) and puts
``summary()`` in the run's JSON as ``ort_ledger``: per runner name, the sessions opened, their
creation seconds, runs, run seconds, first-run seconds and distinct input shapes, sorted by
total seconds.

``PD_ORT_LEDGER=mem`` also reads GPU 0's used memory (NVML) before and after every run and
session creation; ``memory_top()`` gives the events that left the most memory in use (with
runner, stage, thread and input shapes), as ``ort_memory_top`` in the JSON: where a peak that
the poller sees comes from.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict


class OrtLedger:
    """Session and run events of ``OrtRunner``, from every thread.

    Attributes:
        stage_name: The progress stage reported last (``stage()`` is a progress callback).
    """

    def __init__(self) -> None:
        self.stage_name = "start"
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, str], dict] = defaultdict(lambda: {
            "sessions": 0, "create_s": 0.0, "runs": 0, "run_s": 0.0, "first_runs": 0,
            "first_run_s": 0.0, "shapes": set(), "stages": set()})
        self._seen: dict[int, set] = {}
        self._events: list[dict] = []
        self._nvml = None  # a device handle when memory is recorded

    def stage(self, name: str, done: int, total: int) -> None:
        self.stage_name = name

    def record_memory(self) -> None:
        """Read GPU 0's used memory around every run and session creation (NVML)."""
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml.nvmlDeviceGetHandleByIndex(0)

    def _used_mib(self) -> float | None:
        if self._nvml is None:
            return None
        import pynvml

        return pynvml.nvmlDeviceGetMemoryInfo(self._nvml).used / 2**20

    def _event(self, what: str, runner, shapes, before: float | None) -> None:
        after = self._used_mib()
        if after is None:
            return
        self._events.append({"what": what, "runner": runner.name, "stage": self.stage_name,
                             "thread": threading.current_thread().name,
                             "shapes": [[k, list(v)] for k, v in shapes],
                             "before_mib": round(before or 0.0), "after_mib": round(after)})

    def memory_top(self, count: int = 12, jump_mib: float = 32.0) -> dict:
        """``top``: the ``count`` events with the most memory in use after them, highest
        first; ``jumps``: in time order, every event whose used memory differs from the
        event before it by more than ``jump_mib`` (creations, runs and what came between)."""
        with self._lock:
            events = [dict(e, seq=i) for i, e in enumerate(self._events)]
        jumps, last = [], None
        for e in events:
            if last is None or abs(e["after_mib"] - last) > jump_mib \
                    or abs(e["before_mib"] - last) > jump_mib:
                jumps.append(e)
            last = e["after_mib"]
        return {"top": sorted(events, key=lambda e: -e["after_mib"])[:count], "jumps": jumps}

    def install(self) -> None:
        """Wrap ``OrtRunner.__enter__``, ``run`` and ``run_resident`` (for this process)."""
        try:
            from precision_doctor.layerwise.resident import value_shape
        except ImportError:  # versions before 2026-11-27 (an A/B's "before") name it _shape
            from precision_doctor.layerwise.resident import _shape as value_shape
        from precision_doctor.runners.ort import OrtRunner

        ledger = self
        enter, run, resident = OrtRunner.__enter__, OrtRunner.run, OrtRunner.run_resident

        def key(runner) -> tuple[str, str]:
            provider = runner.providers[0].replace("ExecutionProvider", "")
            return runner.name, provider

        def timed_enter(runner):
            t, before = time.perf_counter(), ledger._used_mib()
            try:
                return enter(runner)
            finally:
                with ledger._lock:
                    ledger._event("create", runner, (), before)
                    row = ledger._rows[key(runner)]
                    row["sessions"] += 1
                    row["create_s"] += time.perf_counter() - t
                    row["stages"].add(ledger.stage_name)
                    ledger._seen[id(runner)] = set()

        def timed(method):
            def wrapper(runner, feeds, *args, **kwargs):
                shapes = tuple(sorted((k, value_shape(v)) for k, v in feeds.items()))
                t, before = time.perf_counter(), ledger._used_mib()
                try:
                    return method(runner, feeds, *args, **kwargs)
                finally:
                    dt = time.perf_counter() - t
                    with ledger._lock:
                        ledger._event(method.__name__, runner, shapes, before)
                        row = ledger._rows[key(runner)]
                        seen = ledger._seen.setdefault(id(runner), set())
                        row["runs"] += 1
                        row["run_s"] += dt
                        row["shapes"].add(shapes)
                        if shapes not in seen:
                            seen.add(shapes)
                            row["first_runs"] += 1
                            row["first_run_s"] += dt
            return wrapper

        OrtRunner.__enter__ = timed_enter
        OrtRunner.run = timed(run)
        OrtRunner.run_resident = timed(resident)

    def summary(self) -> list[dict]:
        """One row per (runner name, provider), costliest first; seconds rounded to ms."""
        rows = []
        with self._lock:
            for (name, provider), r in self._rows.items():
                rows.append({"runner": name, "provider": provider, "sessions": r["sessions"],
                             "create_s": round(r["create_s"], 3), "runs": r["runs"],
                             "run_s": round(r["run_s"], 3), "first_runs": r["first_runs"],
                             "first_run_s": round(r["first_run_s"], 3),
                             "shapes": len(r["shapes"]), "stages": sorted(r["stages"])})
        return sorted(rows, key=lambda r: -(r["create_s"] + r["run_s"]))
