"""What "meets the accuracy target" means for the search: a tolerance or a task metric.

Every evaluation runs on all calibration samples. A tolerance objective scores each output as
rel_l2 / bound (the worst output counts; <= 1 passes). A task-metric objective scores each sample
with the metric and takes the worst sample ("on every image"), compared with the threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np

from precision_doctor.compare.metrics import compute_metrics
from precision_doctor.compare.tasks.registry import TaskMetric, evaluate_metric, sample_context
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
        contexts: Per-sample facts for the metric (e.g. ``{"source_size": (h, w)}``), in
            sample order; see ``compare.task_metrics.CONTEXT_KEYS``. Empty: none known.
    """

    tolerances: Mapping[str, Tolerance] | None = None
    metric: TaskMetric | None = None
    threshold: float | None = None
    exclude: frozenset[int] = frozenset()
    contexts: tuple[Mapping[str, Any], ...] = ()

    def with_samples(self, samples: Sequence[Any]) -> Objective:
        """This objective with ``contexts`` taken from the samples' known facts.

        Args:
            samples: Calibration samples (attributes named in ``CONTEXT_KEYS`` are read,
                e.g. ``.source_size``).

        Returns:
            A copy; unchanged when it is not a metric objective or has contexts already.
        """
        if self.metric is None or self.contexts:
            return self
        contexts = tuple(sample_context(s) for s in samples)
        return replace(self, contexts=contexts) if any(contexts) else self

    def worst_samples(self, score: Score, count: int, total: int) -> list[int]:
        """Indices of the ``count`` samples ``score`` rates worst, worst first.

        For a metric objective: by per-sample value (near-ties left out unless nothing else
        is left; ties keep sample order). A tolerance objective scores outputs, not samples:
        the first ``count`` samples.

        Args:
            score: A score from :meth:`score`.
            count: How many indices to return (at most ``total``).
            total: Number of samples.

        Returns:
            Sample indices.
        """
        values = score.detail.get("per_sample") if self.metric is not None else None
        if self.metric is None or not values or len(values) != total:
            return list(range(min(count, total)))
        sign = 1.0 if self.metric.higher_is_better else -1.0
        order = sorted(range(total), key=lambda i: (i in self.exclude, sign * values[i], i))
        return order[:count]

    def describe(self) -> str:
        if self.metric is not None:
            op = ">=" if self.metric.higher_is_better else "<="
            name = self.metric.spec or self.metric.name
            return f"{name} {op} {self._threshold():g} on every sample"
        parts = [f"{k}: {t.describe()}" for k, t in (self.tolerances or {}).items()]
        return "; ".join(parts) or "default tolerance"

    def pass_mark(self) -> tuple[float, bool]:
        """What ``Score.value`` is compared with: ``(threshold, higher_is_better)``.

        A metric objective compares the worst sample's metric value with the metric's threshold
        (in the metric's direction); a tolerance objective compares the worst output's
        ``rel_l2 / tolerance`` with 1 (lower is better).
        """
        if self.metric is not None:
            return self._threshold(), self.metric.higher_is_better
        return 1.0, False

    def score_label(self) -> str:
        """What ``Score.value`` measures, in words (for reports)."""
        if self.metric is not None:
            return f"worst-sample {self.metric.spec or self.metric.name}"
        return "worst output rel L2 / tolerance"

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

    def sample_value(self, index: int, reference: Mapping[str, np.ndarray],
                     candidate: Mapping[str, np.ndarray]) -> float:
        """The task metric on one sample (``index`` picks its context).

        Raises:
            MetricError: The task metric raised or returned NaN.
        """
        if self.metric is None:
            raise ValueError("sample_value needs a task-metric objective")
        return evaluate_metric(self.metric, reference, candidate,
                               self.contexts[index] if index < len(self.contexts) else None)

    def meets(self, value: float) -> bool:
        """Whether one sample's metric value meets the threshold (metric objectives)."""
        threshold = self._threshold()
        assert self.metric is not None  # _threshold raises without a metric
        return value >= threshold if self.metric.higher_is_better else value <= threshold

    def metric_score(self, values: Sequence[float]) -> Score:
        """Score from every sample's metric value (near-ties in ``exclude`` not counted)."""
        counted = [v for i, v in enumerate(values) if i not in self.exclude] or list(values)
        if self.metric is None:
            raise ValueError("metric_score needs a task-metric objective")
        worst = min(counted) if self.metric.higher_is_better else max(counted)
        return Score(self.meets(worst), float(worst), {"per_sample": list(values),
                                                       "excluded": sorted(self.exclude)})

    def score(self, reference: Outputs, candidate: Outputs) -> Score:
        """Score ``candidate`` against ``reference`` (all samples).

        Raises:
            MetricError: The task metric raised or returned NaN.
        """
        if self.metric is not None:
            n = len(next(iter(reference.values())))
            return self.metric_score([
                self.sample_value(i, {k: v[i] for k, v in reference.items()},
                                  {k: v[i] for k, v in candidate.items()}) for i in range(n)])
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
