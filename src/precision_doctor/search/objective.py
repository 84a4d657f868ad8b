"""What "meets the accuracy target" means for the search: a tolerance or a task metric.

Every evaluation runs on all calibration samples. A tolerance objective scores each output as
rel_l2 / bound (the worst output counts; <= 1 passes). A task-metric objective scores each sample
with the metric and takes the worst sample ("on every image"), compared with the threshold.

``ScoreStream`` scores an evaluation sample by sample and says as soon as it can no longer pass:
a metric objective at the first sample that misses the threshold; a tolerance objective when
the squared error summed so far already exceeds bound^2 x the reference's total squared norm
(rel_l2 over all samples can only grow from there), when more elements than the tolerance's
statistic allows already miss atol + rtol*|r|, or at the first NaN/Inf. A stopped evaluation
fails exactly when the complete one would.

A tolerance objective also asks for the reference's shapes: an output (floating or integer)
whose shape differs from the reference's on any sample fails the evaluation, with an infinite
score (a TTS voice whose rounded durations changed the audio's length is not reproduced). A
task metric judges outputs of other shapes itself (a detector's box count may change).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np

from precision_doctor.compare.metrics import l2_ratio, shape_changes
from precision_doctor.compare.tasks.registry import TaskMetric, evaluate_metric, sample_context
from precision_doctor.compare.tolerance import Tolerance, check_values, elementwise_pass_share

Outputs = Mapping[str, Sequence[np.ndarray]]
# detail key of a tolerance score: per sample, max over outputs of its squared error / (bound^2
# x the output's total reference squared norm); over all samples they sum to rel_l2^2 / bound^2
SAMPLE_LOAD = "sample_error_load"
# early stop margin: a partial squared error must exceed the budget by this relative amount (far
# above float64 summation-order differences) so that a stop is always a real failure
_STOP_MARGIN = 1e-9


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
            ``search.near_ties``); their values are still reported.
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
        if self.metric is None:
            loads = score.detail.get(SAMPLE_LOAD)
            if not loads or len(loads) != total:
                return list(range(min(count, total)))
            return sorted(range(total), key=lambda i: (-loads[i], i))[:count]
        values = score.detail.get("per_sample")
        if not values or len(values) != total:
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

    def score(self, reference: Outputs, candidate: Outputs,
              norms: Mapping[str, float] | None = None) -> Score:
        """Score ``candidate`` against ``reference`` (all samples).

        Args:
            reference / candidate: Output name -> one array per sample.
            norms: ``reference_norms(reference)`` when the caller scores many candidates
                against the same reference (computed here otherwise).

        Raises:
            MetricError: The task metric raised or returned NaN.
        """
        if self.metric is not None:
            n = len(next(iter(reference.values())))
            return self.metric_score([
                self.sample_value(i, {k: v[i] for k, v in reference.items()},
                                  {k: v[i] for k, v in candidate.items()}) for i in range(n)])
        norms = self.reference_norms(reference) if norms is None else norms
        changed = shape_changes(reference, candidate)
        if changed:
            return Score(False, math.inf, {**{k: math.inf for k in changed},
                                           "shape_changed": changed})
        worst, passed = 0.0, True
        detail: dict[str, Any] = {}
        n = len(next(iter(reference.values()), []))
        loads = [0.0] * n
        for name, ref2 in norms.items():
            tol = self.tolerance_of(name)
            errors = [sample_error(r, c) for r, c in zip(reference[name], candidate[name])]
            nan, inf = sum(e[1] for e in errors), sum(e[2] for e in errors)
            rel_l2 = l2_ratio(sum(e[0] for e in errors), ref2, nan + inf)
            share = (elementwise_pass_share(reference[name], candidate[name], tol)
                     if tol.atol is not None or tol.rtol is not None else None)
            ok, _ = check_values(rel_l2, nan, inf, tol, share)
            ratio = rel_l2 / tol.rel_l2 if tol.rel_l2 else (0.0 if ok else math.inf)
            detail[name] = rel_l2
            worst = max(worst, ratio if not (nan or inf) else math.inf)
            passed = passed and ok
            if tol.rel_l2:
                budget = tol.rel_l2 ** 2 * ref2
                for i, (e2, _, _) in enumerate(errors):
                    loads[i] = max(loads[i], e2 / budget if budget > 0 else
                                   (math.inf if e2 > 0 else 0.0))
        if n:
            detail[SAMPLE_LOAD] = loads
        return Score(passed, worst, detail)

    def reference_norms(self, reference: Outputs) -> dict[str, float]:
        """Squared L2 norm of each floating output over all samples (finite elements): what
        a tolerance objective divides by. Empty for a metric objective."""
        if self.metric is not None:
            return {}
        return {name: _ref_norm2(arrays) for name, arrays in reference.items()
                if np.issubdtype(np.asarray(arrays[0]).dtype, np.floating)}

    def tolerance_of(self, name: str) -> Tolerance:
        """The tolerance applying to output ``name`` (its own, else ``*``, else the default)."""
        tols = self.tolerances or {}
        return tols.get(name) or tols.get("*") or Tolerance()

    def stream(self, reference: Outputs, norms: Mapping[str, float] | None = None
               ) -> ScoreStream:
        """A ``ScoreStream`` for one evaluation against ``reference`` (``norms`` as for
        ``score``)."""
        return ScoreStream(self, reference, norms)


def _ref_norm2(arrays: Sequence[np.ndarray]) -> float:
    total = 0.0
    for a in arrays:
        r = np.asarray(a, np.float64).ravel()
        r = r[np.isfinite(r)]
        total += float(np.dot(r, r))
    return total


def sample_error(r: np.ndarray, c: np.ndarray) -> tuple[float, int, int]:
    """(squared L2 error over the elements finite in both, NaN count, Inf count of ``c``)
    of one sample, in float64; an infinite error where the shapes differ."""
    if np.shape(r) != np.shape(c):
        return math.inf, 0, 0
    d = np.subtract(np.asarray(c, np.float64), np.asarray(r, np.float64)).ravel()
    e2 = float(np.dot(d, d))
    if math.isfinite(e2):  # every element of both finite (float32 squares cannot overflow)
        return e2, 0, 0
    c64 = np.asarray(c, np.float64).ravel()
    ok = np.isfinite(np.asarray(r, np.float64).ravel()) & np.isfinite(c64)
    d = d[ok]
    return float(np.dot(d, d)), int(np.isnan(c64).sum()), int(np.isinf(c64).sum())


class ScoreStream:
    """Scores one evaluation sample by sample, stopping as soon as it cannot pass.

    Feed samples in any order with :meth:`add`; it returns True once the evaluation has
    failed (see the module docstring for the exact stop rules). :meth:`score` then gives the
    same ``Score`` as ``Objective.score`` when every sample was added, or a failing partial
    score (``detail["stopped_at_sample"]``; its value is a lower bound for a tolerance
    objective, the failing sample's value for a metric objective).

    Args:
        objective: The accuracy target.
        reference: Reference outputs (name -> one array per sample).
        norms: ``objective.reference_norms(reference)`` (computed here when None).
    """

    def __init__(self, objective: Objective, reference: Outputs,
                 norms: Mapping[str, float] | None = None) -> None:
        self.objective, self.reference = objective, reference
        self.n = len(next(iter(reference.values()), []))
        self.values: list[float | None] = [None] * self.n
        self.outputs: list[Mapping[str, np.ndarray] | None] = [None] * self.n
        self.failed: Score | None = None
        self._err2: dict[str, float] = {}
        self._miss: dict[str, int] = {}
        self._budget: dict[str, float] = {}
        self._allowed: dict[str, float] = {}
        self.norms = objective.reference_norms(reference) if norms is None else norms
        for name, ref2 in self.norms.items():
            tol = objective.tolerance_of(name)
            self._err2[name], self._miss[name] = 0.0, 0
            if tol.rel_l2 is not None:
                self._budget[name] = tol.rel_l2 ** 2 * ref2
            numel = sum(int(np.asarray(a).size) for a in reference[name])
            self._allowed[name] = (1.0 - tol.required_share()) * numel

    def add(self, index: int, candidate: Mapping[str, np.ndarray]) -> bool:
        """Score sample ``index``; True when the evaluation has failed (stop here).

        Raises:
            MetricError: The task metric raised or returned NaN.
        """
        if self.failed is not None:
            return True
        ref = {k: v[index] for k, v in self.reference.items()}
        if self.objective.metric is not None:
            value = self.objective.sample_value(index, ref, candidate)
            self.values[index] = value
            if index not in self.objective.exclude and not self.objective.meets(value):
                self.failed = Score(False, float(value), {
                    "per_sample": list(self.values), "excluded": sorted(self.objective.exclude),
                    "stopped_at_sample": index})
            return self.failed is not None
        self.outputs[index] = candidate
        for name, refs in self.reference.items():
            if name in candidate and np.shape(refs[index]) != np.shape(candidate[name]):
                self.failed = Score(False, math.inf, {name: math.inf, "stopped_at_sample": index,
                                                      "shape_changed": {name: [index]}})
                return True
        for name in self._err2:
            self._check_output(index, name, ref[name], np.asarray(candidate[name]))
            if self.failed is not None:
                break
        return self.failed is not None

    def _check_output(self, index: int, name: str, r: np.ndarray, c: np.ndarray) -> None:
        tol = self.objective.tolerance_of(name)
        e2, nan, inf = sample_error(r, c)
        if nan or inf:
            self.failed = Score(False, math.inf, {name: math.inf, "stopped_at_sample": index})
            return
        self._err2[name] += e2
        budget = self._budget.get(name)
        if budget is not None and self._err2[name] > budget * (1 + _STOP_MARGIN):
            ratio = (math.sqrt(self._err2[name] / budget) if budget > 0 else math.inf)
            self.failed = Score(False, ratio, {name: ratio * (tol.rel_l2 or 0.0),
                                               "stopped_at_sample": index})
            return
        if tol.atol is not None or tol.rtol is not None:
            r64, c64 = np.asarray(r, np.float64), np.asarray(c, np.float64)
            bound = (tol.atol or 0.0) + (tol.rtol or 0.0) * np.abs(r64)
            self._miss[name] += int((~(np.abs(c64 - r64) <= bound)).sum())
            if self._miss[name] > self._allowed[name]:
                ratio = math.sqrt(self._err2[name] / budget) if budget else math.inf
                self.failed = Score(False, ratio, {name: "elementwise bound exceeded",
                                                   "stopped_at_sample": index})

    def subset_score(self) -> Score:
        """Score over the samples added so far (a metric objective whose search screened
        out samples that cannot fail; ``detail["screened_out"]`` lists the others).

        Raises:
            ValueError: Not a metric objective, or nothing added.
        """
        if self.objective.metric is None:
            raise ValueError("subset_score is for metric objectives")
        if self.failed is not None:
            return self.failed
        added = {i: v for i, v in enumerate(self.values) if v is not None}
        if not added:
            raise ValueError("subset_score() before any sample was added")
        counted = [v for i, v in added.items() if i not in self.objective.exclude] \
            or list(added.values())
        metric = self.objective.metric
        worst = min(counted) if metric.higher_is_better else max(counted)
        return Score(self.objective.meets(worst), worst, {
            "per_sample": list(self.values), "excluded": sorted(self.objective.exclude),
            "screened_out": [i for i, v in enumerate(self.values) if v is None]})

    def score(self) -> Score:
        """The failing partial score, or the complete score once every sample was added.

        Raises:
            ValueError: Neither failed nor complete.
        """
        if self.failed is not None:
            return self.failed
        if self.objective.metric is not None:
            values = [v for v in self.values if v is not None]
            if len(values) < self.n:
                raise ValueError("score() before every sample was added")
            return self.objective.metric_score(values)
        outputs = [o for o in self.outputs if o is not None]
        if len(outputs) < self.n:
            raise ValueError("score() before every sample was added")
        cand = {k: [o[k] for o in outputs] for k in self.reference}
        return self.objective.score(self.reference, cand, self.norms)
