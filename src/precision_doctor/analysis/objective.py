"""What "meets the accuracy target" means for the search: a tolerance or a task metric.

Every evaluation runs on all calibration samples. A tolerance objective scores each output as
rel_l2 / bound (the worst output counts; <= 1 passes). A task-metric objective scores each sample
with the metric and takes the worst sample ("on every image"), compared with the threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from precision_doctor.compare.metrics import compute_metrics
from precision_doctor.compare.task_metrics import TaskMetric, evaluate_metric
from precision_doctor.compare.tolerance import Tolerance, check, elementwise_pass_share

Outputs = Mapping[str, Sequence[np.ndarray]]


@dataclass(frozen=True)
class Score:
    """Result of one evaluation.

    Attributes:
        passed: Whether the target is met.
        value: Tolerance objective: worst rel_l2 / bound (<= 1 passes). Metric objective: the
            worst sample's metric value.
        detail: Per-output errors or per-sample metric values.
    """

    passed: bool
    value: float
    detail: dict


@dataclass(frozen=True)
class Objective:
    """The accuracy target.

    Attributes:
        tolerances: Output name (or ``*``) -> tolerance, for a tolerance objective.
        metric: A task metric (higher or lower is better as the metric says).
        threshold: The metric's pass mark (default: the metric's own default threshold).
        exclude: Sample indices left out of a metric objective (near-ties, see
            ``analysis.near_ties``); their values are still reported.
    """

    tolerances: Mapping[str, Tolerance] | None = None
    metric: TaskMetric | None = None
    threshold: float | None = None
    exclude: frozenset[int] = frozenset()

    def describe(self) -> str:
        if self.metric is not None:
            op = ">=" if self.metric.higher_is_better else "<="
            return f"{self.metric.spec or self.metric.name} {op} {self._threshold():g} on every sample"
        parts = [f"{k}: {t.describe()}" for k, t in (self.tolerances or {}).items()]
        return "; ".join(parts) or "default tolerance"

    def _threshold(self) -> float:
        if self.threshold is not None:
            return self.threshold
        if self.metric is None or self.metric.default_threshold is None:
            raise ValueError("a metric without a default threshold needs --threshold")
        return self.metric.default_threshold

    def better(self, a: Score, b: Score) -> bool:
        """True when ``a`` is closer to meeting the target than ``b``."""
        if self.metric is not None and self.metric.higher_is_better:
            return a.value > b.value
        return a.value < b.value

    def score(self, reference: Outputs, candidate: Outputs) -> Score:
        """Score ``candidate`` against ``reference`` (all samples).

        Raises:
            MetricError: The task metric raised or returned NaN.
        """
        if self.metric is not None:
            n = len(next(iter(reference.values())))
            values = [evaluate_metric(self.metric, {k: v[i] for k, v in reference.items()},
                                      {k: v[i] for k, v in candidate.items()})
                      for i in range(n)]
            counted = [v for i, v in enumerate(values) if i not in self.exclude] or values
            worst = min(counted) if self.metric.higher_is_better else max(counted)
            threshold = self._threshold()
            passed = worst >= threshold if self.metric.higher_is_better else worst <= threshold
            return Score(passed, float(worst), {"per_sample": values,
                                                "excluded": sorted(self.exclude)})
        worst, detail, passed = 0.0, {}, True
        for name in reference:
            if not np.issubdtype(np.asarray(reference[name][0]).dtype, np.floating):
                continue
            tol = (self.tolerances or {}).get(name) or (self.tolerances or {}).get("*") \
                or Tolerance()
            m = compute_metrics(reference[name], candidate[name])
            share = (elementwise_pass_share(reference[name], candidate[name], tol)
                     if tol.atol is not None or tol.rtol is not None else None)
            ok, _ = check(m, tol, share)
            ratio = m.rel_l2 / tol.rel_l2 if tol.rel_l2 else (0.0 if ok else math.inf)
            detail[name] = m.rel_l2
            worst = max(worst, ratio if not (m.nan or m.inf) else math.inf)
            passed = passed and ok
        return Score(passed, worst, detail)
