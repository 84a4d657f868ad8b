"""``FakeRunner``: a runner that returns what a function computes, for tests of the layers above."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from precision_doctor.runners.base import Feeds, TensorMeta


class FakeRunner:
    """A runner whose outputs are ``fn(feeds)``.

    Args:
        inputs: Input metadata to report.
        outputs: Output names ``fn`` returns.
        fn: Feeds -> {output name: array}.
        name: Label for reports.
    """

    def __init__(self, inputs: Sequence[TensorMeta], outputs: Sequence[str],
                 fn: Callable[[Feeds], dict[str, np.ndarray]], name: str = "fake") -> None:
        self._inputs = list(inputs)
        self._outputs = list(outputs)
        self._fn = fn
        self.name = name
        self.calls = 0

    def __enter__(self) -> FakeRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def input_metadata(self) -> list[TensorMeta]:
        return list(self._inputs)

    def output_names(self) -> list[str]:
        return list(self._outputs)

    def run(self, feeds: Feeds) -> dict[str, np.ndarray]:
        self.calls += 1
        return self._fn(feeds)
