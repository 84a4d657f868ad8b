"""Sample sets that are not all in memory, and the seeded split of one set into calibration and
evaluation samples.

``LazySamples`` is a read-only sequence that loads sample ``i`` when it is read (an image
decoded and preprocessed on access): a calibration set of thousands of images is streamed, one
sample at a time, instead of held. ``split_indices`` splits ``n`` samples into two disjoint,
seeded halves (``SPLIT_SEED``), each in its original order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

from precision_doctor.inputs.feeds import Sample

SPLIT_SEED = 0  # the default seed of split_indices; the report states the one in use


@dataclass(frozen=True)
class Split:
    """Indices of one sample set split into calibration and evaluation samples.

    Attributes:
        calibration: Indices calibrating, ascending.
        evaluation: Indices evaluated, ascending.
        seed: Seed of the permutation (``numpy.random.default_rng``).
        disjoint: No index in both (False only for a single sample, used for both).
    """

    calibration: tuple[int, ...]
    evaluation: tuple[int, ...]
    seed: int
    disjoint: bool

    def to_dict(self) -> dict:
        """JSON form."""
        return {"calibration": list(self.calibration), "evaluation": list(self.evaluation),
                "seed": self.seed, "disjoint": self.disjoint}


def split_indices(n: int, seed: int = SPLIT_SEED) -> Split:
    """Split ``n`` samples into calibration and evaluation, disjoint and deterministic.

    The rule: a seeded permutation of ``range(n)``; its first ``n // 2`` indices evaluate, the
    rest (``n - n // 2``, the larger half when ``n`` is odd) calibrate; each part keeps the
    original order. With one sample there is nothing to split: it calibrates and evaluates
    (``disjoint`` False).

    Args:
        n: Number of samples, >= 1.
        seed: Seed of the permutation.

    Returns:
        ``Split``.

    Raises:
        ValueError: ``n`` < 1.
    """
    if n < 1:
        raise ValueError(f"cannot split {n} samples: need at least 1")
    if n == 1:
        return Split((0,), (0,), seed, False)
    order = np.random.default_rng(seed).permutation(n)
    k = n // 2
    return Split(tuple(sorted(int(i) for i in order[k:])),
                 tuple(sorted(int(i) for i in order[:k])), seed, True)


class LazySamples(Sequence[Sample]):
    """Samples loaded on access: ``load(i)`` for the ``i``-th of ``count``.

    Nothing is cached: iterating twice loads twice. Indexing by a slice or ``subset`` gives
    another lazy sequence.
    """

    def __init__(self, count: int, load: Callable[[int], Sample]) -> None:
        """Args:
            count: Number of samples.
            load: Index -> its validated sample (called on every access).
        """
        self._count, self._load = count, load
        self._index: Sequence[int] = range(count)

    def __len__(self) -> int:
        return len(self._index)

    @overload
    def __getitem__(self, i: int) -> Sample: ...

    @overload
    def __getitem__(self, i: slice) -> LazySamples: ...

    def __getitem__(self, i: int | slice) -> Sample | LazySamples:
        if isinstance(i, slice):
            return self.subset(self._index[i])
        return self._load(self._index[i])

    def __iter__(self) -> Iterator[Sample]:
        for j in self._index:
            yield self._load(j)

    def subset(self, indices: Sequence[int]) -> LazySamples:
        """The samples at ``indices`` (positions in this sequence), still lazy."""
        out = LazySamples(self._count, self._load)
        out._index = [self._index[i] for i in indices]
        return out


def pick(samples: Sequence[Sample], indices: Sequence[int]) -> Sequence[Sample]:
    """``samples`` at ``indices``: a lazy subset of a ``LazySamples``, else a list."""
    if isinstance(samples, LazySamples):
        return samples.subset(indices)
    return [samples[i] for i in indices]
