"""Impact trials: the output error when given nodes run in FP32, one emulated evaluation each,
remembered, and on a GPU several evaluated together shape by shape; and the findings ranked
by what the trials measure (``rank_findings``, ``group_findings``).

``ImpactTrials(...)(nodes)`` is ``diagnosis.causes.explain``'s ``measure``: the candidate's plan
with ``nodes`` kept in FP32, emulated on every sample, and the largest relative L2 error of the
outputs against the FP32 reference (``compare.metrics.relative_l2``). A node set measured once
is not measured again (the joint remedy of a single finding is that finding).

On a GPU every trial plan is a feed of the one switched emulation (``runners.sessions.switched``)
and what costs is a change of input shape: ONNX Runtime's CUDA convolutions build their cuDNN
plans again at each (0.1-0.4 s a run against 6-38 ms on an unchanged shape, PP-OCRv4 rec on an
H200, ``benchmarks/probes/gpu_switched_runs.py``). Trials one after the other walk the samples'
shapes once each; ``prefetch`` walks them once for all its trials: for every group of samples of one
shape (``runners.batching``), every trial's batched run. The errors are the same numbers:
outputs come from the same batches, and each sample's ``l2_terms`` are added in sample order
as ``relative_l2`` adds them. Where the trials do not share a switched session (the CPU, a
model without a batch dimension, a plan the switched graph cannot express), ``prefetch`` does
nothing and each trial runs on its own; on the CPU incrementally (``search.incremental``): from
the first segment whose decisions no earlier trial's kept state shares.
"""

from __future__ import annotations

import math
import time
from contextlib import ExitStack
from dataclasses import replace
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.compare.metrics import l2_terms, relative_l2, relative_l2_of
from precision_doctor.diagnosis.causes.findings import (
    MAX_FINDINGS,
    MINOR_IMPACT,
    NOT_MEASURED,
    SEVERITY_RANK,
    Finding,
)
from precision_doctor.errors import BackendError
from precision_doctor.layerwise.candidates import emulated, float32_outputs, run_samples
from precision_doctor.layerwise.compare import LAYERWISE_BUDGET
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners import device
from precision_doctor.runners.batching import batches_on, checked, groups, run_checked, shape_order
from precision_doctor.runners.sessions import switched
from precision_doctor.search.incremental import IncrementalEmulation, incremental_scope

Outputs = Mapping[str, Sequence[np.ndarray]]
# Wall time of the findings' measurements, at least: 60 s is about 12 emulated evaluations of
# a model whose plain run takes 5 s on the CPU (MAX_FINDINGS impacts), and more than every
# tiny or OCR model's whole diagnosis takes (PP-OCRv4 det: about 34 s on 2 cores)
FINDINGS_MIN_SECONDS = 60.0


class ImpactTrials:
    """Output error of ``plan`` with given nodes kept in FP32 (see the module docstring).

    Args:
        model: The FP32 model.
        plan: The candidate's plan.
        conv_bias: The candidate's convolution bias model (``precision.conv_bias``).
        samples: Objects with ``.feeds``.
        reference: The FP32 reference outputs, one array per sample.
        names: The outputs compared.
        seconds: Wall-time budget of the measurements, from now (None: none); ``affordable``
            says whether a new one still fits. Measurements already made are always free.
    """

    def __init__(self, model: onnx.ModelProto, plan: PrecisionPlan, conv_bias: str,
                 samples: Sequence, reference: Outputs, names: Sequence[str],
                 seconds: float | None = None) -> None:
        self.model, self.plan, self.conv_bias = model, plan, conv_bias
        self.seconds = seconds
        self._deadline = None if seconds is None else time.perf_counter() + seconds
        self.samples, self.reference, self.names = samples, reference, list(names)
        self.errors: dict[frozenset[str], float] = {}
        self.evaluations = 0
        self._incremental_done = False  # _incremental() decided
        self._scope: IncrementalEmulation | None = None

    def _plan(self, nodes: Iterable[str]) -> PrecisionPlan:
        return self.plan.keep_fp32(list(nodes), "diagnose")

    def __call__(self, nodes: Sequence[str]) -> float:
        """The largest relative L2 error of the outputs with ``nodes`` in FP32.

        A trial whose run fails after an earlier one ran (a plan whose data-dependent shapes
        break the graph, e.g. an empty tensor a Reshape cannot take) has an infinite error.

        Raises:
            BackendError: The emulation fails, and no earlier trial ran.
        """
        key = frozenset(nodes)
        if key not in self.errors:
            try:
                self.errors[key] = self._measure(self._plan(nodes))
            except BackendError:
                if not any(math.isfinite(e) for e in self.errors.values()):
                    raise
                self.errors[key] = math.inf
            self.evaluations += 1
        return self.errors[key]

    def _measure(self, plan: PrecisionPlan) -> float:
        incremental = self._incremental()
        if incremental is not None:  # from the first segment the trial changes
            with incremental.runner(plan) as runner:
                got = [float32_outputs(runner.run_sample(i, s.feeds), self.names)
                       for i, s in enumerate(self.samples)]
            outs = {n: [g[n] for g in got] for n in self.names}
        else:
            trial = emulated(plan, self.conv_bias)
            outs = run_samples(trial.factory(self.model), self.samples, self.names)
        return max(relative_l2(self.reference[n], outs[n]) for n in self.names)

    def _incremental(self) -> IncrementalEmulation | None:
        """The trials' incremental evaluation on the CPU (``search.incremental``; its kept
        states within the layerwise budget, so diagnose's peak memory stays its layerwise
        pass's), opened on the first trial; None where it does not apply (a GPU's switched
        session serves the trials)."""
        if not self._incremental_done:
            self._incremental_done = True
            if not switched.serves(device.current()):
                scope = incremental_scope(self.model, self.plan.default, self.samples,
                                          self.conv_bias, cache_bytes=LAYERWISE_BUDGET)
                self._scope = scope if isinstance(scope, IncrementalEmulation) else None
        return self._scope

    def affordable(self, nodes: Sequence[str]) -> bool:
        """Whether measuring ``nodes`` fits the wall-time budget (``seconds`` from the
        trials' creation): already measured, no budget, or time left."""
        return (frozenset(nodes) in self.errors or self._deadline is None
                or time.perf_counter() < self._deadline)

    def close(self) -> None:
        """Close the incremental evaluation's sessions (the measured errors stay)."""
        if self._scope is not None:
            self._scope.close()
        self._scope = None

    def prefetch(self, node_sets: Iterable[Sequence[str]]) -> int:
        """Measure the node sets not yet measured together, shape by shape, where they share a
        GPU's switched emulation; returns how many were measured (0: none, each will run on
        its own when asked).

        Raises:
            BackendError: The emulation fails.
        """
        todo = list(dict.fromkeys(frozenset(n) for n in node_sets if n))
        todo = [k for k in todo if k not in self.errors]
        feeds = [s.feeds for s in self.samples]
        if len(todo) < 2 or not switched.serves(device.current()) \
                or not batches_on(True, self.model, len(feeds)):
            return 0
        with ExitStack() as stack:
            runners = [stack.enter_context(
                emulated(self._plan(k), self.conv_bias).factory(self.model)) for k in todo]
            if any(getattr(r, "_switch", None) is None for r in runners):
                return 0  # not one shared session: nothing to gain
            order = shape_order(feeds)
            verdict = checked(self.model)
            if verdict is False:
                return 0
            terms: dict[str, list[list[tuple[float, float] | None]]] = {
                n: [[None] * len(feeds) for _ in todo] for n in self.names}
            probed = verdict is True
            for group in groups([feeds[i] for i in order]):
                members = [order[j] for j in group]
                for t, runner in enumerate(runners):
                    results = self._run(runner, [feeds[i] for i in members], probed)
                    if results is None:
                        return 0  # axis 0 is not the sample axis: each trial on its own
                    probed = probed or len(members) > 1
                    for i, result in zip(members, results):
                        out = float32_outputs(result, self.names)
                        for n in self.names:
                            terms[n][t][i] = l2_terms(self.reference[n][i], out[n])
        for t, key in enumerate(todo):
            self.errors[key] = max(relative_l2_of(terms[n][t]) for n in self.names)
            self.evaluations += 1
        return len(todo)

    def _run(self, runner, feeds: Sequence[Mapping[str, np.ndarray]], probed: bool
             ) -> list[dict[str, np.ndarray]] | None:
        """One group's outputs per sample: one run, batched and checked against its first
        sample alone the first time (``runners.batching.run_checked``), or None."""
        if len(feeds) == 1:
            return [runner.run(feeds[0])]
        return run_checked(runner, feeds, self.names, self.model, probed)


def affordable(measure: Callable[[Sequence[str]], float], nodes: Sequence[str]) -> bool:
    """Whether ``measure`` (``ImpactTrials`` or any callable) can still measure ``nodes``
    within its wall-time budget (a callable without one always can; ``nodes`` empty: whether
    any time is left)."""
    check = getattr(measure, "affordable", None)
    return True if check is None else bool(check(nodes))


def measured_first(findings: Sequence[Finding], limit: int = MAX_FINDINGS) -> list[int]:
    """Indices of the findings ``rank_findings`` measures, in its order: errors first, then
    warnings, then info, each in detection order; at most ``limit``."""
    return sorted(range(len(findings)),
                  key=lambda i: (SEVERITY_RANK[findings[i].severity], i))[:limit]


def rank_findings(findings: Sequence[Finding],
                  measure: Callable[[Sequence[str]], float] | None,
                  baseline_error: float, limit: int = MAX_FINDINGS) -> list[Finding]:
    """Attach measured impact and sort: impact (desc), then severity, then detection order.

    Args:
        findings: Unranked findings.
        measure: Output error when the given nodes run in FP32 (None: do not measure).
        baseline_error: Output error of the candidate as is.
        limit: Findings whose impact is measured (errors first); the rest keep None.

    Returns:
        Ranked findings.
    """
    ranked = list(findings)
    if measure is not None and baseline_error > 0:
        chosen = measured_first(findings, limit)
        for i in set(range(len(findings))) - set(chosen):
            if findings[i].impact is None:
                ranked[i] = replace(findings[i], not_measured=NOT_MEASURED["limit"].format(
                    limit=limit))
        done = 0
        for i in chosen:
            f = findings[i]
            if not affordable(measure, f.nodes):
                if f.impact is None:
                    ranked[i] = replace(f, not_measured=NOT_MEASURED["budget"].format(
                        seconds=getattr(measure, "seconds", 0.0) or 0.0, done=done))
                continue
            done += 1
            after = measure(f.nodes)
            if math.isinf(baseline_error):
                impact = 1.0 if math.isfinite(after) else 0.0
            else:
                impact = max(0.0, (baseline_error - after) / baseline_error)
            ranked[i] = Finding(**{**f.__dict__, "impact": impact, "not_measured": "",
                                   "evidence": {**f.evidence, "output_error_if_fp32": after}})
    keyed = sorted(range(len(ranked)), key=lambda i: (
        -(ranked[i].impact or 0.0), SEVERITY_RANK[ranked[i].severity], i))
    return [ranked[i] for i in keyed]


def group_findings(findings: Sequence[Finding], min_impact: float = MINOR_IMPACT
                   ) -> list[Finding]:
    """Set each finding's ``group``: ``minor`` when its measured impact is below
    ``min_impact``, or when it was not measured and is only a warning/info; else ``main``.
    A finding measured on top of the main cure (``residual_share``) is main when it removes
    at least half of what that cure leaves (or its own impact is main), else minor.
    Order is kept (main and minor interleave as ranked; reports split them)."""
    out = []
    for f in findings:
        minor = (f.impact < min_impact) if f.impact is not None else f.severity != "error"
        if "joint_cause" in f.evidence:  # measured 0% alone, but part of a joint cure
            minor = False
        residual = f.evidence.get("residual_share")
        if isinstance(residual, float):  # measured on top of the main cure (joint.residual_shares)
            minor = residual < 0.5 and (f.impact is None or f.impact < min_impact)
        out.append(replace(f, group="minor" if minor else "main"))
    return out
