"""One worker process per GPU for the samples of a search's evaluations (``--jobs N`` on CUDA).

An evaluation is cut into the batches one GPU would run (``runners.batching``: the samples of
each input shape together, from the shape of the first sample in the search's order, at most
``MAX_BATCH`` samples or ``MAX_BATCH_BYTES`` of input a run). Batch j runs on worker j mod N,
and a worker is given its next batch only when the search has taken its last one: at most one
batch per worker is in flight, so a search that stops (its early stop) wastes at most one
batch per other worker, and nothing queues behind the next evaluation. Results are consumed in
the search's order, batch by batch, so every decision is the one a single GPU would make with
the same batches.

Why not more in flight: most of a search's evaluations fail on their first batch, and the next
one starts with the same sample, so on one GPU the first batch's shape stays planned; a worker
that ran later batches ahead changes shape and back, each change a new cuDNN plan
(``runners.sessions.switched``), and the next evaluation queues behind it. Measured on 2 H200s,
``fix`` of PP-OCRv4 rec on 256 strips (2026-11-27, ``benchmarks/gpu_pipeline.py``; one GPU: 59 s):
every batch handed out at once 186 s, one in flight per worker 164 s, and with the outputs in
shared memory instead of the result pipe (``search.shmtransfer``) 80 s. The pool before, one
sample per task in waves of one per worker, took 231 s. The rest is the 12.8 GB of outputs the
workers copy out and the one parent process that scores them: ``--jobs auto`` on CUDA stays 1
(``search.evalpool.resolve_jobs``).

CUDA cannot be used in a process forked after the parent initialized it, so the workers are
spawned: the plan -> runner function, the samples and the output names are pickled to each
worker once, at its start. Each worker is an executor of one process
(``concurrent.futures.ProcessPoolExecutor``: a worker that dies, a driver crash or the
out-of-memory killer, fails its batch instead of leaving the search waiting forever) on its own
device, with one switched emulation session (``runners.sessions.switched``) for every
plan, and its ONNX Runtime sessions share one CPU arena and do not spin
(``runners.sessions.cpu_arena``, as the in-process search's do), with ``cores // workers``
intra-op threads.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import time
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Generator, Sequence

from precision_doctor.errors import BackendError
from precision_doctor.layerwise.candidates import float32_outputs
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners.base import Runner
from precision_doctor.runners.batching import batches_on, groups, iter_batched, shapes_together
from precision_doctor.runners.device import Device
from precision_doctor.runners.device import use as use_device
from precision_doctor.runners.sessions import switched
from precision_doctor.runners.sessions.cpu_arena import shared_cpu
from precision_doctor.search.shmtransfer import (
    Batch,
    Outputs1,
    Packed,
    WorkerBlock,
    nbytes,
    take,
)

# plan -> a runner of the plan, not entered; in a worker called as ``open_plan(plan, threads)``
# (ONNX Runtime intra-op threads per worker session)
OpenPlan = Callable[..., Runner]

_RELEASE_S = 120  # seconds a worker may take to finish its batch and remove its block
_STATE: dict = {}  # a worker's own: set by _start_worker in each spawned process


def batches(feeds: Sequence, order: Sequence[int], batched: bool) -> list[list[int]]:
    """The runs of one evaluation: sample indices per run, in the order they are consumed.

    Args:
        feeds: One feed dict per sample.
        order: The search's sample order (indices into ``feeds``).
        batched: Whether the model batches (``runners.batching.batches_on``); if not, one
            sample a run, in ``order``.

    Returns:
        ``runners.batching.groups`` of ``shapes_together(feeds, order)`` (what ``iter_batched``
        runs on one GPU), or one index per run.
    """
    if not batched:
        return [[i] for i in order]
    ordered = shapes_together(feeds, order)
    return [[ordered[j] for j in group] for group in groups([feeds[i] for i in ordered])]


def _start_worker(open_plan: OpenPlan, samples: Sequence, names: Sequence[str], device: Device,
                  threads: int) -> None:
    """Initializer of a spawned worker: its state, its device and sessions' scopes for good."""
    _STATE.clear()
    _STATE.update(open_plan=open_plan, samples=samples, names=list(names), threads=threads,
                  plan=None, runner=None, block=WorkerBlock())
    scopes = [use_device(device), shared_cpu(threads), switched.sessions()]
    for scope in scopes:  # kept: they end with the process
        scope.__enter__()
    _STATE["scopes"] = scopes


def worker_runner(state: dict, plan: PrecisionPlan) -> Runner:
    """A pool worker's entered runner of ``plan``: the one it holds (``state["runner"]``), or,
    when the plan changed, a new one from ``state["open_plan"]`` with ``state["threads"]``
    intra-op threads (the previous one closed first: one session per worker)."""
    if state.get("plan") != plan:
        if state.get("runner") is not None:
            state["runner"].__exit__(None, None, None)
            state["runner"] = None
        opener, threads = state["open_plan"], state["threads"]
        state["runner"] = (opener(plan, threads) if threads else opener(plan)).__enter__()
        state["plan"] = plan
    return state["runner"]


def _run_batch(plan: PrecisionPlan, indices: Sequence[int]
               ) -> tuple[Packed | Batch, float, float]:
    """Outputs of ``plan`` on the samples ``indices`` (one batched run where the model
    allows it), in the worker's shared-memory block where they fit (``shmtransfer``), with
    the seconds of the run and of the whole task."""
    t0 = time.perf_counter()
    state = _STATE
    runner, names = worker_runner(state, plan), state["names"]
    feeds = [state["samples"][i].feeds for i in indices]
    t1 = time.perf_counter()
    if batches_on(True, getattr(runner, "model", None), len(feeds)):
        results = list(iter_batched(runner, feeds, names))
    else:
        results = [runner.run(f) for f in feeds]
    run_s = time.perf_counter() - t1
    batch = [(i, float32_outputs(r, names)) for i, r in zip(indices, results)]
    return state["block"].put(batch), run_s, time.perf_counter() - t0


def _release_worker() -> None:
    """A worker's last task: remove its shared-memory block."""
    _STATE["block"].release()


def end_pool(pool: ProcessPoolExecutor) -> None:
    """Stop ``pool`` now: its process is killed, not waited for (``terminate_workers`` from
    Python 3.14; before, the executor's process table)."""
    terminate = getattr(pool, "terminate_workers", None)
    if terminate is not None:  # pragma: no cover - Python >= 3.14
        terminate()
        return
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(timeout=_RELEASE_S)


def worker_died(label: str) -> BackendError:
    """The error for a ``--jobs`` worker process on ``label`` that ended without an answer."""
    return BackendError(f"the --jobs worker on {label} ended abruptly (a crash of the engine "
                        "or the driver, or killed for memory: see the system log); run again "
                        "with --jobs 1 to see the error in this process", device=label)


class DevicePool:
    """Worker processes, one per device, that run an evaluation's batches.

    Args:
        open_plan: Plan -> runner (not entered), called as ``open_plan(plan, threads)``; must
            pickle (a module-level callable object).
        samples: Calibration samples (``.feeds``); must pickle.
        names: Output names to collect.
        devices: One device per worker.
        threads: ONNX Runtime intra-op threads per worker session.
    """

    def __init__(self, open_plan: OpenPlan, samples: Sequence, names: Sequence[str],
                 devices: Sequence[Device], threads: int) -> None:
        self.open_plan, self.samples, self.names = open_plan, samples, list(names)
        self.devices, self.threads = list(devices), threads
        self._pools: list[ProcessPoolExecutor] = []
        # batches, samples, MB back, worker run / task seconds, seconds the search waited
        self.stats = dict(batches=0, samples=0, mb=0.0, run_s=0.0, task_s=0.0, wait_s=0.0)
        model = getattr(open_plan, "model", None)
        self._batched = batches_on(True, model, len(samples))

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._pools = [ProcessPoolExecutor(1, mp_context=ctx, initializer=_start_worker,
                                           initargs=(self.open_plan, self.samples, self.names,
                                                     device, self.threads))
                       for device in self.devices]

    def _submit(self, k: int, fn: Callable, *args: object) -> Future:
        """``fn(*args)`` on worker ``k`` (its process starts on its first task)."""
        try:
            return self._pools[k].submit(fn, *args)
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            self.close()
            label = self.devices[k].label
            raise BackendError(f"--jobs {len(self.devices)} on {label}: the evaluation cannot "
                               f"be sent to a spawned worker ({exc}); use --jobs 1",
                               device=label) from exc
        except BrokenProcessPool as exc:
            raise self._died(k) from exc

    def _died(self, k: int) -> BackendError:
        return worker_died(self.devices[k].label)

    def run(self, plan: PrecisionPlan, order: Sequence[int]
            ) -> Generator[tuple[int, Outputs1], None, None]:
        """``(index, outputs)`` of ``plan`` on the samples of ``order``, batch by batch
        (``batches``); stop iterating to stop: no further batch starts.

        Raises:
            BackendError: A worker's runner fails.
        """
        if not self._pools:
            self._start()
        feeds = [s.feeds for s in self.samples]
        runs = batches(feeds, order, self._batched and len(order) > 1)
        workers = len(self._pools)
        flight = deque((j, self._submit(j, _run_batch, plan, runs[j]))
                       for j in range(min(workers, len(runs))))
        for j in range(len(runs)):
            yield from self._take(*flight.popleft())
            if j + workers < len(runs):  # the search wants more: this worker's next batch
                k = j % workers
                flight.append((k, self._submit(k, _run_batch, plan, runs[j + workers])))

    def _take(self, k: int, task: Future) -> Batch:
        t0 = time.perf_counter()
        try:
            packed, run_s, task_s = task.result()
        except BrokenProcessPool as exc:
            raise self._died(k) from exc
        batch = take(packed)
        stats = self.stats
        stats["wait_s"] += time.perf_counter() - t0
        stats["batches"] += 1
        stats["samples"] += len(batch)
        stats["mb"] += nbytes(batch) / 2**20
        stats["run_s"] += run_s
        stats["task_s"] += task_s
        return batch

    def close(self) -> None:
        """End the workers (their sessions with them) and remove their shared-memory blocks
        (a worker still running a batch the search did not take finishes it first).
        ``PD_POOL_STATS=FILE`` appends ``stats`` to FILE as one JSON line (benchmarks)."""
        released = []
        for pool in self._pools:
            try:
                released.append(pool.submit(_release_worker))
            except Exception:  # noqa: BLE001 - dead, or could not start: nothing to release
                pass
        for job in released:
            try:
                job.result(timeout=_RELEASE_S)
            except Exception:  # noqa: BLE001 - a worker that cannot: its tracker removes it
                pass
        if self._pools and os.environ.get("PD_POOL_STATS"):
            with open(os.environ["PD_POOL_STATS"], "a") as f:
                f.write(json.dumps({"workers": len(self._pools),
                                    **{k: round(v, 3) for k, v in self.stats.items()}}) + "\n")
        for pool in self._pools:
            end_pool(pool)
        self._pools = []
