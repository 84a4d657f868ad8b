"""Accuracy-driven search for the smallest set of nodes to keep in FP32.

1. Evaluate the start plan (everything low precision except forced nodes). If it meets the
   target: done, k = 0.
2. Rank candidates by measured sensitivity (from one layerwise comparison of the start plan on
   the samples it scores worst: overflow/NaN births first, then local error gain =
   rel_l2(out) / rel_l2(inputs); ``repair.ranking.rank`` makes it margin- and engine-aware for
   decision metrics).
3. Grow: bisect for the shortest prefix of the ranking that meets the target (log2 N
   evaluations, assuming more FP32 never hurts). Every candidate in FP32 is evaluated only
   when no shorter prefix passes; if even that fails, the target cannot be met:
   ``TargetNotMetError`` with the best score reached. (Galloping from the front, 1, 2, 4, ...
   nodes, was tried: with the real rankings, whose passing prefix is 33 of 328 nodes on rec
   and about 295 of 324 on det, it costs more evaluations than bisection.)
4. Shrink: delta debugging (Zeller & Hildebrandt 2002, "ddmin") removes prefix nodes that are
   not needed: O(k log m) evaluations for k needed nodes in a prefix of m.

Where range needs hundreds of FP32 nodes, grow and shrink run over regions first (the
exporter's modules, overflow regions kept whole), then inside the regions kept
(``search.regions``, chosen by ``repair.ranking``): ddmin over hundreds of needed single nodes
would spend the whole budget.

So the evaluation count is O(k log N), never an O(N) sweep over nodes. Grow and shrink
evaluations stop at the first sample that decides a failure (``objective.ScoreStream``: a
task-metric sample below the threshold, or a tolerance's error budget exceeded). Metric
objectives run the samples that failed before first (move-to-front); tolerance objectives
run first the samples with the largest share of the error budget per unit of cost. A failing
evaluation, the common case while shrinking, so usually costs one sample, not all of them.
For decision metrics a ``screen`` (``near_ties.at_risk_samples``) limits grow and shrink to
the samples the start plan brought near a flip; the final evaluation runs every sample and the
search goes on over all of them if a screened-out one fails, so the answer always passes on
every sample. Samples may run in parallel worker processes (``jobs``, ``search.evalpool``)
with the same result.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from precision_doctor.errors import BackendError, TargetNotMetError
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.search.evalpool import OpenPlan, SampleRunner
from precision_doctor.search.objective import SAMPLE_LOAD, Objective, Outputs, Score
from precision_doctor.search.regions import (
    Region,
    RegionSearch,
    RegionStart,
    ddmin,
    search_regions,
)


@dataclass(frozen=True)
class Trial:
    """One evaluation: how many nodes were FP32, the score, and why it was tried."""

    stage: str
    fp32_nodes: int
    passed: bool
    value: float
    seconds: float
    samples: int = 0  # samples run (an evaluation stops at the first failing one)


@dataclass(frozen=True)
class SearchResult:
    """The smallest FP32 set found.

    Attributes:
        plan: Start plan plus the FP32 nodes the search kept (reason ``search``).
        kept: Nodes the search put in FP32 (beyond the forced ones), ranked.
        score: Score of ``plan``.
        trials: Every evaluation, in order.
        ranking: Candidate nodes in sensitivity order (first 50).
        final_outputs: Outputs of ``plan`` on every sample when the search ran them (not in
            reports; ``fix`` reuses them instead of running the plan again).
        regions: What the region search did (``search.regions``); None for the node search.
    """

    plan: PrecisionPlan
    kept: tuple[str, ...]
    score: Score
    trials: tuple[Trial, ...]
    ranking: tuple[str, ...] = field(default_factory=tuple)
    final_outputs: Outputs | None = field(default=None, compare=False, repr=False)
    regions: RegionSearch | None = None

    @property
    def evaluations(self) -> int:
        return len(self.trials)


Screen = Callable[[Outputs], "Sequence[int] | None"]
# ranked candidates -> the top regions to search first (``search.regions``), with the range
# ladder (``RegionStart``), or None: by nodes
Regions = Callable[[Sequence[str]], "Sequence[Region] | RegionStart | None"]


class _Evaluator:
    def __init__(self, runner: SampleRunner, samples: Sequence, reference: Outputs,
                 objective: Objective, base: PrecisionPlan, max_evals: int,
                 progress: Callable[[str, int, int], None] | None) -> None:
        self.runner, self.samples, self.reference = runner, samples, reference
        self.objective, self.base, self.max_evals, self.progress = (objective, base, max_evals,
                                                                    progress)
        self.trials: list[Trial] = []
        self.deadline: float | None = None  # time.perf_counter() after which no new evaluation
        self.cache: dict[frozenset[str], tuple[Score, bool]] = {}  # score, valid for all
        self.active: set[int] | None = None  # samples grow/shrink run (None: all)
        self.last_complete: Outputs | None = None
        self.order = list(range(len(samples)))  # failing samples move to the front
        self.last_passing: tuple[frozenset[str], Outputs] | None = None
        # cost of a sample ~ its input elements (activations scale with them)
        self.cost = [max(1, sum(int(np.asarray(v).size) for v in s.feeds.values()))
                     for s in samples]
        self.norms = objective.reference_norms(reference)  # once, not per evaluation

    def __call__(self, nodes: Sequence[str], stage: str, complete: bool = False,
                 then: Sequence[str] | None = None) -> Score:
        """Score keeping ``nodes`` in FP32 (cached). ``then``: the set most likely evaluated
        next; its runner is opened while this one runs (``SampleRunner.prepare``)."""
        key = frozenset(nodes)
        if key in self.cache and (self.cache[key][1] or not complete):
            return self.cache[key][0]
        t0 = time.perf_counter()
        plan = self.base.keep_fp32(nodes, "search")
        cand: Outputs | None
        try:
            if complete:
                outputs = self.runner.run(plan, range(len(self.samples)))
                self._prepare(then)
                outs = dict(outputs)
                cand = {k: [outs[i][k] for i in range(len(self.samples))]
                        for k in self.reference}
                s, runs = (self.objective.score(self.reference, cand, self.norms),
                           len(self.samples))
                self.last_complete = cand
            else:
                s, runs, cand = self._fail_fast(plan, then)
        except BackendError as exc:
            # a plan whose data-dependent shapes break the graph (an empty tensor a Reshape
            # cannot take, after rounded durations changed) fails; a runner that never ran
            # any plan is broken, and says so
            if not any(t.samples for t in self.trials):
                raise
            s, runs, cand = Score(False, math.inf, {"error": str(exc).splitlines()[0]}), 0, None
        if s.passed and cand is not None:
            self.last_passing = (key, cand)
        self.trials.append(Trial(stage, len(key), s.passed, s.value, time.perf_counter() - t0,
                                 runs))
        # a screened pass says nothing about the screened-out samples
        self.cache[key] = (s, complete or self.active is None or not s.passed)
        if self.progress:
            self.progress("search", len(self.trials), self.max_evals)
        return s

    def fail_first(self, score: Score) -> None:
        """Order samples from a complete score: metric objectives worst first; tolerance
        objectives by share of the error budget per unit of cost (largest first), so that a
        failing evaluation crosses its budget after as little work as possible."""
        n = len(self.samples)
        loads = score.detail.get(SAMPLE_LOAD) if self.objective.metric is None else None
        if loads and len(loads) == n:
            self.order = sorted(range(n), key=lambda i: (-loads[i] / self.cost[i], i))
        else:
            self.order = self.objective.worst_samples(score, n, n)

    def _prepare(self, then: Sequence[str] | None) -> None:
        if then is not None and frozenset(then) not in self.cache \
                and len(self.trials) + 1 < self.max_evals:
            self.runner.prepare(self.base.keep_fp32(then, "search"))

    def _fail_fast(self, plan: PrecisionPlan, then: Sequence[str] | None
                   ) -> tuple[Score, int, Outputs | None]:
        stream = self.objective.stream(self.reference, self.norms)
        runs, got = 0, {}
        order = [i for i in self.order if self.active is None or i in self.active]
        outputs = self.runner.run(plan, order)
        self._prepare(then)
        try:
            for i, cand in outputs:
                runs += 1
                got[i] = cand
                if stream.add(i, cand):
                    if self.objective.metric is not None:  # move-to-front
                        self.order.remove(i)
                        self.order.insert(0, i)
                    break
        finally:
            outputs.close()
        n = len(self.samples)
        full = ({k: [got[i][k] for i in range(n)] for k in self.reference} if len(got) == n
                else None)
        score = stream.score() if len(got) == n or stream.failed else stream.subset_score()
        return score, runs, full

    @property
    def budget_left(self) -> bool:
        return len(self.trials) < self.max_evals and (
            self.deadline is None or time.perf_counter() < self.deadline)


def search_fp32_set(open_plan: OpenPlan, samples: Sequence, reference: Outputs,
                    objective: Objective, base: PrecisionPlan,
                    ranking: Sequence[str] | Callable[[Score], Sequence[str]],
                    max_evals: int = 60,
                    progress: Callable[[str, int, int], None] | None = None,
                    jobs: int = 1, screen: Screen | None = None,
                    prefetch: bool = False, seconds: float | None = None,
                    regions: Regions | None = None) -> SearchResult:
    """Find a small set of ``ranking`` nodes to keep in FP32 so ``objective`` passes.

    Args:
        open_plan: Plan -> a runner of it, not yet entered (the emulator, or the written
            model on a real engine).
        samples: Calibration samples (``.feeds``); every evaluation uses all of them (a
            metric evaluation stops at the first failing sample).
        reference: Reference outputs on the same samples.
        objective: The accuracy target.
        base: Start plan (default low precision, forced FP32 nodes already in).
        ranking: Candidate nodes, most sensitive first, or a function computing them from the
            start plan's score (called only when the start plan fails, since ranking needs a
            layerwise comparison; the score says which samples fail).
        max_evals: Evaluation budget; when reached, the best passing set so far is returned.
        progress: ``progress("search", done, budget)``.
        jobs: Worker processes running samples in parallel (``search.evalpool``; with
            ``jobs`` > 1, ``open_plan`` is called as ``open_plan(plan, threads)``). The result
            does not depend on it.
        screen: Start plan's outputs (name -> one array per sample) -> the samples that can
            fail (e.g. ``near_ties.at_risk_samples``), or None for all. Grow and shrink then
            run only those; the final evaluation runs every sample, and if a screened-out
            sample fails there, the search continues on every sample from the set found.
        prefetch: Open the runner of the plan most likely evaluated next while one runs
            (``SampleRunner``; two runners alive at once).
        seconds: Wall-time budget: no evaluation starts after it (None: evaluations only).
            Like ``max_evals``, an exhausted budget returns the best passing set so far.
        regions: The ranking -> the regions to search first (``search.regions``: grow and
            ddmin over regions, then inside the regions kept), or None to search by nodes.

    Returns:
        ``SearchResult``.

    Raises:
        TargetNotMetError: Even with every candidate in FP32 the target is not met.
    """
    with SampleRunner(open_plan, samples, list(reference), jobs, prefetch) as runner:
        ev = _Evaluator(runner, samples, reference, objective, base, max_evals, progress)
        if seconds is not None:
            ev.deadline = time.perf_counter() + seconds
        return _search(ev, objective, base, ranking, screen, regions)


def _search(ev: _Evaluator, objective: Objective, base: PrecisionPlan,
            ranking: Sequence[str] | Callable[[Score], Sequence[str]],
            screen: Screen | None, regions: Regions | None = None) -> SearchResult:
    start = ev([], "start", complete=True)
    if start.passed:
        return SearchResult(base, (), start, tuple(ev.trials), (), _outputs_of(ev, []))
    ev.fail_first(start)
    if screen is not None and ev.last_complete is not None:
        at_risk = screen(ev.last_complete)
        if at_risk is not None and objective.metric is not None:
            values = start.detail.get("per_sample") or []
            failing = {i for i, v in enumerate(values) if v is not None
                       and i not in objective.exclude and not objective.meets(v)}
            active = set(at_risk) | failing
            if active and len(active) < len(ev.samples):
                ev.active = active
            # failing samples first (as before), then the decisions closest to flipping
            ev.order = ([i for i in ev.order if i in failing]
                        + [i for i in at_risk if i not in failing]
                        + [i for i in ev.order if i not in active])
    ranking = list(ranking(start) if callable(ranking) else ranking)
    got = regions(ranking) if regions is not None else None
    first = got if isinstance(got, RegionStart) else RegionStart(tuple(got or ()))
    by_regions = None
    if first.top:
        kept, by_regions = search_regions(
            ev, first.top, ranking, lambda nodes: _all_fp32(nodes, ev, objective, start),
            first.rungs, objective.better, first.rerank)
    else:
        kept = _grow_shrink(ranking, ev, objective, start)
    score = ev(kept, "final", complete=True)
    if not score.passed and ev.active is not None:
        # a screened-out sample fails after all: search again on every sample, from there
        ev.active = None
        ev.cache = {k: v for k, v in ev.cache.items() if v[1]}
        ev.fail_first(score)
        ranking = kept + [n for n in ranking if n not in set(kept)]
        kept = _grow_shrink(ranking, ev, objective, start)
        score = ev(kept, "final", complete=True)
    plan = base.keep_fp32(kept, "search", "needed to meet the target (accuracy search)")
    return SearchResult(plan, tuple(kept), score, tuple(ev.trials), tuple(ranking[:50]),
                        _outputs_of(ev, kept), by_regions)


def _grow_shrink(ranking: list[str], ev: _Evaluator, objective: Objective, start: Score
                 ) -> list[str]:
    """Bisect to the shortest passing prefix of ``ranking``, then ddmin it.

    The full prefix (every candidate in FP32) is assumed to pass and evaluated only when no
    shorter prefix does (one evaluation of every sample saved in the common case).
    """
    lo, hi = 0, len(ranking)  # lo fails; hi passes (hi = len(ranking): not yet checked)
    while hi - lo > 1 and ev.budget_left:
        mid = (lo + hi) // 2
        # most prefixes fail on the way up: open the next one's runner ahead on that guess
        if ev(ranking[:mid], "grow", then=ranking[:(mid + hi) // 2]).passed:
            hi = mid
        else:
            lo = mid
    if hi == len(ranking):  # no shorter prefix passed: everything in FP32 must
        _all_fp32(list(ranking), ev, objective, start)
    return _ddmin(list(ranking[:hi]), ev)


def _all_fp32(nodes: list[str], ev: _Evaluator, objective: Objective, start: Score) -> None:
    """Evaluate every candidate in FP32 on every sample.

    Raises:
        TargetNotMetError: Even that fails.
    """
    full = ev(nodes, "all-fp32", complete=True)
    if not full.passed:
        best = full if objective.better(full, start) else start
        raise TargetNotMetError(
            f"the target ({objective.describe()}) is not met even with all {len(nodes)} "
            f"candidate nodes in FP32: best score {best.value:.4g}. Either nodes excluded "
            "from the search (--force-low, or kept low by the plan) break it, or the "
            "evaluating engine differs from the FP32 reference beyond the target in FP32 "
            "itself (e.g. TF32 on, other kernels): loosen the target or check the engine.",
            best=best.value)


def _outputs_of(ev: _Evaluator, nodes: Sequence[str]) -> Outputs | None:
    last = ev.last_passing
    return last[1] if last is not None and last[0] == frozenset(nodes) else None


def _ddmin(nodes: list[str], ev: _Evaluator) -> list[str]:
    """Remove nodes while the target still passes (``regions.ddmin`` over nodes), then try
    the empty set after a single node."""
    nodes, _ = ddmin(nodes, lambda rest, after: ev(rest, "shrink", then=after).passed,
                     lambda: ev.budget_left)
    if len(nodes) == 1 and ev.budget_left and ev([], "shrink").passed:
        return []
    return nodes
