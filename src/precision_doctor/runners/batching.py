"""Several samples in one run, where the model allows it (on a GPU, one run of 32 small samples
costs about what one does: the kernels' launch overhead, not the arithmetic, is the time).

A model allows it when every graph input and output has a symbolic first dimension (exporters
often name them apart: PaddleOCR's det has ``p2o.DynamicDimension.0`` in and ``...3`` out): then
samples whose inputs have the same shapes and dtypes are concatenated along axis 0, run once,
and every output is split back by the samples' own first dimensions. Two checks guard the split,
since a symbol does not prove that axis 0 is the sample axis: every output of a batched run
must have the joined first dimension, and the first batched run is checked against its first
sample run alone (same values within FP32 kernel differences, ``PROBE_RTOL``). Where either
fails, the samples run one at a time from then on. The second check's verdict is kept per model
(``checked``): a search's evaluations or the impact trials batch the same model again and again,
and on a GPU each one-sample check between two batched runs cost two changes of input shape
(PP-OCRv4 rec on 256 strips: 142 of a diagnosis's 157 changes of shape, counted by
``benchmarks/probes/shape_replans.py``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Iterator, Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.runners.base import Runner

# Inputs of one batched run: at most this many bytes and samples (a run's activations grow with
# its batch; 64 MiB of input keeps one run of the models measured well under a GiB).
MAX_BATCH_BYTES = 64 << 20
MAX_BATCH = 64
# The first batched run against its first sample alone: relative L2 of their difference. FP32
# kernels chosen for another batch size differ by ~1e-6 relative; a split along a wrong axis
# differs by O(1).
PROBE_RTOL = 1e-3
CHECKED_MODELS = 8  # verdicts kept, of the models batched last

_lock = threading.Lock()
_checked: OrderedDict[int, tuple[object, bool]] = OrderedDict()  # id -> (model, verdict)


def checked(model: object) -> bool | None:
    """Whether batched runs of ``model`` (a runner's ``.model``) passed the one-sample check
    (True) or failed it (False) in this process; None: not checked yet."""
    with _lock:
        entry = _checked.get(id(model))
        return entry[1] if entry is not None and entry[0] is model else None


def remember(model: object, verdict: bool) -> None:
    """Keep ``model``'s one-sample check verdict (the last ``CHECKED_MODELS`` models)."""
    if model is None:
        return
    with _lock:
        _checked[id(model)] = (model, verdict)
        _checked.move_to_end(id(model))
        while len(_checked) > CHECKED_MODELS:
            _checked.popitem(last=False)


def batch_symbol(model: onnx.ModelProto) -> str | None:
    """The inputs' symbolic first dimension when every graph input and output has a symbolic
    first dimension (the inputs' all the same symbol), or None."""
    inits = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in inits]
    symbols = set()
    for v in [*inputs, *model.graph.output]:
        t = v.type.tensor_type
        if not v.type.HasField("tensor_type") or not t.HasField("shape") or not t.shape.dim:
            return None
        first = t.shape.dim[0]
        if not first.HasField("dim_param") or not first.dim_param:
            return None
        if v in inputs:
            symbols.add(first.dim_param)
    return symbols.pop() if len(symbols) == 1 else None


def batches_on(on_gpu: bool, model: object, count: int) -> bool:
    """Whether ``count`` samples of ``model`` run in batches: on a GPU (where a batched run
    costs about what one sample's does), more than one sample, and a model proto with a batch
    symbol (``batch_symbol``). ``model`` is typically a runner's ``.model`` (None for runners
    without one: not batched)."""
    return (on_gpu and count > 1 and isinstance(model, onnx.ModelProto)
            and batch_symbol(model) is not None)


def groups(feeds: Sequence[Mapping[str, np.ndarray]], max_bytes: int = MAX_BATCH_BYTES,
           max_batch: int = MAX_BATCH) -> list[list[int]]:
    """Consecutive samples whose inputs agree in shape and dtype, within the limits."""
    out: list[list[int]] = []
    key_of = None
    size = 0
    for i, f in enumerate(feeds):
        key = _signature(f)
        nbytes = sum(v.nbytes for v in f.values())
        if (out and key == key_of and len(out[-1]) < max_batch
                and size + nbytes <= max_bytes):
            out[-1].append(i)
            size += nbytes
        else:
            out.append([i])
            key_of, size = key, nbytes
    return out


def _signature(feeds: Mapping[str, np.ndarray]) -> tuple:
    """What samples in one batch share: each input's name, shape after axis 0, dtype, rank."""
    return tuple((k, v.shape[1:], v.dtype.str, v.ndim) for k, v in sorted(feeds.items()))


def shape_order(feeds: Sequence[Mapping[str, np.ndarray]]) -> list[int]:
    """Sample indices with equal input signatures (``groups``) next to each other, the largest
    samples first, in their order otherwise (a stable sort).

    Largest first: a session's memory arena (ONNX Runtime's BFC arena, on the CPU and on CUDA)
    then grows once, for the largest tensors and workspaces, and the smaller ones that follow
    fit in the chunks they free; in increasing order every new size is a new extension. PP-OCRv4
    rec on its 28 crops (4 widths), the FP32 reference on an H200 under cuDNN's heuristic:
    8.1 instead of 10.9 GiB peak (2026-11-27, ``benchmarks/gpu_pipeline.py``).
    """
    return sorted(range(len(feeds)), key=lambda i: (-_size(feeds[i]), _signature(feeds[i])))


def shapes_together(feeds: Sequence[Mapping[str, np.ndarray]], order: Sequence[int]
                    ) -> list[int]:
    """``order`` with the samples of each input signature together, the signatures in the order
    of their first sample in ``order``, each signature's samples in their order there.

    For a search's evaluation on a GPU, whose ``order`` puts the samples most likely to fail
    first (for its early stop): the first sample keeps its place, and a batched run
    (``iter_batched``) then takes every sample of its shape at once instead of changing shape
    at most samples, each change a new cuDNN plan in every convolution
    (``runners.sessions.switched``). An evaluation that fails on its first sample still stops
    after one run.

    Args:
        feeds: One feed dict per sample.
        order: Indices into ``feeds``.
    """
    first: dict[tuple, int] = {}
    for rank, i in enumerate(order):
        first.setdefault(_signature(feeds[i]), rank)
    return sorted(order, key=lambda i: first[_signature(feeds[i])])


def _size(feeds: Mapping[str, np.ndarray]) -> int:
    """Elements of one sample (all inputs), without its batch dimension."""
    return sum(int(np.prod(v.shape[1:], dtype=np.int64)) for v in feeds.values())


def run_batched(runner: Runner, feeds: Sequence[Mapping[str, np.ndarray]],
                names: Sequence[str] | None = None) -> list[dict[str, np.ndarray]]:
    """``runner.run`` of every sample, with samples grouped into batched runs.

    The samples run in ``shape_order``, so that every input signature is one group (within
    the limits of ``groups``) however the samples alternate: fewer runs, and fewer changes of
    input shape, each of which makes ONNX Runtime's CUDA convolutions build their cuDNN plans
    again (``runners.sessions.switched``; PP-OCRv4 rec's 28 real crops, 4 widths in an order of
    their own: 5 runs a pass instead of 7, the first batch's one-sample check included, and in
    a GPU diagnosis 68 instead of 96 runs of the switched emulation after a change of shape,
    counted by ``benchmarks/probes/shape_replans.py``).

    Args:
        runner: An entered runner of a model with a batch symbol (``batch_symbol``).
        feeds: One feed dict per sample; every input has a first dimension.
        names: Outputs to keep (default: all the run returns).

    Returns:
        One output dict per sample, in the order of ``feeds``, as ``runner.run(feeds[i])``
        would give (up to the rounding of batched kernels).
    """
    order = shape_order(feeds)
    out: list[dict[str, np.ndarray]] = [{} for _ in feeds]
    for i, result in zip(order, iter_batched(runner, [feeds[i] for i in order], names)):
        out[i] = result
    return out


def iter_batched(runner: Runner, feeds: Sequence[Mapping[str, np.ndarray]],
                 names: Sequence[str] | None = None) -> Iterator[dict[str, np.ndarray]]:
    """``run_batched`` yielding each sample's outputs in order, one batch run at a time
    (a consumer that stops early, like the search's early stop, runs no further batch)."""
    model = getattr(runner, "model", None)
    verdict = checked(model)
    batching, probed = verdict is not False, verdict is True
    for group in groups(feeds):
        if len(group) == 1 or not batching:
            for i in group:
                yield _keep(runner.run(feeds[i]), names)
            continue
        split = run_checked(runner, [feeds[i] for i in group], names, model, probed)
        probed = True
        if split is None:  # axis 0 is not the sample axis: one at a time from now on
            batching = False
            for i in group:
                yield _keep(runner.run(feeds[i]), names)
            continue
        yield from split


def run_group(runner: Runner, feeds: Sequence[Mapping[str, np.ndarray]],
              names: Sequence[str] | None = None) -> list[dict[str, np.ndarray]] | None:
    """One run of ``feeds`` (one group of ``groups``) joined along axis 0, split back per
    sample; None when an output does not have the joined first dimension (axis 0 is not the
    sample axis). Unchecked otherwise: ``iter_batched`` also compares its first batch with
    its first sample alone (``same``)."""
    rows = [int(next(iter(f.values())).shape[0]) for f in feeds]
    joined = {k: np.concatenate([f[k] for f in feeds]) for k in feeds[0]}
    out = _keep(runner.run(joined), names)
    if not all(np.ndim(v) > 0 and np.shape(v)[0] == sum(rows) for v in out.values()):
        return None
    edges = np.cumsum([0, *rows])
    return [{k: v[edges[j]:edges[j + 1]] for k, v in out.items()} for j in range(len(feeds))]


def run_checked(runner: Runner, feeds: Sequence[Mapping[str, np.ndarray]],
                names: Sequence[str] | None, model: object, probed: bool
                ) -> list[dict[str, np.ndarray]] | None:
    """``run_group`` of ``feeds`` (two or more samples); unless ``probed``, its first sample is
    also run alone and compared (``same``), and the verdict kept for ``model`` (``remember``).
    None: axis 0 is not the sample axis."""
    split = run_group(runner, feeds, names)
    if split is not None and not probed:
        alone = _keep(runner.run(feeds[0]), names)
        if not same(alone, split[0]):
            split = None
        remember(model, split is not None)
    return split


def same(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    """Whether two runs' outputs agree (shapes; floats within ``PROBE_RTOL`` relative L2)."""
    for k, x in a.items():
        y = b.get(k)
        if y is None or np.shape(x) != np.shape(y):
            return False
        x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
        if np.asarray(x).dtype.kind != "f":
            if not np.array_equal(x64, y64):
                return False
            continue
        if not (np.isfinite(x64).all() and np.isfinite(y64).all()):
            if not np.array_equal(np.isnan(x64), np.isnan(y64)):
                return False
            continue
        if float(np.linalg.norm(x64 - y64)) > PROBE_RTOL * max(float(np.linalg.norm(x64)), 1e-30):
            return False
    return True


def _keep(result: Mapping[str, np.ndarray], names: Sequence[str] | None
          ) -> dict[str, np.ndarray]:
    return dict(result) if names is None else {n: result[n] for n in names}
