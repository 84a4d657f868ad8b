"""The rank stage of ``fix``: candidates by measured sensitivity, the overflow regions the same
layerwise comparison measured, and whether the search goes by regions first.

    StartPlan -> rank -> Ranking   (called by the search only when the start plan fails)

Region search (``search.regions``) is chosen from what the ranking measured, so that models the
node search already handles keep their plans: it runs when the start plan's overflow regions
(``diagnosis.causes.cures.layerwise_regions``: tensors whose FP32 magnitude exceeds the target
format's max, their producers and readers) hold at least ``REGION_MIN_OVERFLOW`` candidate
nodes and the exporter's module paths (``graph.source.node_modules``) split the candidates into
at least 2 regions. 16 = 4 overflow regions of a residual block (producer Add, its readers'
GroupNorm/Conv/Add): below it the node search's ddmin costs at most ~2 x 16 x log2(N)
evaluations, within the default budget of 150 for N up to ~1000 nodes; PP-OCRv4 det and rec
(paddle2onnx, no module paths) and the Whisper encoder (0 FP32 nodes after the rewrites) stay
on the node search.

With the regions come the rungs of the range floor (``search.regions``, step 0): the overflow
regions of the tensors of the same layerwise comparison whose FP32 magnitude on any sample
(``repair.rewrites_proof.tensor_maxima``: one FP32 run of every sample) exceeds the format's
max / 2^k for k in ``RUNG_SHIFTS`` = 0, 1, 3, 5, 7 (65504 down to 512 for FP16:
512 is ModelOpt AutoCast's default ``data_max``, the most any rung keeps for range).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import onnx

from precision_doctor.diagnosis.causes.cures import (
    expand_with_regions,
    layerwise_regions,
    overflow_regions,
)
from precision_doctor.diagnosis.causes.hazards import Hazard
from precision_doctor.formats import FORMATS, Precision
from precision_doctor.graph.outputs import producer_inputs
from precision_doctor.graph.source import node_modules
from precision_doctor.layerwise.candidates import emulated, reference_factory
from precision_doctor.layerwise.compare import LayerwiseResult, compare_layerwise
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.repair.rewrites_proof import tensor_maxima
from precision_doctor.runners.kernels.engines import conv_bias_of
from precision_doctor.search.near_ties import DECISION_METRICS, decision_output
from precision_doctor.search.objective import Objective, Score
from precision_doctor.search.ranking import rank_by_sensitivity, upstream_first
from precision_doctor.search.regions import RangeRung, Region, RegionStart, region_tree

RANKING_SAMPLES = 2  # layerwise ranking uses the worst samples; every evaluation uses all
REGION_MIN_OVERFLOW = 16  # candidate nodes in overflow regions from which regions go first
REGION_SEARCH = True  # False: always the node search (benchmarks/search_regions.py compares)
RUNG_SHIFTS = (0, 1, 3, 5, 7)  # the range floor's thresholds: format max / 2^k


@dataclass(frozen=True)
class Ranking:
    """Candidate nodes by measured sensitivity, most sensitive first.

    Attributes:
        nodes: The ranked candidates.
        samples: Indices of the samples the layerwise comparison ran on.
        seconds: Wall time of this stage.
        overflow: Candidate node -> its overflow region (candidates only, graph order).
        peak: Largest finite |x| of any tensor in the FP32 reference on those samples.
        regions: Top-level regions the search goes by first (``search.regions``); empty for
            the node search.
        rungs: The range floor's ladder (with ``regions`` only).
    """

    nodes: tuple[str, ...]
    samples: tuple[int, ...]
    seconds: float
    overflow: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False)
    peak: float = 0.0
    regions: tuple[Region, ...] = ()
    rungs: tuple[RangeRung, ...] = ()

    @property
    def overflow_nodes(self) -> int:
        """Candidate nodes in overflow regions."""
        return len(self.overflow)


def rank(model: onnx.ModelProto, samples: Sequence, objective: Objective, target: Precision,
         engine: str | None, plan: PrecisionPlan, hazards: Sequence[Hazard],
         candidates: Sequence[str], output_names: Sequence[str], start_score: Score,
         rungs: bool = True) -> Ranking:
    """Rank the candidates with one layerwise comparison of the start plan.

    Metric objectives rank on the ``RANKING_SAMPLES`` worst-scored samples, tolerance objectives
    on the first ones (choosing them by error share per element gave det a ranking whose search
    kept 14 FP32 nodes instead of 9 and a 4x longer layerwise pass, measured 2026-11-24).
    Decomposed-LayerNorm nodes come first; for a decision metric, the nodes feeding the decision
    output come before the others (rounding elsewhere cannot flip it).

    Args:
        model: The rewritten FP32 model.
        samples: Calibration samples.
        objective: The objective with the samples' contexts.
        target: FP16 or BF16.
        engine: Deployment engine (its convolution bias model), or None.
        plan: The start plan.
        hazards: The start plan's static hazards.
        candidates: Nodes the search may move to FP32.
        output_names: The graph outputs, in order.
        start_score: The start plan's score (which samples fail).
        rungs: Measure the range floor's rungs where regions go first (on every sample).

    Returns:
        ``Ranking``, with the regions to search first when range needs many nodes (module
        docstring).

    Raises:
        BackendError: ONNX Runtime fails on a segment.
    """
    t0 = time.perf_counter()
    worst = (objective.worst_samples(start_score, RANKING_SAMPLES, len(samples))
             if objective.metric is not None
             else list(range(min(RANKING_SAMPLES, len(samples)))))
    cand = emulated(plan, conv_bias_of(engine))
    lw = compare_layerwise(model, [samples[i].feeds for i in worst], reference_factory,
                           cand.factory, target, threshold=1e-2,
                           candidate_graph=cand.graph)
    layernorms = [n for h in hazards if h.kind == "decomposed-layernorm" for n in h.nodes]
    ranked = rank_by_sensitivity(lw, list(candidates), producer_inputs(model), layernorms)
    # an overflowing node is cured only with the nodes reading its values (diagnosis.causes.cures)
    overflow = layerwise_regions(model, lw)
    ranked = expand_with_regions(ranked, overflow)
    if objective.metric is not None and objective.metric.name in DECISION_METRICS:
        ranked = upstream_first(ranked, model, decision_output(objective, output_names))
    allowed = set(candidates)
    overflow = {n: tuple(m for m in r if m in allowed) for n, r in overflow.items()
                if n in allowed}
    peak = max((r.ref_max_abs for r in lw.records), default=0.0)
    top = tuple(search_regions_of(model, ranked, overflow))
    ladder = range_rungs(model, lw, samples, ranked, overflow, allowed) if top and rungs else ()
    return Ranking(tuple(ranked), tuple(worst), time.perf_counter() - t0, overflow, peak, top,
                   ladder)


def range_rungs(model: onnx.ModelProto, lw: LayerwiseResult, samples: Sequence,
                ranked: Sequence[str], overflow: dict[str, tuple[str, ...]], allowed: set[str]
                ) -> tuple[RangeRung, ...]:
    """The range floor's ladder (module docstring): one rung per threshold of
    ``RUNG_SHIFTS`` that adds nodes, each holding the rungs above it.

    Args:
        model: The rewritten FP32 model.
        lw: The ranking's layerwise comparison: its tensors, their FP32 magnitudes on its
            samples (``ref_max_abs``), taken over every sample (``tensor_maxima``: a value
            that leaves the range on one sample only is there too).
        samples: Every calibration sample.
        ranked: The ranked candidates.
        overflow: The candidates' overflow regions above the format's max.
        allowed: The candidates.

    Raises:
        BackendError: ONNX Runtime fails on the FP32 model.
    """
    limit = FORMATS[Precision(lw.target)].max
    magnitude = {r.tensor: r.ref_max_abs for r in lw.records}
    for name, peak in tensor_maxima(model, list(magnitude), samples).items():
        magnitude[name] = max(magnitude[name], peak)
    rank = {n: i for i, n in enumerate(ranked)}
    rungs: list[RangeRung] = []
    nodes = set(overflow)
    for k in RUNG_SHIFTS:
        threshold = limit / 2.0 ** k
        hot = {t for t, peak in magnitude.items() if peak > threshold}
        nodes |= {m for region in overflow_regions(model, hot).values() for m in region
                  if m in allowed}
        if nodes and (not rungs or len(nodes) > len(rungs[-1].nodes)):
            rungs.append(RangeRung(threshold,
                                   tuple(sorted(nodes, key=lambda n: rank.get(n, len(rank))))))
    return tuple(rungs)


@dataclass
class Ranker:
    """The search's ranking callbacks (``search.bisection.search_fp32_set``): the ranking from
    the start plan's score, the regions to search first, and the ranking again on top of the
    range floor (``search.regions``). The arguments are ``rank``'s."""

    model: onnx.ModelProto
    samples: Sequence
    objective: Objective
    target: Precision
    engine: str | None
    plan: PrecisionPlan
    hazards: Sequence[Hazard]
    candidates: Sequence[str]
    output_names: Sequence[str]
    done: list[Ranking] = field(default_factory=list)
    start_score: Score | None = None

    def __call__(self, start_score: Score) -> list[str]:
        self.start_score = start_score
        return list(self._rank(self.plan).nodes)

    def regions(self, _ranking: Sequence[str]) -> RegionStart | None:
        """The last ranking's regions and range ladder (None before any ranking)."""
        if not self.done:
            return None
        last = self.done[-1]
        return RegionStart(last.regions, last.rungs, self.again)

    def again(self, floor: Sequence[str]) -> tuple[list[str], tuple[Region, ...]]:
        """Rank again with ``floor`` in FP32: the candidates and their top regions."""
        ranking = self._rank(self.plan.keep_fp32(floor, "search", "range floor"), rungs=False)
        return list(ranking.nodes), ranking.regions

    @property
    def seconds(self) -> float:
        """Wall time of every ranking."""
        return sum(r.seconds for r in self.done)

    def _rank(self, plan: PrecisionPlan, rungs: bool = True) -> Ranking:
        assert self.start_score is not None  # __call__ ranks first
        self.done.append(rank(self.model, self.samples, self.objective, self.target,
                              self.engine, plan, self.hazards, self.candidates,
                              self.output_names, self.start_score, rungs))
        return self.done[-1]


def search_regions_of(model: onnx.ModelProto, ranked: Sequence[str],
                      overflow: dict[str, tuple[str, ...]]) -> list[Region]:
    """The top-level regions to search first, or ``[]`` for the node search (module
    docstring: at least ``REGION_MIN_OVERFLOW`` candidates in overflow regions, and module
    paths that split the candidates into at least 2 regions)."""
    if not REGION_SEARCH or len(overflow) < REGION_MIN_OVERFLOW:
        return []
    modules = node_modules(model)
    if sum(modules.get(n) is not None for n in ranked) < len(ranked) / 2:
        return []  # no module paths to group by (paddle2onnx, tf2onnx names)
    top = region_tree(ranked, modules, overflow)
    return top if len(top) >= 2 else []


__all__ = ["RANKING_SAMPLES", "REGION_MIN_OVERFLOW", "RUNG_SHIFTS", "Ranker", "Ranking",
           "range_rungs", "rank", "search_regions_of"]
