"""Layerwise comparison: every intermediate floating tensor of a candidate vs the reference.

The graph is cut into consecutive segments that fit a memory budget, and each segment runs
once per precision and sample, fed with its own runner's boundary tensors (see
``layerwise_engines``); where no cut is possible (control flow, a candidate that runs a model
of its own) tensors are marked as outputs in chunks instead, and the result says why.
Statistics are streamed over samples, so only one segment of one sample is held in memory
(on a GPU, one segment of a batch of samples that fits the same budget: ``batched_samples``).
Per tensor it records the error (relative L2, max/mean abs), NaN/Inf in the candidate, the
reference's range against the target format (overflow above its max, flush-to-zero below half
its smallest subnormal, subnormals) and the headroom in bits, log2(format max / observed max).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.errors import PrecisionDoctorError
from precision_doctor.formats import FORMATS, FloatFormat, Precision
from precision_doctor.graph.outputs import TensorSite, float_activations, producer_inputs
from precision_doctor.graph.segments import (
    cut_like,
    missing_types,
    plan_segments,
    why_not_segmentable,
)
from precision_doctor.graph.shapes import infer_types
from precision_doctor.layerwise import fused
from precision_doctor.layerwise.engines import (
    CandidateGraph,
    Progress,
    RunnerFactory,
    SegmentFallback,
    node_output_bytes,
    run_marking,
    run_segments,
    side_thread,
)
from precision_doctor.layerwise.gain import nonfinite_birth
from precision_doctor.layerwise.resident import ResidentStats
from precision_doctor.layerwise.stats import LayerRecord, StatsPool, _Accumulator
from precision_doctor.runners import device
from precision_doctor.runners.batching import MAX_BATCH, batch_symbol, groups
from precision_doctor.runners.sessions.cpu_arena import shared_cpu

__all__ = ["LAYERWISE_BUDGET", "LayerRecord", "LayerwiseResult", "Progress", "RunnerFactory",
           "WholeGraph", "_Accumulator", "compare_layerwise"]

MODES = ("segments", "marking")
# model -> (the candidate's own whole graph, a runner factory for its sub-models)
WholeGraph = Callable[[onnx.ModelProto], "tuple[onnx.ModelProto, RunnerFactory] | None"]
# Default bytes of one segment (outputs + weights, both runners, one sample). Segments cost one
# session each, not a model run, so a small budget is cheap: on PP-OCRv4 det at 640x640 (690 MB
# of activations per sample and runner) 256 MiB gives 6 segments and a `diagnose` peak RSS of
# 0.74 GB, against 1.77 GB with one segment (measured 2026-11-24, BENCHMARKS.md).
LAYERWISE_BUDGET = 256 << 20


@dataclass(frozen=True)
class LayerwiseResult:
    """Layerwise comparison of a candidate against the reference.

    Attributes:
        target: Format whose range is checked.
        threshold: Relative L2 error above which a tensor counts as diverged.
        records: One per compared tensor, in topological order.
        first_divergence: First tensor whose rel_l2 exceeds ``threshold`` (None if none).
        nan_birth: First tensor with NaN/Inf in the candidate whose producer's inputs are
            all finite (None if none).
        chunks: Number of segments (mode ``segments``) or marked-output chunks (mode
            ``marking``) run.
        missing: Tensors that the candidate model did not expose.
        mode: ``segments`` (each node executed once per precision and sample) or
            ``marking`` (the whole model run once per chunk of marked outputs).
        fallback_reason: Why marking was used instead of segments (None in segments mode).
    """

    target: str
    threshold: float
    records: tuple[LayerRecord, ...]
    first_divergence: str | None
    nan_birth: str | None
    chunks: int
    missing: tuple[str, ...] = field(default_factory=tuple)
    mode: str = "segments"
    fallback_reason: str | None = None

    def record(self, tensor: str) -> LayerRecord | None:
        """The record of ``tensor`` or None."""
        for r in self.records:
            if r.tensor == tensor:
                return r
        return None

    def to_dict(self) -> dict:
        return {"target": self.target, "threshold": self.threshold,
                "first_divergence": self.first_divergence, "nan_birth": self.nan_birth,
                "chunks": self.chunks, "missing": list(self.missing), "mode": self.mode,
                "fallback_reason": self.fallback_reason,
                "records": [r.to_dict() for r in self.records]}

    @classmethod
    def from_dict(cls, data: dict) -> LayerwiseResult:
        return cls(data["target"], data["threshold"],
                   tuple(LayerRecord.from_dict(r) for r in data["records"]),
                   data.get("first_divergence"), data.get("nan_birth"), data.get("chunks", 0),
                   tuple(data.get("missing", ())), data.get("mode", "marking"),
                   data.get("fallback_reason"))


def compare_layerwise(model: onnx.ModelProto, samples: Sequence[dict[str, np.ndarray]],
                      make_reference: RunnerFactory, make_candidate: RunnerFactory,
                      target: Precision, threshold: float, budget_bytes: int = LAYERWISE_BUDGET,
                      tensors: Iterable[str] | None = None, progress: Progress | None = None,
                      *, segments: bool = True, stats_threads: int | None = None,
                      candidate_graph: WholeGraph | None = None,
                      resident: bool | None = None) -> LayerwiseResult:
    """Compare every floating intermediate tensor of candidate vs reference.

    Args:
        model: The FP32 model both factories start from (tensor names must match).
        samples: Feed dicts.
        make_reference / make_candidate: Build a runner for a sub-model of ``model`` (a
            segment, or in marking mode the whole model with marked outputs).
        target: Format whose range is checked (FP16 max 65504 = largest finite binary16).
        threshold: rel_l2 above which a tensor counts as diverged.
        budget_bytes: Estimated bytes of one segment's outputs and weights (or of one chunk's
            marked outputs), both runners, one sample.
        tensors: Restrict to these tensor names (default: every floating activation).
        progress: Called as ``progress(done_runs, total_runs)``.
        segments: False when ``make_candidate`` cannot run sub-models of ``model`` (it runs a
            model of its own, e.g. a rewritten or FP16 model): marking is used.
        stats_threads: Threads computing the statistics (default: up to 2; on a CUDA device
            up to 8, the host's cores being free); 1 also runs the candidate after the
            reference instead of at the same time.
        candidate_graph: ``model`` -> (the candidate's own whole graph, a runner factory for
            its sub-models) or None, e.g. the emulation model: its segments, cut where the
            model's are (``graph.segments.cut_like``), then replace ``make_candidate`` on the
            model's segments. Where the cut cannot be carried over, ``make_candidate`` is used.
        resident: Run the segments with I/O binding and reduce the statistics on the device
            (``layerwise.resident``); on a GPU the segment budget is then one of GPU memory
            (``runners.device.segment_budget``). Default: on a CUDA device. On the CPU it
            gives the same records (tests), not faster ones.

    Returns:
        ``LayerwiseResult`` (``mode`` and ``fallback_reason`` say which engine ran).

    Raises:
        BackendError: A runner fails.
    """
    shapes = {k: v.shape for k, v in samples[0].items()} if samples else {}
    all_sites = float_activations(model, shapes)
    if resident is None:
        resident = device.current().is_cuda
    if resident and segments:  # the compared tensors live in GPU memory, not the host's
        budget_bytes = device.segment_budget(device.current(), budget_bytes)
    if segments and device.current().is_cuda:
        samples = batched_samples(model, samples, all_sites, budget_bytes)
    sites = all_sites
    if tensors is not None:
        wanted = set(tensors)
        sites = [s for s in sites if s.name in wanted]
    fmt = FORMATS[target]
    reason = why_not_segmentable(model) if segments else (
        "the candidate runner runs a model of its own, not sub-models of this one")
    if stats_threads is None and device.current().is_cuda:
        # the GPU runs the model: the host's cores are free for the statistics, which then
        # overlap the next segment's device work (StatsPool.add returns before they finish)
        stats_threads = max(2, min(8, (os.cpu_count() or 1) - 1))
    compiled = fused.worth_loading(compared_pairs(sites, len(samples)))
    if compiled:  # loads while the first segments run, unless diagnose started it earlier
        fused.preload()
    stats = _pool(sites, fmt, stats_threads, resident and reason is None, compiled)
    side = side_thread() if stats_threads != 1 else None
    # the segments' (or chunks') sessions reuse each other's memory and do not spin while the
    # statistics run; the reference and the candidate run at once on half the cores each
    # (runners.sessions.cpu_arena)
    with shared_cpu(max(1, (os.cpu_count() or 1) // 2) if side is not None else 0):
        try:
            outcome = reason if reason is not None else _by_segments(
                model, samples, make_reference, make_candidate, all_sites, sites, stats,
                budget_bytes, progress, side, candidate_graph)
            if isinstance(outcome, str):  # marking, with fresh accumulators
                reason = outcome
                stats.close()
                stats = StatsPool(sites, fmt, stats_threads, compiled)
                count, missing = run_marking(model, samples, make_reference, make_candidate, sites,
                                             stats, budget_bytes, progress, side)
            else:
                count, missing = outcome
            records = stats.records(sites, set(missing))
        finally:
            stats.close()
            if side is not None:
                side.shutdown()
    first = next((r.tensor for r in records if r.rel_l2 > threshold), None)
    return LayerwiseResult(target.value, threshold, records, first, _nan_birth(model, records),
                           count, tuple(sorted(set(missing))),
                           "segments" if reason is None else "marking", reason)


def compared_pairs(sites: Sequence[TensorSite], samples: int) -> int:
    """(reference, candidate) element pairs a comparison of ``sites`` over ``samples``
    samples folds, estimated from the sites' sizes (unknown sizes count 0)."""
    return sum(s.numel or 0 for s in sites) * samples


def preload_statistics(model: onnx.ModelProto,
                       samples: Sequence[Mapping[str, np.ndarray]]) -> None:
    """Start loading ``layerwise.fused``'s kernel in the background if comparing ``model``
    over ``samples`` would use it (``fused.worth_loading``): the caller's runs meanwhile hide
    its load. Costs a shape inference (30-40 ms on PP-OCRv4 det/rec)."""
    if samples:
        shapes = {k: np.shape(v) for k, v in samples[0].items()}
        if fused.worth_loading(compared_pairs(float_activations(model, shapes), len(samples))):
            fused.preload()


def _pool(sites: Sequence[TensorSite], fmt: FloatFormat, threads: int | None,
          resident: bool, compiled: bool) -> StatsPool:
    """The statistics pool: ``ResidentStats`` when asked for and its session opens on the
    current device, else the host's ``StatsPool``."""
    if resident:
        try:
            return ResidentStats(sites, fmt, threads, compiled)
        except PrecisionDoctorError:  # e.g. no CUDA execution provider after all
            pass
    return StatsPool(sites, fmt, threads, compiled)


def batched_samples(model: onnx.ModelProto, samples: Sequence[dict[str, np.ndarray]],
                    sites: Sequence[TensorSite], budget_bytes: int
                    ) -> Sequence[dict[str, np.ndarray]]:
    """On a GPU, samples of equal shapes joined along the batch axis, as many as keep one
    run's outputs of both runners within the budget (``runners.batching``).

    The statistics are sums and extremes over every element, so a batch of B samples folds
    in exactly as its B samples would (up to summation order). A batch of B fits the
    budget when B times a sample's floating activations, for both runners, does: then the
    whole model is one segment of B samples, in one session per runner, instead of one run
    per sample and segment. Each input shape gets its own cap: ``sites`` (estimated at
    ``samples[0]``'s shapes) size the samples of that shape, the others are estimated at
    their own (a text line twice as wide holds twice the activations). Samples whose shape
    does not fit twice in the budget, and models without a batch dimension
    (``batch_symbol``), run sample by sample.
    """
    if len(samples) < 2 or batch_symbol(model) is None:
        return samples
    first = {k: tuple(v.shape) for k, v in samples[0].items()}  # the shapes ``sites`` are at
    caps: dict[tuple, int] = {}

    def cap_of(sample: dict[str, np.ndarray]) -> int:
        shapes = {k: tuple(v.shape) for k, v in sample.items()}
        key = tuple(sorted(shapes.items()))
        if key not in caps:
            per_sample = sum(node_output_bytes(
                model, sites if shapes == first else float_activations(model, shapes)))
            caps[key] = min(MAX_BATCH, budget_bytes // max(1, 2 * per_sample))
        return caps[key]

    batches: list[list[int]] = []
    for group in groups(samples):
        cap = cap_of(samples[group[0]]) if len(group) > 1 else 1
        cap = cap if cap >= 2 else 1
        batches.extend(group[i:i + cap] for i in range(0, len(group), cap))
    if len(batches) == len(samples):
        return samples
    return [{k: np.concatenate([samples[i][k] for i in batch]) for k in samples[batch[0]]}
            for batch in batches]


def _by_segments(model: onnx.ModelProto, samples: Sequence[dict[str, np.ndarray]],
                 make_reference: RunnerFactory, make_candidate: RunnerFactory,
                 all_sites: Sequence[TensorSite], sites: Sequence[TensorSite],
                 stats: StatsPool, budget_bytes: int, progress: Progress | None,
                 side: ThreadPoolExecutor | None, candidate_graph: WholeGraph | None
                 ) -> tuple[int, list[str]] | str:
    """(segments run, sites missing) or, when segments cannot be used, the reason."""
    cut = plan_segments(model, node_output_bytes(model, all_sites), budget_bytes // 2)
    types = infer_types(model)
    unknown = missing_types(cut, types)
    if unknown:
        return (f"ONNX shape inference cannot type boundary tensor {unknown[0]!r}, so it "
                "cannot be a segment input")
    whole = None
    own = candidate_graph(model) if candidate_graph is not None else None
    if own is not None:
        graph, factory = own
        cut_there = cut_like(model, cut, graph)
        if cut_there is not None:
            graph_types = infer_types(graph)
            if not missing_types(cut_there, graph_types):
                whole = CandidateGraph(graph, cut_there, graph_types, factory)
    # On the CPU the next segment's sessions open while this one runs, where its weights
    # take at most an eighth of the budget (held beside the current segment's; MiniLM's 7 to
    # 13 MB per segment: layerwise peak RSS +60 MB). On a GPU two segments' sessions would
    # share the device memory one segment's budget is sized for.
    ahead = budget_bytes // 8 if side is not None and not device.current().is_cuda else 0
    try:
        return len(cut), run_segments(model, cut, types, samples, make_reference,
                                      make_candidate, sites, stats, progress, side, whole,
                                      ahead)
    except SegmentFallback as exc:
        return str(exc)


def _nan_birth(model: onnx.ModelProto, records: Sequence[LayerRecord]) -> str | None:
    """First tensor with NaN/Inf in the candidate whose producer's inputs are finite
    (``layerwise.gain.nonfinite_birth``)."""
    birth = nonfinite_birth(records, producer_inputs(model))
    return birth.tensor if birth is not None else None
