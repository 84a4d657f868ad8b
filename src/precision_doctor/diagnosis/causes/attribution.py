"""Attribution by measured cure: the small set of nodes whose FP32 fallback removes the error.

Runs when the findings (range events, amplifiers) jointly explain less than half of a failing
output's error: the cause is then one no rule anticipated, and the tool looks for it by
measurement instead of by pattern. It reuses the fix search (``search.bisection``): candidates
ranked by measured sensitivity (overflow and Inf births first, then local error gain), each
overflowing node followed by its overflow region (``diagnosis.causes.cures``), bisection for the
shortest passing prefix, then ddmin to the smallest subset. The target is that the FP32
fallback leaves at most ``RESIDUAL`` (10%) of the baseline error, i.e. removes >= 90%.

Cost bounds: the search runs on the ``SAMPLES`` samples with the largest share of the output
error (the joint impact is then measured on all samples by the caller), with at most
``MAX_EVALS`` evaluations and a wall-time budget (``seconds``), each evaluation stopping at the
first sample that decides a failure. A set of more than ``max(MIN_SMALL, SMALL_SHARE x
candidates)`` nodes is not a *small* set: the error is then spread over the model, and the
result says so (``status`` ``spread``), unless the budget ran out before the search could
narrow the set down (``status`` ``budget``). The wall-time budget is what bounds the cost;
``MAX_EVALS`` only stops a runaway: on Magika in BF16 the 6-node cure of a cancelling variance
took 75 evaluations in 4.5 s, and 82 in 4.8 s once one line of one of its 24 samples (a shell
script) changed; the former cap of 64 ended the first at a 7-node set and the second at 9 nodes,
"budget", and the diagnosis called the model unexplained
(``benchmarks/probes/attribution_budget.py``, ``attribution_budget_2026-11-28_cpu2.json``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.compare.metrics import relative_l2
from precision_doctor.compare.tolerance import Tolerance
from precision_doctor.diagnosis.causes.cures import expand_with_regions
from precision_doctor.errors import TargetNotMetError
from precision_doctor.graph.outputs import consumers
from precision_doctor.layerwise.compare import LAYERWISE_BUDGET, LayerwiseResult
from precision_doctor.precision.conv_bias import FUSED
from precision_doctor.precision.plan import DATA_MOVEMENT_OPS, PrecisionPlan
from precision_doctor.runners.device import CPU
from precision_doctor.runners.device import current as current_device
from precision_doctor.runners.device import use as use_device
from precision_doctor.runners.emulator import EmulatorRunner
from precision_doctor.runners.sessions import switched
from precision_doctor.runners.sessions.cpu_arena import shared_cpu
from precision_doctor.search.bisection import search_fp32_set
from precision_doctor.search.cost import compute_nodes
from precision_doctor.search.incremental import (
    IncrementalEmulation,
    IncrementalRunner,
    incremental_scope,
)
from precision_doctor.search.objective import Objective, Outputs, sample_error
from precision_doctor.search.ranking import rank_by_sensitivity

RESIDUAL = 0.1
SAMPLES = 2
MAX_EVALS = 160
MIN_SECONDS = 20.0  # the wall-time budget is never below this
MIN_SMALL = 8
SMALL_SHARE = 0.05


@dataclass(frozen=True)
class Attribution:
    """What the attribution search found.

    Attributes:
        status: ``found`` (a small set removes >= 90% on the searched samples), ``spread``
            (only a set larger than ``small_limit`` does), ``budget`` (the budget ran out
            before the set was narrowed below ``small_limit``), ``none`` (not even every
            candidate in FP32 does, e.g. the error comes from nodes outside the search).
        nodes: The set found (empty unless ``found``), graph order.
        clusters: ``nodes`` split into connected groups (a chain of ops is one cause).
        samples: Indices of the samples searched on.
        evaluations / seconds: The search's cost.
        small_limit: The largest set size that counts as small.
        kept: The set the search ended with, whatever its size.
    """

    status: str
    nodes: tuple[str, ...] = ()
    clusters: tuple[tuple[str, ...], ...] = ()
    samples: tuple[int, ...] = ()
    evaluations: int = 0
    seconds: float = 0.0
    small_limit: int = MIN_SMALL
    kept: tuple[str, ...] = field(default=(), repr=False)

    def to_dict(self) -> dict:
        return {"status": self.status, "nodes": list(self.nodes),
                "clusters": [list(c) for c in self.clusters], "samples": list(self.samples),
                "evaluations": self.evaluations, "seconds": round(self.seconds, 3),
                "small_limit": self.small_limit, "kept_size": len(self.kept)}


def worst_samples(reference: Outputs, candidate: Outputs, outputs: Sequence[str],
                  count: int = SAMPLES) -> list[int]:
    """Indices of the ``count`` samples with the largest squared error (summed over
    ``outputs``, each relative to its total reference norm), worst first."""
    n = len(next(iter(reference.values())))
    load = np.zeros(n)
    for name in outputs:
        errs = [sample_error(r, c) for r, c in zip(reference[name], candidate[name])]
        total = sum(e[0] for e in errs) or 1.0
        load += [np.inf if (e[1] or e[2]) else e[0] / total for e in errs]
    return sorted(range(n), key=lambda i: (-load[i], i))[:count]


def attribute(model: onnx.ModelProto, samples: Sequence, reference: Outputs,
              candidate: Outputs, plan: PrecisionPlan, failing: Mapping[str, float],
              layerwise: LayerwiseResult, inputs_of: Mapping[str, Sequence[str]],
              regions: Mapping[str, tuple[str, ...]], max_evals: int | None = None,
              seconds: float = MIN_SECONDS,
              progress: Callable[[str, int, int], None] | None = None,
              conv_bias: str = FUSED) -> Attribution:
    """Search the small FP32 set that removes >= 90% of the failing outputs' error.

    Args:
        model: The FP32 model (nodes named).
        samples: All samples (``.feeds``).
        reference / candidate: Output name -> one array per sample (the plain runs).
        plan: The emulated candidate's plan (the search's start).
        failing: Failing output name -> its rel L2 over all samples.
        layerwise: The layerwise comparison (ranking by sensitivity).
        inputs_of: ``graph.outputs.producer_inputs(model)``.
        regions: ``diagnosis.causes.cures.overflow_regions`` of the model.
        max_evals: Evaluation budget (None: ``MAX_EVALS``).
        seconds: Wall-time budget (at least ``MIN_SECONDS``).
        progress: ``progress("attribution", done, budget)``.
        conv_bias: The candidate's convolution bias model (``precision.conv_bias``).

    Returns:
        The ``Attribution``.
    """
    t0 = time.perf_counter()
    max_evals = MAX_EVALS if max_evals is None else max_evals
    chosen = worst_samples(reference, candidate, list(failing))
    sub = [samples[i] for i in chosen]
    ref = {k: [v[i] for i in chosen] for k, v in reference.items()}
    cand = {k: [v[i] for i in chosen] for k, v in candidate.items()}
    tolerances: dict[str, Tolerance] = {"*": Tolerance(rel_l2=None)}
    for name in failing:
        base = relative_l2(ref[name], cand[name])
        tolerances[name] = Tolerance(rel_l2=RESIDUAL * base if np.isfinite(base) else None)
    objective = Objective(tolerances=tolerances)
    forced = set(plan.overrides)
    candidates = [n.name for n in compute_nodes(model) if n.name not in forced]
    limit = max(MIN_SMALL, int(SMALL_SHARE * len(candidates)))
    ranking = expand_with_regions(rank_by_sensitivity(layerwise, candidates,
                                                      {k: list(v) for k, v in inputs_of.items()}),
                                  regions)

    scope: IncrementalEmulation | None = None  # set by the `with` below, before any plan

    def open_plan(p: PrecisionPlan, threads: int = 0) -> EmulatorRunner | IncrementalRunner:
        if scope is not None and not threads:  # each plan from the first segment it changes
            return scope.runner(p)
        return EmulatorRunner(model, p, intra_op_threads=threads, conv_bias=conv_bias)

    def report(stage: str, done: int, total: int) -> None:
        if progress:
            progress("attribution", done, total)

    # its evaluations run 2 samples: on a GPU, opening a CUDA session per plan cost more than
    # the runs saved (PP-OCRv4 rec, 256 strips, on an H100: 70.8 s on the GPU, 35.7 s on its
    # CPU; BENCHMARKS.md), so without a switched session (one for every plan:
    # runners.sessions.switched) they run on the CPU whatever the device
    here = current_device()
    where = here if switched.serves(here) else CPU
    try:
        # kept states within the layerwise budget: diagnose's peak memory stays its layerwise
        # pass's
        with shared_cpu(), use_device(where), \
                incremental_scope(model, plan.default, sub, conv_bias,
                                  cache_bytes=LAYERWISE_BUDGET) as scope:
            result = search_fp32_set(open_plan, sub, ref, objective, plan, ranking, max_evals,
                                     report, seconds=max(seconds, MIN_SECONDS))
    except TargetNotMetError:
        return Attribution("none", samples=tuple(chosen), evaluations=max_evals,
                           seconds=time.perf_counter() - t0, small_limit=limit)
    order = {n.name: i for i, n in enumerate(model.graph.node)}
    kept = tuple(sorted(result.kept, key=lambda n: order.get(n, 0)))
    exhausted = (result.evaluations >= max_evals
                 or time.perf_counter() - t0 >= max(seconds, MIN_SECONDS))
    status = ("found" if 0 < len(kept) <= limit and result.score.passed else
              "none" if not kept or not result.score.passed else
              "budget" if exhausted else "spread")
    nodes = kept if status == "found" else ()
    return Attribution(status, nodes, connected_groups(model, nodes), tuple(chosen),
                       result.evaluations, time.perf_counter() - t0, limit, kept)


def connected_groups(model: onnx.ModelProto, nodes: Sequence[str]
                     ) -> tuple[tuple[str, ...], ...]:
    """``nodes`` split into groups connected through tensors (directly, or through
    data-movement ops only), each in graph order; groups ordered by their first node."""
    wanted = set(nodes)
    if not wanted:
        return ()
    readers = consumers(model)
    by_name = {n.name: n for n in model.graph.node}
    parent = {n: n for n in wanted}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for name in wanted:
        todo = list(by_name[name].output) if name in by_name else []
        seen: set[str] = set()
        while todo:
            t = todo.pop()
            if t in seen:
                continue
            seen.add(t)
            for c in readers.get(t, ()):
                if c.name in wanted:
                    parent[find(c.name)] = find(name)
                elif c.op_type in DATA_MOVEMENT_OPS:
                    todo.extend(c.output)
    order = {n.name: i for i, n in enumerate(model.graph.node)}
    groups: dict[str, list[str]] = {}
    for n in sorted(wanted, key=lambda x: order.get(x, 0)):
        groups.setdefault(find(n), []).append(n)
    return tuple(tuple(g) for g in sorted(groups.values(), key=lambda g: order.get(g[0], 0)))


__all__ = ["Attribution", "attribute", "connected_groups", "worst_samples"]
