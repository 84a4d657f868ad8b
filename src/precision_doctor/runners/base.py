"""The ``Runner`` protocol every backend implements, and the metadata it exposes.

A runner is cheap to construct; the heavy session/engine is built on ``__enter__`` and released
on ``__exit__`` (the Polygraphy pattern). ``run`` takes a feed dict of numpy arrays and returns
the named outputs as numpy arrays (float outputs as float32 unless the model says otherwise).
"""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from precision_doctor.graph.load import TensorMeta  # re-exported: runners describe I/O with it

Feeds = Mapping[str, np.ndarray]


@runtime_checkable
class Runner(Protocol):
    """One backend that runs an ONNX model.

    Attributes:
        name: Short label used in reports (e.g. ``ort-cpu``, ``emulate-fp16``, ``ort-cuda-tf32``).
    """

    name: str

    def __enter__(self) -> Runner: ...

    def __exit__(self, *exc: object) -> None: ...

    def input_metadata(self) -> Sequence[TensorMeta]:
        """Graph inputs (name, dtype, shape) in model order."""
        ...

    def output_names(self) -> Sequence[str]:
        """Names of the outputs ``run`` returns, in order."""
        ...

    def run(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """Run once.

        Args:
            feeds: Input name -> array, exactly the model's inputs.

        Returns:
            Output name -> array, for every name of ``output_names()``.

        Raises:
            BackendError: The backend failed to run.
        """
        ...
