"""What a diagnosis is asked to do: ``DiagnoseRequest``, the input of every stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, Sequence

import numpy as np
import onnx

from precision_doctor.compare.tolerance import Tolerance, default_tolerance
from precision_doctor.formats import Precision
from precision_doctor.layerwise.candidates import Candidate
from precision_doctor.layerwise.compare import LAYERWISE_BUDGET

Progress = Callable[[str, int, int], None]


class SampleLike(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def feeds(self) -> Mapping[str, np.ndarray]: ...


@dataclass(frozen=True)
class DiagnoseRequest:
    """The model, its samples, the candidate and every option of one diagnosis.

    Attributes:
        model: FP32 model (nodes named).
        samples: Inputs (``.name``, ``.feeds``); every evaluation uses all of them.
        target: Precision whose range/rounding is checked.
        candidate: The runner under test (a recorded one when results were recorded).
        tolerances: One tolerance, or per output name; None: ``default_tolerance(target)``.
        layerwise / noise / measure_impact / rewritten / decisions / stress: The optional
            stages (``diagnosis.diagnose.diagnose`` documents each).
        budget_bytes: Memory budget of one layerwise segment.
        model_path: Recorded in the report.
        progress: ``progress(stage, done, total)`` or None.
    """

    model: onnx.ModelProto
    samples: Sequence[SampleLike]
    target: Precision
    candidate: Candidate
    tolerances: Tolerance | Mapping[str, Tolerance] | None = None
    layerwise: bool = True
    noise: bool = True
    measure_impact: bool = True
    budget_bytes: int = LAYERWISE_BUDGET
    model_path: str | None = None
    progress: Progress | None = None
    rewritten: bool = True
    decisions: bool = True
    stress: bool = False

    @property
    def output_names(self) -> list[str]:
        """The model's output names, in graph order."""
        return [o.name for o in self.model.graph.output]

    @property
    def sample_names(self) -> list[str]:
        return [s.name for s in self.samples]

    def tolerance_for(self, name: str) -> Tolerance:
        """The tolerance of output ``name`` (its own, else ``"*"``, else the default)."""
        tolerances = self.tolerances
        if tolerances is None:
            return default_tolerance(self.target)
        if isinstance(tolerances, Tolerance):
            return tolerances
        return tolerances.get(name) or tolerances.get("*") or default_tolerance(self.target)


__all__ = ["DiagnoseRequest", "Progress", "SampleLike"]
