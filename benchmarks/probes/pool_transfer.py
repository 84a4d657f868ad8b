"""A device worker's batch of outputs back to the parent: the result pipe vs shared memory.

``search.devicepool`` workers return PP-OCRv4 rec outputs of ~1 MB a sample (``[1, W/8, 6625]``
float32): a batch of 64 at W = 320 is 68 MB. This times one spawned ``multiprocessing.Pool(1)``
worker making such a batch and the parent receiving it, (a) pickled through the result pipe,
(b) through the worker's shared-memory block (``search.shmtransfer``: written by the worker,
copied out by the parent). Both include making the arrays; the ratio is printed.

Run: ``python benchmarks/probes/pool_transfer.py [--repeat 10]`` (no GPU needed). 2026-11-27, the
2-core development machine (Python 3.11): pipe 0.354 s a batch of 65 MiB (183 MiB/s), shared
memory 0.059 s (1090 MiB/s): 6.0x.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time

import numpy as np

from precision_doctor.search.shmtransfer import WorkerBlock, take

_BLOCK: list[WorkerBlock] = []


def _batch(width: int) -> list[tuple[int, dict[str, np.ndarray]]]:
    return [(i, {"y": np.full((1, 40, width), i, np.float32)}) for i in range(64)]


def by_pipe(width: int) -> list:
    return _batch(width)


def by_block(width: int):
    if not _BLOCK:
        _BLOCK.append(WorkerBlock())
    return _BLOCK[0].put(_batch(width))


def release() -> None:
    if _BLOCK:
        _BLOCK[0].release()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--width", type=int, default=6625, help="last axis (rec: 6625 classes)")
    args = parser.parse_args()
    mb = 64 * 40 * args.width * 4 / 2**20
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        times = {}
        for name, fn, unpack in (("pipe", by_pipe, lambda r: r), ("shared memory", by_block, take)):
            unpack(pool.apply(fn, (16,)))  # the worker started, the block made
            t0 = time.perf_counter()
            for _ in range(args.repeat):
                got = unpack(pool.apply_async(fn, (args.width,)).get())
                assert len(got) == 64 and got[5][1]["y"][0, 0, 0] == 5
            times[name] = (time.perf_counter() - t0) / args.repeat
            print(f"{name:14s} {times[name]:.3f} s a batch of {mb:.0f} MiB "
                  f"({mb / times[name]:.0f} MiB/s)")
        pool.apply(release)
    print(f"shared memory / pipe: {times['pipe'] / times['shared memory']:.1f}x faster")


if __name__ == "__main__":
    main()
