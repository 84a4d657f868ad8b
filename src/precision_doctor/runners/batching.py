"""Several samples in one run, where the model allows it (on a GPU, one run of 32 small samples
costs about what one does: the kernels' launch overhead, not the arithmetic, is the time).

A model allows it when every graph input and output has a symbolic first dimension, the same
symbol everywhere (``batch``, ``N``, ...): then samples whose inputs have the same shapes and
dtypes are concatenated along axis 0, run once, and every output is split back by the samples'
own first dimensions. A run whose outputs do not have the concatenated first dimension is
redone sample by sample, and batching stops for that runner.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.runners.base import Runner

# Inputs of one batched run: at most this many bytes and samples (a run's activations grow with
# its batch; 64 MiB of input keeps one run of the models measured well under a GiB).
MAX_BATCH_BYTES = 64 << 20
MAX_BATCH = 64


def batch_symbol(model: onnx.ModelProto) -> str | None:
    """The symbolic first dimension shared by every graph input and output, or None."""
    inits = {t.name for t in model.graph.initializer}
    values = [v for v in model.graph.input if v.name not in inits] + list(model.graph.output)
    symbols = set()
    for v in values:
        t = v.type.tensor_type
        if not v.type.HasField("tensor_type") or not t.HasField("shape") or not t.shape.dim:
            return None
        first = t.shape.dim[0]
        if not first.HasField("dim_param") or not first.dim_param:
            return None
        symbols.add(first.dim_param)
    return symbols.pop() if len(symbols) == 1 else None


def groups(feeds: Sequence[Mapping[str, np.ndarray]], max_bytes: int = MAX_BATCH_BYTES,
           max_batch: int = MAX_BATCH) -> list[list[int]]:
    """Consecutive samples whose inputs agree in shape and dtype, within the limits."""
    out: list[list[int]] = []
    key_of = None
    size = 0
    for i, f in enumerate(feeds):
        key = tuple((k, v.shape[1:], v.dtype.str, v.ndim) for k, v in sorted(f.items()))
        nbytes = sum(v.nbytes for v in f.values())
        if (out and key == key_of and len(out[-1]) < max_batch
                and size + nbytes <= max_bytes):
            out[-1].append(i)
            size += nbytes
        else:
            out.append([i])
            key_of, size = key, nbytes
    return out


def run_batched(runner: Runner, feeds: Sequence[Mapping[str, np.ndarray]],
                names: Sequence[str] | None = None) -> list[dict[str, np.ndarray]]:
    """``runner.run`` of every sample, with samples grouped into batched runs.

    Args:
        runner: An entered runner of a model with a batch symbol (``batch_symbol``).
        feeds: One feed dict per sample; every input has a first dimension.
        names: Outputs to keep (default: all the run returns).

    Returns:
        One output dict per sample, in order, as ``runner.run(feeds[i])`` would give
        (up to the rounding of batched kernels).
    """
    results: list[dict[str, np.ndarray]] = [{} for _ in feeds]
    batching = True
    for group in groups(feeds):
        if len(group) == 1 or not batching:
            for i in group:
                results[i] = _keep(runner.run(feeds[i]), names)
            continue
        rows = [int(next(iter(feeds[i].values())).shape[0]) for i in group]
        joined = {k: np.concatenate([feeds[i][k] for i in group]) for k in feeds[group[0]]}
        out = _keep(runner.run(joined), names)
        if any(np.ndim(v) == 0 or np.shape(v)[0] != sum(rows) for v in out.values()):
            batching = False  # the outputs are not per sample along axis 0: one at a time
            for i in group:
                results[i] = _keep(runner.run(feeds[i]), names)
            continue
        edges = np.cumsum([0, *rows])
        for j, i in enumerate(group):
            results[i] = {k: v[edges[j]:edges[j + 1]] for k, v in out.items()}
    return results


def _keep(result: Mapping[str, np.ndarray], names: Sequence[str] | None
          ) -> dict[str, np.ndarray]:
    return dict(result) if names is None else {n: result[n] for n in names}
