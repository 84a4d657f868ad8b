"""GPU memory while a block runs, for the GPU benchmarks (``gpu_pipeline.py``,
``bigmodel_gpu.py``): ``GpuMemory``, the peak above the level before it, polled with NVML, and
``MemoryTrace``, the same with a trace of what was used when. Without NVML (``pynvml``) both
read nothing and report 0."""

from __future__ import annotations

import threading
import time


class GpuMemory:
    """Peak used memory of every visible GPU (NVML, polled every ``interval`` seconds) while a
    block runs, above the level before it; ``mib`` is GPU 0's, ``per_device_mib`` each
    GPU's."""

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._read = None
        try:
            import pynvml
            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                       for i in range(pynvml.nvmlDeviceGetCount())]
            self._read = lambda: [pynvml.nvmlDeviceGetMemoryInfo(h).used for h in handles]
        except Exception:  # noqa: BLE001 - no GPU: nothing to measure
            pass

    def __enter__(self) -> GpuMemory:
        if self._read is not None:
            self.base = self.read_now = self._read()
            self.peak = list(self.base)
            self._t = threading.Thread(target=self._poll, daemon=True)
            self._t.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample(self._read())

    def _sample(self, used: list[int]) -> None:
        self.peak = [max(a, b) for a, b in zip(self.peak, used)]

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._read is not None:
            self._t.join()

    @property
    def per_device_mib(self) -> list[float] | None:
        if self._read is None:
            return None
        return [(p - b) / 2**20 for p, b in zip(self.peak, self.base)]

    @property
    def mib(self) -> float | None:
        per = self.per_device_mib
        return per[0] if per else None


class MemoryTrace(GpuMemory):
    """``GpuMemory`` that also keeps GPU 0's used memory over time (every change of 16 MiB
    or more; in the calling process) and when each progress stage (``reference``,
    ``candidate``, ``layerwise``, ``search``, ``attribution``) was first and last reported:
    the peak is placed in time and by the last stage reported before it (stages without
    progress, e.g. the noise floor or the impact trials, show as the gap after the stage
    before them; ``timings_s`` gives their lengths). ``after_mib``: the level once the call
    returned and Python's garbage was collected (the CUDA context and libraries that stay:
    what no setting of this package can free)."""

    def __init__(self) -> None:
        super().__init__()
        self.marks: dict[str, list[float]] = {}
        self.series: list[tuple[float, float]] = []
        self.after_mib: float | None = None

    def stage(self, name: str, done: int, total: int) -> None:
        now = time.perf_counter() - self.t0
        mark = self.marks.setdefault(name, [now, now])
        mark[1] = now

    def __enter__(self) -> MemoryTrace:
        self.t0 = time.perf_counter()
        super().__enter__()
        return self

    def _sample(self, used: list[int]) -> None:
        super()._sample(used)
        mib = (used[0] - self.base[0]) / 2**20
        if not self.series or abs(mib - self.series[-1][1]) >= 16:
            self.series.append((round(time.perf_counter() - self.t0, 3), round(mib)))

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        if self._read is not None:
            import gc
            gc.collect()
            time.sleep(0.1)
            self.after_mib = round((self._read()[0] - self.base[0]) / 2**20)

    def summary(self) -> dict | None:
        if self._read is None or not self.series:
            return None
        at, peak = max(self.series, key=lambda p: p[1])
        before = [(v[0], k) for k, v in self.marks.items() if v[0] <= at]
        return {"peak_mib": peak, "peak_at_s": at,
                "peak_after_stage": max(before)[1] if before else "start",
                "after_mib": self.after_mib,
                "marks_s": {k: [round(a, 2), round(b, 2)] for k, (a, b) in self.marks.items()},
                "series": self.series[:: max(1, len(self.series) // 400)]}
