"""ONNX Runtime sessions that share the CPU: one memory arena, no spinning worker threads.

Layerwise comparison opens a session per segment and the search one per evaluation; each
new session's first run takes fresh pages from the kernel for every activation it returns
(measured 2026-11-24 on PP-OCRv4 det at 640x640, every tensor an output: the first run takes
170k minor page faults and 0.18 s, the second 0.05 s). Inside ``shared_cpu()`` every CPU
session created by ``OrtRunner`` allocates from one arena registered with the ONNX Runtime
environment (``onnxruntime.create_and_register_allocator`` and the session option
``session.use_env_allocators``, ONNX Runtime's documented way to share an allocator between
sessions), so memory freed by one segment's session is reused by the next: det layerwise
spends 0.55 s instead of 0.87 s in its runs, and peaks lower (BENCHMARKS.md).

When the outermost scope ends, the arena gives its free regions back to the system (a run
with the run option ``memory.enable_memory_arena_shrinkage``); the arena itself lives as long
as the process (ONNX Runtime cannot unregister it from Python).

The sessions also do not spin (``session.intra_op.allow_spinning`` = 0): by default ONNX
Runtime's worker threads busy-wait after each run, taking the cores from whatever runs next:
the statistics threads and the other runner's session in layerwise comparison. On det
layerwise that was 3.0 s of CPU for 1.6 s of wall time, against 1.8 s CPU and 1.2 s wall
without spinning (2 cores, measured 2026-11-24).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import numpy as np

_lock = threading.Lock()
_scopes: list[int] = []  # the open scopes' intra-op thread counts, innermost last
_registered = False
_SHARED_KEY = "session.use_env_allocators"
_SPIN_KEY = "session.intra_op.allow_spinning"
_SHRINK_KEY = "memory.enable_memory_arena_shrinkage"
# kSameAsRequested: the arena grows by what a request needs, not to the next power of two, so
# it stays near the live bytes and can give whole regions back when it shrinks.
_ARENA_CFG = {"arena_extend_strategy": 1}


def active() -> bool:
    """Whether sessions created now should use the shared arena."""
    return bool(_scopes)


def share_in(options) -> None:
    """Make the session built with ``options`` (``onnxruntime.SessionOptions``) allocate its
    CPU memory from the shared arena (registered on first use) and not spin; where the scope
    asks for a thread count and the options leave it to ONNX Runtime (0), set it."""
    global _registered
    import onnxruntime as ort

    with _lock:
        if not _registered:
            info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                                     ort.OrtMemType.DEFAULT)
            ort.create_and_register_allocator(info, ort.OrtArenaCfg(_ARENA_CFG))
            _registered = True
    options.add_session_config_entry(_SHARED_KEY, "1")
    options.add_session_config_entry(_SPIN_KEY, "0")
    if _scopes and _scopes[-1] and not options.intra_op_num_threads:
        options.intra_op_num_threads = _scopes[-1]


@contextmanager
def shared_cpu(intra_op_threads: int = 0) -> Iterator[None]:
    """``OrtRunner`` sessions created inside (any thread) share one CPU arena and do not spin.

    Args:
        intra_op_threads: Threads per session where the runner leaves it to ONNX Runtime
            (0: ONNX Runtime's default, one per core). Layerwise comparison runs two sessions
            at once and gives each half the cores.

    Scopes nest; the outermost one shrinks the arena when it ends. Sessions keep the arena
    they were created with, so a runner may outlive the scope.
    """
    with _lock:
        _scopes.append(intra_op_threads)
    try:
        yield
    finally:
        with _lock:
            _scopes.pop()
            last = not _scopes
        if last and _registered:
            _shrink()


def _shrink() -> None:
    """Give the arena's free regions back: one run of a tiny session on the shared arena
    with the shrinkage run option (ONNX Runtime shrinks after a run, not on demand)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "shrink",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    share_in(options)
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    run = ort.RunOptions()
    run.add_run_config_entry(_SHRINK_KEY, "cpu:0")
    session.run(None, {"x": np.zeros(1, np.float32)}, run)
