"""Run the samples of one search evaluation, in this process or across a process pool.

On the CPU, ``--jobs N`` starts N worker processes (forked, so each inherits the model, the
samples and the plan -> runner function without pickling them). Per evaluation, samples are
handed out in waves of N in the search's sample order, one sample per worker; each worker keeps
one ONNX Runtime session per plan (opened on its first sample of that plan). Results are
consumed in the sample order, so every decision (pass/fail, which sample stopped an
evaluation, the sample order) is the same for any N; only the work done past a stop within a
wave is wasted. The workers are a ``concurrent.futures.ProcessPoolExecutor``: a worker that
dies (the out-of-memory killer, a crash in the engine) fails the evaluation with a
``BackendError`` that names the device; a ``multiprocessing.Pool`` would replace the worker
and leave the search waiting forever for the sample it was running.

In this process (``jobs`` = 1) the search can say which plan it will most likely evaluate next
(``prepare``): its runner is opened on a thread while the current plan runs. Opening a runner
is Python work (the emulator rewrites the model) and ONNX Runtime session creation, which
releases the GIL; the sample runs release it too, so the two overlap on the second core
instead of taking turns (fix on PP-OCRv4 det: 0.25 s of each ~0.9 s evaluation).

Each worker's session gets ``cores // N`` ONNX Runtime intra-op threads (at least 1) so the
pool does not oversubscribe the cores.

On CUDA (``runners.device``) there is one worker per GPU (``search.devicepool``): an evaluation
is cut into the batches one GPU would run, and the batches are spread over the GPUs.

The decisions are the same for any N as long as the engine's outputs do not depend on its thread
count: measured 2026-11-24 with ONNX Runtime 1.32 CPU, PP-OCRv4 det and rec (plain and emulated
FP16) give bitwise identical outputs with 1 and 2 intra-op threads;
tests/search/test_search_speed.py checks ``jobs=2`` against ``jobs=1`` on a tiny transformer.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Generator, Sequence

from precision_doctor.errors import InputError
from precision_doctor.layerwise.candidates import float32_outputs
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners.base import Runner
from precision_doctor.runners.batching import batches_on, iter_batched, shapes_together
from precision_doctor.runners.device import CPU, Device, pool_devices
from precision_doctor.runners.device import current as current_device
from precision_doctor.search.devicepool import (
    DevicePool,
    OpenPlan,
    end_pool,
    worker_died,
    worker_runner,
)
from precision_doctor.search.shmtransfer import Outputs1

_WORKER: dict = {}  # set in the parent right before the fork; workers read their copy


def usable_cores() -> int:
    """CPU cores this process may run on (``os.sched_getaffinity`` where available)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def resolve_jobs(jobs: int | str, samples: int, device: Device = CPU) -> int:
    """Worker count for ``--jobs``: an integer >= 1, or ``auto`` = usable cores / ONNX Runtime
    threads per worker (1), capped at the number of samples. On CUDA, ``auto`` is 1 (this
    process, whose GPU runs the samples of an evaluation batched): the pool of one worker per
    GPU (``search.devicepool``) took 1.35x the time of one process on 2 H200s (``fix`` of
    PP-OCRv4 rec on 256 strips, 80 vs 59 s, 2026-11-27, BENCHMARKS.md). An explicit
    ``jobs`` > 1 on CUDA asks for that pool: one worker per device of
    ``runners.device.pool_devices`` (every visible GPU for ``cuda``, one for ``cuda:N``), at
    most ``jobs``.

    Raises:
        InputError: Not a positive integer nor ``auto``.
    """
    auto = isinstance(jobs, str) and jobs.strip().lower() == "auto"
    if isinstance(jobs, str) and not auto:
        try:
            jobs = int(jobs)
        except ValueError:
            raise InputError(f"--jobs must be a positive integer or 'auto', not {jobs!r}"
                             ) from None
    if not auto and int(jobs) < 1:
        raise InputError(f"--jobs must be >= 1 (got {jobs})")
    if device.is_cuda:
        if auto:
            return 1
        return max(1, min(len(pool_devices(device, int(jobs))), int(jobs), max(samples, 1)))
    if auto:
        return max(1, min(usable_cores(), samples))
    return min(int(jobs), max(samples, 1))


def _open(open_plan: OpenPlan, plan: PrecisionPlan, threads: int) -> Runner:
    return open_plan(plan, threads) if threads else open_plan(plan)


def _entered(open_plan: OpenPlan, plan: PrecisionPlan) -> Runner:
    runner = _open(open_plan, plan, 0)
    runner.__enter__()
    return runner


def _worker_run(plan: PrecisionPlan, index: int) -> tuple[int, Outputs1]:
    result = worker_runner(_WORKER, plan).run(_WORKER["samples"][index].feeds)
    return index, float32_outputs(result, _WORKER["names"])


class SampleRunner:
    """Runs the samples of an evaluation (``jobs`` = 1: in this process).

    Args:
        open_plan: Plan -> runner (not entered); called as ``open_plan(plan, threads)`` in
            pool workers.
        samples: Calibration samples (``.feeds``).
        names: Output names to collect.
        jobs: Worker processes (1 = none).
        prefetch: Let ``prepare`` open the next plan's runner ahead (``jobs`` = 1 only; two
            runners are then alive at once, so leave it off for models whose weights do not
            fit twice).
        device: Where the workers' sessions run (default: ``runners.device.current()``); on
            CUDA, worker k runs on ``pool_devices(device, jobs)[k]`` and workers are spawned
            (``open_plan`` and the samples must pickle).
    """

    def __init__(self, open_plan: OpenPlan, samples: Sequence, names: Sequence[str],
                 jobs: int = 1, prefetch: bool = False, device: Device | None = None) -> None:
        self.open_plan, self.samples, self.names = open_plan, samples, list(names)
        self.device = device if device is not None else current_device()
        self.devices = pool_devices(self.device, jobs) if self.device.is_cuda else []
        method = "spawn" if self.device.is_cuda else "fork"
        self.jobs = (min(jobs, len(self.devices)) if self.device.is_cuda else jobs) \
            if method in multiprocessing.get_all_start_methods() else 1
        self._pool: ProcessPoolExecutor | None = None
        self._devices: DevicePool | None = None
        self._opener = ThreadPoolExecutor(1) if prefetch and self.jobs <= 1 else None
        self._ahead: tuple[PrecisionPlan, Future] | None = None

    def __enter__(self) -> SampleRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self._drop_ahead()
        if self._opener is not None:
            self._opener.shutdown()
            self._opener = None
        if self._pool is not None:
            end_pool(self._pool)
            self._pool = None
        if self._devices is not None:
            self._devices.close()
            self._devices = None

    def prepare(self, plan: PrecisionPlan) -> None:
        """Start opening ``plan``'s runner on a thread (a hint: ``run`` of another plan
        closes it unused). Does nothing without ``prefetch``."""
        if self._opener is None or (self._ahead is not None and self._ahead[0] == plan):
            return
        self._drop_ahead()
        self._ahead = (plan, self._opener.submit(_entered, self.open_plan, plan))

    def _take_ahead(self, plan: PrecisionPlan) -> Runner | None:
        """The runner opened ahead for ``plan`` (entered), or None."""
        if self._ahead is None or self._ahead[0] != plan:
            self._drop_ahead()
            return None
        job, self._ahead = self._ahead[1], None
        return job.result()  # an error opening it is the evaluation's error

    def _drop_ahead(self) -> None:
        if self._ahead is None:
            return
        job, self._ahead = self._ahead[1], None
        try:
            runner = job.result()
        except Exception:  # noqa: BLE001 - a plan that will not run: its error does not matter
            return
        runner.__exit__(None, None, None)

    def _start(self) -> None:
        _WORKER.clear()
        _WORKER.update(open_plan=self.open_plan, samples=self.samples, names=self.names,
                       threads=max(1, usable_cores() // self.jobs), plan=None, runner=None)
        # with "fork" the executor starts every worker at the first task, before its own
        # thread, so each inherits _WORKER; a worker that dies fails its task (BrokenProcessPool)
        self._pool = ProcessPoolExecutor(self.jobs,
                                         mp_context=multiprocessing.get_context("fork"))

    def run(self, plan: PrecisionPlan, order: Sequence[int]
            ) -> Generator[tuple[int, Outputs1], None, None]:
        """Outputs of ``plan`` on the samples ``order`` names, yielded in that order (batched on
        a GPU: in ``runners.batching.shapes_together`` of it).

        The runner is taken (or opened) when this is called, so a ``prepare`` right after
        concerns the evaluation after this one. Stop iterating to stop the evaluation (with a
        pool, the rest of the current wave of ``jobs`` samples has run already; nothing
        further starts).

        Raises:
            BackendError: A runner fails.
        """
        if self.jobs <= 1:
            return self._run_here(self._take_ahead(plan) or _entered(self.open_plan, plan),
                                  order)
        if self.device.is_cuda:
            if self._devices is None:
                self._devices = DevicePool(self.open_plan, self.samples, self.names,
                                           self.devices[:self.jobs],
                                           max(1, usable_cores() // self.jobs))
            return self._devices.run(plan, order)
        return self._run_pool(plan, order)

    def _run_here(self, runner: Runner, order: Sequence[int]
                  ) -> Generator[tuple[int, Outputs1], None, None]:
        try:
            if batches_on(self.device.is_cuda, getattr(runner, "model", None), len(order)):
                # on a GPU: samples of equal shapes together and in one run (runners.batching);
                # an early stop wastes at most the rest of one batch
                order = shapes_together([s.feeds for s in self.samples], order)
                feeds = [self.samples[i].feeds for i in order]
                for i, result in zip(order, iter_batched(runner, feeds, self.names)):
                    yield i, float32_outputs(result, self.names)
                return
            # an incremental runner (search.incremental) reuses what earlier plans computed
            # for the same sample
            run_sample = getattr(runner, "run_sample", None)
            for i in order:
                feeds = self.samples[i].feeds
                result = run_sample(i, feeds) if run_sample else runner.run(feeds)
                yield i, float32_outputs(result, self.names)
        finally:
            runner.__exit__(None, None, None)

    def _run_pool(self, plan: PrecisionPlan, order: Sequence[int]
                  ) -> Generator[tuple[int, Outputs1], None, None]:
        if self._pool is None:
            self._start()
        pool = self._pool
        assert pool is not None
        order = list(order)
        try:
            for start in range(0, len(order), self.jobs):
                wave = [pool.submit(_worker_run, plan, i)
                        for i in order[start:start + self.jobs]]
                for job in wave:
                    yield job.result()
        except BrokenProcessPool as exc:
            raise worker_died(self.device.label) from exc
