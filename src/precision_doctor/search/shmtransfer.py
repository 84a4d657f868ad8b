"""A device worker's outputs back to the search through shared memory instead of a pipe.

``multiprocessing`` returns a task's result pickled through a pipe: the worker serializes, the
parent's result thread reads and unpickles, holding the GIL the search's scoring needs. PP-OCRv4
rec's outputs are ~1 MB a sample (``[1, W/8, 6625]`` float32), 65 MiB a batch of 64: through a
spawned pool's pipe 0.354 s a batch, through this module 0.059 s, on the 2-core development
machine (``benchmarks/probes/pool_transfer.py``, 2026-11-27). On 2 H200s, ``fix`` of rec on 256
strips with ``--jobs 2``: 164 -> 80 s (2026-11-27, ``benchmarks/gpu_pipeline.py``).

Each worker keeps one ``multiprocessing.shared_memory`` block, grown when a batch needs more,
and writes every batch into it. That is safe because a worker is given its next batch only
after the search has taken (copied out) its last one (``search.devicepool``); a batch the
search never takes is simply overwritten. The parent copies the arrays out and detaches at
once, so nothing it keeps points into the block. Where the block cannot be had (no room in
``/dev/shm``, e.g. a container's 64 MB default) or an output is not a plain array, the batch
goes through the pipe as before.
"""

from __future__ import annotations

import os
import sys
from multiprocessing import shared_memory
from typing import Sequence

import numpy as np

Outputs1 = dict[str, np.ndarray]
Batch = list[tuple[int, Outputs1]]
# (block name, [(sample index, [(output, shape, dtype str, offset), ...]), ...])
Packed = tuple[str, list[tuple[int, list[tuple[str, tuple, str, int]]]]]

_ALIGN = 64  # bytes: every array starts on a cache line
_GROW = 1.25  # a new block is this much larger than the batch that needed it
_SHM_DIR = "/dev/shm"


def _attach(name: str) -> shared_memory.SharedMemory:
    if sys.version_info >= (3, 13):  # the creator's resource tracker entry is the only one
        return shared_memory.SharedMemory(name=name, track=False)
    return shared_memory.SharedMemory(name=name)  # pragma: no cover - older Pythons


def _room(nbytes: int) -> bool:
    """Whether ``/dev/shm`` (where it exists) has ``nbytes`` free: a block larger than its
    room is created fine and then kills the writer with SIGBUS."""
    try:
        st = os.statvfs(_SHM_DIR)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return True
    return st.f_bavail * st.f_frsize >= nbytes


class WorkerBlock:
    """A worker's shared-memory block (worker side)."""

    def __init__(self) -> None:
        self._shm: shared_memory.SharedMemory | None = None

    def put(self, batch: Batch) -> Packed | Batch:
        """Write ``batch`` into the block; its layout to send instead, or ``batch`` itself
        where it cannot go there (then it travels pickled)."""
        layout = []
        offset = 0
        for i, outputs in batch:
            entry = []
            for name, value in outputs.items():
                if not isinstance(value, np.ndarray) or value.dtype.hasobject:
                    return batch
                entry.append((name, value.shape, value.dtype.str, offset))
                offset += -(-value.nbytes // _ALIGN) * _ALIGN
            layout.append((i, entry))
        if not self._fit(offset):
            return batch
        assert self._shm is not None
        buf = self._shm.buf
        for (_, outputs), (_, entry) in zip(batch, layout):
            for (name, shape, dtype, start) in entry:
                np.ndarray(shape, np.dtype(dtype), buffer=buf, offset=start)[...] = outputs[name]
        return self._shm.name, layout

    def _fit(self, nbytes: int) -> bool:
        if self._shm is not None and self._shm.size >= nbytes:
            return True
        size = max(1 << 20, int(nbytes * _GROW))
        if not _room(size + (self._shm.size if self._shm is not None else 0)):
            return False
        self.release()
        try:
            self._shm = shared_memory.SharedMemory(create=True, size=size)
        except OSError:  # pragma: no cover - no shared memory here
            return False
        return True

    def release(self) -> None:
        """Remove the block (the worker's last step)."""
        if self._shm is not None:
            self._shm.close()
            self._shm.unlink()
            self._shm = None


def take(result: Packed | Batch) -> Batch:
    """The batch a worker sent (parent side): copied out of its block, or as it came."""
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], str)):
        return result
    name, layout = result
    shm = _attach(name)
    try:
        return [(i, {out: np.ndarray(shape, np.dtype(dtype), buffer=shm.buf, offset=start).copy()
                     for out, shape, dtype, start in entry}) for i, entry in layout]
    finally:
        shm.close()


def nbytes(batch: Sequence[tuple[int, Outputs1]]) -> int:
    """Bytes of a batch's arrays."""
    return sum(int(getattr(v, "nbytes", 0)) for _, outs in batch for v in outs.values())
