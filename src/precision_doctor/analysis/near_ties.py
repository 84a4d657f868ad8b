"""Near-ties: samples whose FP32 decision is itself within FP32 noise of flipping.

For decision metrics (top-1/top-5 agreement, CTC strings), a sample whose reference top-1 vs
top-2 margin is below the FP32 noise of the output cannot be asked to keep its decision in any
lower precision: harmless FP32 reordering alone may flip it. Such samples are listed with their
margins and left out of the search objective.

Margin: CTC metrics use ``ctc_margin`` (smallest top-1 minus top-2 score over the emitting time
steps); classification uses the smallest top-1 minus top-2 score over all positions. Noise: the
largest absolute change of the output when ONNX Runtime evaluates the same model with graph
optimizations disabled (another valid FP32 evaluation order). A sample is a near-tie when its
margin is at most twice that noise (an exact tie always is).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np
import onnx

from precision_doctor.analysis.objective import Objective, Outputs
from precision_doctor.compare.tasks.ocr import ctc_margin
from precision_doctor.runners.ort import OrtRunner

DECISION_METRICS = {"top1", "top5", "ctc-string", "ctc-char"}
NOISE_MULTIPLE = 2.0


@dataclass(frozen=True)
class NearTie:
    """A sample whose FP32 decision is within FP32 noise of flipping."""

    sample: str
    index: int
    margin: float
    noise: float

    def to_dict(self) -> dict:
        return asdict(self)


def _margins(probs: np.ndarray, ctc: bool) -> float:
    if ctc:
        return float(np.min(ctc_margin(probs)))
    top2 = np.sort(np.asarray(probs, np.float64), axis=-1)[..., -2:]
    return float(np.min(top2[..., 1] - top2[..., 0]))


def find_near_ties(model: onnx.ModelProto, samples: Sequence, reference: Outputs,
                   objective: Objective) -> list[NearTie]:
    """Near-tie samples for a decision-metric objective (empty for other objectives).

    Args:
        model: The FP32 model.
        samples: Calibration samples (``.name``, ``.feeds``).
        reference: ONNX Runtime CPU FP32 outputs on ``samples``.
        objective: The fix objective.

    Returns:
        Near-ties in sample order.
    """
    metric = objective.metric
    if metric is None or metric.name not in DECISION_METRICS:
        return []
    output = dict(metric.params).get("output") or next(iter(reference))
    probs = reference[str(output)]
    ctc = metric.name.startswith("ctc")
    ties = []
    with OrtRunner(model, name="ort-cpu-noopt", graph_optimization="disable") as runner:
        for i, s in enumerate(samples):
            other = runner.run(s.feeds)[str(output)]
            noise = float(np.max(np.abs(np.asarray(other, np.float64) - probs[i])))
            margin = _margins(probs[i], ctc)
            if margin <= NOISE_MULTIPLE * noise:  # an exact tie (0 <= 0) counts
                ties.append(NearTie(s.name, i, margin, noise))
    return ties


def sample_margins(reference: Outputs, objective: Objective) -> list[float] | None:
    """Each sample's FP32 decision margin (see the module docstring), for decision metrics.

    Args:
        reference: FP32 outputs (name -> one array per sample).
        objective: The fix objective.

    Returns:
        One margin per sample (probability or logit units of the decision output), or None
        when the objective is not a decision metric.
    """
    metric = objective.metric
    if metric is None or metric.name not in DECISION_METRICS:
        return None
    output = decision_output(objective, list(reference))
    ctc = metric.name.startswith("ctc")
    return [_margins(p, ctc) for p in reference[output]]


def margin_order(reference: Outputs, objective: Objective, values: Sequence[float] | None
                 ) -> list[int] | None:
    """Samples for a decision metric's ranking: those whose decision flipped first, then the
    rest; each group by smallest FP32 margin (the decisions closest to flipping). Near-ties
    (``objective.exclude``) come last.

    Args:
        reference: FP32 outputs.
        objective: The fix objective.
        values: Per-sample metric values of the start plan (None: unknown).

    Returns:
        Sample indices, or None when the objective is not a decision metric.
    """
    margins = sample_margins(reference, objective)
    if margins is None:
        return None
    n = len(margins)
    failed = [bool(values is not None and i < len(values) and values[i] is not None
                   and not objective.meets(values[i])) for i in range(n)]
    return sorted(range(n), key=lambda i: (i in objective.exclude, not failed[i], margins[i], i))


def decision_output(objective: Objective, names: Sequence[str]) -> str:
    """The output a decision metric reads (its ``output`` parameter, else the first output)."""
    params = dict(objective.metric.params) if objective.metric is not None else {}
    return str(params.get("output") or names[0])
