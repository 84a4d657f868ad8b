"""A runner that replays outputs recorded elsewhere (e.g. on a TensorRT machine).

Each ``__enter__`` starts again at the first iteration; the i-th ``run`` returns the i-th
recorded iteration. Callers run samples in the order the recording was matched to them
(``inputs.recording.match_samples``), as ``run_samples`` and layerwise comparison do.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from precision_doctor.errors import BackendError
from precision_doctor.runners.base import Feeds, TensorMeta


class RecordedRunner:
    """Replays recorded outputs, one iteration per ``run``.

    Args:
        iterations: Tensor name -> array, one dict per sample, in sample order.
        inputs: The model's inputs (for ``input_metadata``).
        wanted: Output names asked for (e.g. the marked model's outputs); ``output_names``
            returns those the recording holds.
        name: Label in reports.
    """

    def __init__(self, iterations: Sequence[Mapping[str, np.ndarray]],
                 inputs: Sequence[TensorMeta], wanted: Sequence[str], name: str) -> None:
        self.name = name
        self._iterations = iterations
        self._inputs = list(inputs)
        recorded = set(iterations[0]) if iterations else set()
        self._names = [n for n in wanted if n in recorded]
        self._cursor = 0

    def __enter__(self) -> RecordedRunner:
        self._cursor = 0
        return self

    def __exit__(self, *exc: object) -> None:
        self._cursor = 0

    def input_metadata(self) -> list[TensorMeta]:
        return list(self._inputs)

    def output_names(self) -> list[str]:
        return list(self._names)

    def run(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """The next recorded iteration (``feeds`` only fix the order; they are not re-run).

        Raises:
            BackendError: More runs than recorded iterations, or a tensor missing from one.
        """
        if self._cursor >= len(self._iterations):
            raise BackendError(f"{self.name}: only {len(self._iterations)} iteration(s) were "
                               "recorded; run on the same samples the recording was made on",
                               runner=self.name)
        it = self._iterations[self._cursor]
        self._cursor += 1
        missing = [n for n in self._names if n not in it]
        if missing:
            raise BackendError(f"{self.name}: iteration {self._cursor - 1} lacks {missing[:3]}",
                               runner=self.name, tensor=missing[0])
        return {n: np.asarray(it[n]) for n in self._names}
