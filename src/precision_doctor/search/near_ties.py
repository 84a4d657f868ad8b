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

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np
import onnx

from precision_doctor.compare.tasks.ocr import ctc_margin
from precision_doctor.runners.ort import OrtRunner
from precision_doctor.search.objective import Objective, Outputs

DECISION_METRICS = {"top1", "top5", "ctc-string", "ctc-char"}
NOISE_MULTIPLE = 2.0
# screening: a sample whose decisions the start plan (everything low precision) moved by less
# than 1/SAFETY of their FP32 margin at every position is not run by grow/shrink evaluations
# (the final evaluation still runs it). Our choice: FP32 nodes remove rounding, so a partly
# FP32 plan is expected to move decisions less than the all-low one; 4x leaves room for
# rounding errors that happen to add up differently.
SCREEN_SAFETY = 4.0
_SCREENED = {"top1", "ctc-string", "ctc-char"}  # per-position argmax decisions


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
    output = decision_output(objective, list(reference))
    probs = reference[output]
    ctc = metric.name.startswith("ctc")
    ties = []
    with OrtRunner(model, name="ort-cpu-noopt", graph_optimization="disable") as runner:
        for i, s in enumerate(samples):
            other = runner.run(s.feeds)[output]
            noise = float(np.max(np.abs(np.asarray(other, np.float64) - probs[i])))
            margin = _margins(probs[i], ctc)
            if margin <= NOISE_MULTIPLE * noise:  # an exact tie (0 <= 0) counts
                ties.append(NearTie(s.name, i, margin, noise))
    return ties


def decision_output(objective: Objective, names: Sequence[str]) -> str:
    """The output a decision metric reads (its ``output`` parameter, else the first output)."""
    params = dict(objective.metric.params) if objective.metric is not None else {}
    return str(params.get("output") or names[0])


def at_risk_samples(reference: Outputs, candidate: Outputs, objective: Objective,
                    safety: float = SCREEN_SAFETY) -> list[int] | None:
    """Samples whose decision the start plan brought close to flipping (margin screening).

    Per position (every index of the decision output but the last axis): ``m`` = FP32 top-1
    minus top-2 score, ``s`` = candidate score of the FP32 top-1 class minus the candidate's
    best other class. A sample is at risk when ``m - s >= m / safety`` at some position (the
    start plan used at least 1/safety of the margin there; a flipped decision always is) or
    its output is not finite. Near-ties left out of the objective are never at risk.

    Args:
        reference: FP32 outputs (name -> one array per sample).
        candidate: The start plan's outputs on the same samples.
        objective: The fix objective.
        safety: See ``SCREEN_SAFETY``.

    Returns:
        At-risk sample indices, the largest share of margin used first (ties: sample order),
        or None (not a per-position decision metric: every sample runs).
    """
    metric = objective.metric
    if metric is None or metric.name not in _SCREENED:
        return None
    output = decision_output(objective, list(reference))
    risky: list[tuple[float, int]] = []
    for i, (r, c) in enumerate(zip(reference[output], candidate[output])):
        r64 = np.asarray(r, np.float64).reshape(-1, np.shape(r)[-1])
        c64 = np.asarray(c, np.float64).reshape(r64.shape)
        top = r64.argmax(axis=1)
        rows = np.arange(len(top))
        r_other, c_other = r64.copy(), c64.copy()
        r_other[rows, top] = -np.inf
        c_other[rows, top] = -np.inf
        m = r64[rows, top] - r_other.max(axis=1)
        s = c64[rows, top] - c_other.max(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            used = np.where(m > 0, (m - s) / m, np.where(s <= 0, np.inf, 0.0))
        share = float(np.max(used)) if np.all(np.isfinite(c64)) else math.inf
        if i not in objective.exclude and share >= 1.0 / safety:
            risky.append((-share, i))
    return [i for _, i in sorted(risky)]
