"""The pool of one spawned worker per GPU (``search.devicepool``): an evaluation's batches spread
over the devices, consumed in the search's order, and no batch started past an early stop but
those already in flight (tested with fake devices: CI has no GPU)."""

import os
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from tiny_models import relu_batch

from precision_doctor.formats import Precision
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners import device as dev
from precision_doctor.runners.base import TensorMeta
from precision_doctor.runners.fake import FakeRunner
from precision_doctor.search.devicepool import batches
from precision_doctor.search.evalpool import SampleRunner


@pytest.fixture
def two_fake_gpus(monkeypatch):
    monkeypatch.setattr(dev, "_probe", (2, ""))


def feeds_of(widths):
    return [{"x": np.full((1, w), i, np.float32)} for i, w in enumerate(widths)]


def test_batches_are_what_one_gpu_runs_in_the_order_they_are_consumed():
    feeds = feeds_of([4, 8, 4, 8, 4, 2])
    order = [3, 0, 5, 1, 4, 2]
    # the first sample's shape (8 wide) first, then 4 (sample 0 is next), then 2
    assert batches(feeds, order, batched=True) == [[3, 1], [0, 4, 2], [5]]
    assert batches(feeds, order, batched=False) == [[3], [0], [5], [1], [4], [2]]
    many = feeds_of([4] * 70)  # batching.MAX_BATCH = 64 samples a run
    assert [len(b) for b in batches(many, list(range(70)), True)] == [64, 6]


class LoggedRelu:
    """A picklable plan -> runner whose model batches (``relu_batch``); each run appends
    ``pid device rows`` to ``log`` and takes ``delay`` seconds."""

    def __init__(self, log: Path, delay: float = 0.0) -> None:
        self.model, self.log, self.delay = relu_batch(), log, delay

    def __call__(self, plan: PrecisionPlan, threads: int = 0) -> FakeRunner:
        where, log, delay = dev.current(), self.log, self.delay

        def fn(feeds):
            x = feeds["x"]
            with open(log, "a") as f:
                f.write(f"{os.getpid()} {where.ordinal} {x.shape[0]}\n")
            time.sleep(delay)
            return {"y": np.maximum(x, 0)}
        runner = FakeRunner([TensorMeta("x", np.dtype(np.float32), ("batch", "n"))], ["y"], fn)
        runner.model = self.model  # type: ignore[attr-defined]
        return runner


def logged(log: Path) -> list[tuple[int, int, int]]:
    if not log.exists():
        return []
    return [tuple(int(v) for v in line.split()) for line in log.read_text().splitlines()]


def test_two_gpus_run_an_evaluations_batches_and_keep_the_search_order(two_fake_gpus, tmp_path):
    log = tmp_path / "runs.txt"
    samples = [SimpleNamespace(feeds=f) for f in feeds_of([4, 8, 4, 8, 4, 8, 2, 2])]
    order = [1, 0, 6, 3, 2, 5, 4, 7]
    plan = PrecisionPlan(Precision.FP16)
    with SampleRunner(LoggedRelu(log), samples, ["y"], jobs=2,
                      device=dev.Device("cuda")) as runner:
        assert runner.jobs == 2
        got = list(runner.run(plan, order))
    # the order one GPU would run: each shape's samples together, from the first sample's
    assert [i for i, _ in got] == [1, 3, 5, 0, 2, 4, 6, 7]
    for i, out in got:
        np.testing.assert_array_equal(out["y"], samples[i].feeds["x"])
    runs = logged(log)
    batched = sorted(rows for _, _, rows in runs if rows > 1)
    assert batched == [2, 3, 3]  # one run per shape (plus one worker's one-sample check)
    workers = {pid: ordinal for pid, ordinal, _ in runs}
    assert os.getpid() not in workers and sorted(workers.values()) == [0, 1]


def test_an_early_stop_starts_no_further_batch(two_fake_gpus, tmp_path):
    """One batch per worker is in flight: a search that stops after the first batch has run
    it and the second (on the other worker), nothing else."""
    log = tmp_path / "runs.txt"
    samples = [SimpleNamespace(feeds=f) for f in feeds_of([2, 3, 4, 5, 6, 7, 8, 9])]
    plan = PrecisionPlan(Precision.FP16)
    with SampleRunner(LoggedRelu(log, delay=0.2), samples, ["y"], jobs=2,
                      device=dev.Device("cuda")) as runner:
        first = runner.run(plan, list(range(8)))  # 8 shapes: 8 runs of one sample
        assert next(first)[0] == 0
        first.close()
        after = runner.run(plan, [7])
        assert [i for i, _ in after] == [7]
    assert len(logged(log)) == 3  # samples 0 and 1, then the next evaluation's 7


def test_outputs_travel_through_one_reused_shared_memory_block():
    from precision_doctor.search.shmtransfer import WorkerBlock, take

    block = WorkerBlock()
    batch = [(3, {"y": np.arange(12, dtype=np.float32).reshape(3, 4),
                  "ids": np.array([1, 2], np.int64)}),
             (1, {"y": np.zeros((0, 4), np.float32), "ids": np.array([7], np.int64)})]
    packed = block.put(batch)
    assert isinstance(packed[0], str)  # a block name, not the arrays
    got = take(packed)
    assert [i for i, _ in got] == [3, 1]
    for (_, a), (_, b) in zip(batch, got):
        for k in a:
            assert a[k].dtype == b[k].dtype
            np.testing.assert_array_equal(a[k], b[k])
    name = packed[0]
    assert block.put(batch)[0] == name  # the same block again
    big = [(0, {"y": np.ones((1 << 19,), np.float32)})] * 3  # 6 MiB: a larger block
    assert take(block.put(big))[2][1]["y"].sum() == 1 << 19
    odd = [(0, {"s": np.array(["a"], object)})]
    assert block.put(odd) is odd  # not a plain array: pickled through the pipe
    block.release()
    assert not os.path.exists(f"/dev/shm/{name}")


def test_without_room_in_dev_shm_a_batch_goes_through_the_pipe(monkeypatch):
    """A container's /dev/shm (64 MB by default in Docker) may not hold a batch: a block
    larger than its room would kill the writer with SIGBUS, so the batch is pickled."""
    from precision_doctor.search import shmtransfer

    monkeypatch.setattr(shmtransfer, "_room", lambda nbytes: False)
    batch = [(0, {"y": np.ones((4, 4), np.float32)})]
    block = shmtransfer.WorkerBlock()
    assert block.put(batch) is batch
    assert shmtransfer.take(batch) is batch
    block.release()


def test_the_pool_removes_its_workers_blocks(two_fake_gpus, tmp_path):
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm on this system")
    def blocks():
        return {n for n in os.listdir(shm) if n.startswith("psm_")}  # SharedMemory's names

    before = blocks()
    samples = [SimpleNamespace(feeds=f) for f in feeds_of([4, 4, 8, 8])]
    with SampleRunner(LoggedRelu(tmp_path / "log"), samples, ["y"], jobs=2,
                      device=dev.Device("cuda")) as runner:
        got = dict(runner.run(PrecisionPlan(Precision.FP16), [0, 2, 1, 3]))
        assert len(got) == 4
        assert blocks() - before  # the workers' blocks
    assert not blocks() - before


class DyingRelu(LoggedRelu):
    """As LoggedRelu, but the worker process ends abruptly (no exception) on a sample of
    value 3: what a driver crash or the out-of-memory killer does."""

    def __call__(self, plan: PrecisionPlan, threads: int = 0) -> FakeRunner:
        runner = super().__call__(plan, threads)
        fn = runner._fn

        def dying(feeds):
            if (feeds["x"] == 3).any():
                os._exit(3)
            return fn(feeds)
        runner._fn = dying
        return runner


def test_a_worker_that_dies_is_a_clear_error_not_a_hang(two_fake_gpus, tmp_path):
    from precision_doctor.errors import BackendError

    samples = [SimpleNamespace(feeds=f) for f in feeds_of([2, 3, 4, 5, 6])]
    with SampleRunner(DyingRelu(tmp_path / "log"), samples, ["y"], jobs=2,
                      device=dev.Device("cuda")) as runner:
        with pytest.raises(BackendError, match="cuda:1.*ended") as info:
            list(runner.run(PrecisionPlan(Precision.FP16), range(5)))
        assert "--jobs 1" in str(info.value)


def test_a_cpu_worker_that_dies_is_a_clear_error_not_a_hang(tmp_path):
    """The forked CPU pool (--jobs N on the CPU): the out-of-memory killer ending a worker
    fails the evaluation instead of leaving the search waiting forever."""
    from precision_doctor.errors import BackendError

    samples = [SimpleNamespace(feeds=f) for f in feeds_of([2, 3, 4, 5, 6])]
    with SampleRunner(DyingRelu(tmp_path / "log"), samples, ["y"], jobs=2,
                      device=dev.CPU) as runner:
        assert runner.jobs == 2
        with pytest.raises(BackendError, match="ended abruptly") as info:
            list(runner.run(PrecisionPlan(Precision.FP16), range(5)))
        assert "--jobs 1" in str(info.value)
