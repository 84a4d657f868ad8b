"""The two ways layerwise comparison gets every intermediate tensor out of a runner.

* ``run_segments`` (default): the graph is cut into consecutive segments that fit the memory
  budget (``graph.segments``); each segment runs once per precision and sample, fed with the
  boundary tensors of the segments before it: reference boundaries for the reference and
  candidate boundaries for the candidate, so the candidate's accumulated error is kept exactly
  as in one whole run. Every node executes once per precision.
* ``run_marking`` (fallback): tensors are marked as graph outputs in chunks and the whole
  model runs once per chunk (Polygraphy's ``--onnx-outputs mark``); nodes execute once per
  chunk.

In both, the candidate runs on a second thread while the reference runs: each ONNX Runtime
session fills the cores the other leaves idle (about 20% less wall time on PP-OCRv4 det with 2
cores); the outputs of both are held at once anyway, only the two runs' working memory overlaps
(det peak RSS 0.85 vs 0.74 GB, BENCHMARKS.md). In ``run_segments`` a third thread builds the
next segment's sub-models and opens its sessions meanwhile (``ahead``): done between segments,
that took MiniLM's layerwise 2.1 of its 3.8 s, one core busy
(``benchmarks/probes/layerwise_profile.py``, 2026-11-28). Both feed ``StatsPool``; with every
compared tensor a graph output in both, ONNX Runtime fuses the same nodes and the statistics
agree (tests/layerwise/test_layerwise_segments.py).
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.graph.outputs import TensorSite, chunk_sites, mark_outputs
from precision_doctor.graph.segments import Segment, segment_model, weight_bytes
from precision_doctor.layerwise.resident import ResidentStats, is_resident, to_host
from precision_doctor.layerwise.stats import StatsPool
from precision_doctor.runners.base import Runner

RunnerFactory = Callable[[onnx.ModelProto], Runner]
Progress = Callable[[int, int], None]


class SegmentFallback(Exception):
    """A runner cannot run the segments (the caller falls back to marking)."""


def node_output_bytes(model: onnx.ModelProto, sites: Sequence[TensorSite]) -> list[int]:
    """Estimated bytes of every node's floating outputs, in graph order (one sample).

    Tensors of unknown size count as the largest known tensor (as ``chunk_sites`` does).
    """
    known = [s.numel * s.itemsize for s in sites if s.numel is not None]
    fallback = max(known) if known else 4 << 20
    out = [0] * len(model.graph.node)
    for s in sites:
        out[s.index] += s.numel * s.itemsize if s.numel is not None else fallback
    return out


def side_thread() -> ThreadPoolExecutor | None:
    """A thread for the candidate's runs where the machine has a second core."""
    return ThreadPoolExecutor(1) if (os.cpu_count() or 1) > 1 else None


def _run_both(ref_runner: Runner | _Idle, ref_feeds: Mapping[str, np.ndarray], cand_runner: Runner,
              cand_feeds: Mapping[str, np.ndarray], side: ThreadPoolExecutor | None,
              resident: bool = False) -> tuple[dict, dict]:
    """Run the reference here and the candidate on ``side`` at the same time (ONNX Runtime
    releases the GIL; each runner's outputs are its own), or one after the other.
    ``resident``: with ``run_resident`` (outputs stay on the device as ``OrtValue``s)."""
    ref_run = ref_runner.run_resident if resident else ref_runner.run  # type: ignore[union-attr]
    cand_run = cand_runner.run_resident if resident else cand_runner.run  # type: ignore[attr-defined]
    if side is None:
        return ref_run(ref_feeds), cand_run(cand_feeds)
    job = side.submit(cand_run, cand_feeds)
    try:
        ref_out = ref_run(ref_feeds)
    finally:
        cand_out = job.result()
    return ref_out, cand_out


@dataclass(frozen=True)
class CandidateGraph:
    """The candidate's own whole graph (same names for the compared tensors), cut like the
    model (``graph.segments.cut_like``): its segments run instead of the candidate's runner on
    segments of the model. The emulator builds its graph once for the whole model, not once
    per segment (det: 0.1 s of a 1.0 s layerwise pass).

    Attributes:
        model: The candidate graph.
        segments: One per segment of the model.
        types: Tensor name -> type in ``model`` (every boundary tensor has one).
        factory: Runner for a sub-model of ``model``.
    """

    model: onnx.ModelProto
    segments: Sequence[Segment]
    types: Mapping[str, onnx.TypeProto]
    factory: RunnerFactory


def run_segments(model: onnx.ModelProto, segments: Sequence[Segment],
                 types: Mapping[str, onnx.TypeProto], samples: Sequence[Mapping[str, np.ndarray]],
                 make_reference: RunnerFactory, make_candidate: RunnerFactory,
                 sites: Sequence[TensorSite], stats: StatsPool,
                 progress: Progress | None = None, side: ThreadPoolExecutor | None = None,
                 candidate_graph: CandidateGraph | None = None, ahead_bytes: int = 0
                 ) -> list[str]:
    """Run every segment once per precision and sample; fold the sites into ``stats``.

    Args:
        model: The full model.
        segments: From ``plan_segments`` (types known for every boundary tensor).
        types: Tensor name -> type (``graph.shapes.infer_types``).
        samples: Feed dicts of the full model.
        make_reference / make_candidate: Runner factories; each receives segment models.
        sites: The tensors to compare.
        stats: Receives every site of every sample. A ``ResidentStats`` (on a GPU) makes
            the segments run with I/O binding where both runners can (``run_resident``): the
            compared tensors stay on the device and are reduced there; only the boundary
            tensors the next segments read come to the host.
        progress: ``progress(done_runs, total_runs)``.
        side: A thread running the candidate while the reference runs (``side_thread``).
        candidate_graph: The candidate's own graph and its segments (``make_candidate`` is
            then not used).
        ahead_bytes: Build the next segment's sub-models and open its runners on a helper
            thread while this segment runs, instead of between the two (ONNX Runtime releases
            the GIL while it creates a session), where the next segment's weights (both
            runners) take at most this many bytes: two segments' runners are then open at
            once, each holding its weights. 0: never.

    Returns:
        Sites the candidate's segment runner did not expose.

    Raises:
        SegmentFallback: The candidate's segment runner does not expose a boundary tensor.
        BackendError: A runner fails.
    """
    by_segment: list[list[str]] = [[] for _ in segments]
    starts = [s.start for s in segments]
    for site in sites:
        k = int(np.searchsorted(starts, site.index, side="right")) - 1
        by_segment[k].append(site.name)
    cg = candidate_graph
    cand_segments = cg.segments if cg is not None else segments
    # e.g. a segment of Constant nodes only, which neither runner needs
    runs = [k for k, names in enumerate(by_segment)
            if names or segments[k].carry or cand_segments[k].carry]

    def open_segment(k: int) -> _Open:
        seg, cseg, names = segments[k], cand_segments[k], by_segment[k]
        sub = segment_model(model, seg, names, types, len(segments))
        csub = (segment_model(cg.model, cseg, names, cg.types, len(segments)) if cg is not None
                else sub)
        # a reference segment of Constant nodes only has nothing to run, while the emulator's
        # cut of it may carry a rounded copy of an input to the next segment
        idle = not names and not seg.carry
        stack = ExitStack()
        with stack:
            ref = (stack.enter_context(_Idle()) if idle
                   else stack.enter_context(make_reference(sub)))
            cand = stack.enter_context(
                (cg.factory if cg is not None else make_candidate)(csub))
            return _Open(stack.pop_all(), ref, cand)

    ref_store: list[dict[str, np.ndarray]] = [{} for _ in samples]
    cand_store: list[dict[str, np.ndarray]] = [{} for _ in samples]
    missing: list[str] = []
    total, done = len(segments) * len(samples), 0

    def small(k: int) -> bool:  # the weights of segment k may be held beside the current ones
        ref = weight_bytes(model, segments[k])
        cand = weight_bytes(cg.model, cand_segments[k]) if cg is not None else ref
        return ref + cand <= ahead_bytes

    with _Opener(open_segment, runs, small if ahead_bytes > 0 else None) as opener:
        for k, (seg, names) in enumerate(zip(segments, by_segment)):
            cseg = cand_segments[k]
            if k not in runs:
                done += len(samples)
                continue
            current = opener.take(k)
            with current.stack:
                ref_runner, cand_runner = current.ref, current.cand
                available = set(cand_runner.output_names())
                lost = [n for n in cseg.carry if n not in available]
                if lost:
                    raise SegmentFallback(
                        f"the candidate runner does not expose boundary tensor {lost[0]!r} of "
                        f"segment {seg.index}")
                missing.extend(n for n in names if n not in available)
                resident = (isinstance(stats, ResidentStats) and is_resident(ref_runner)
                            and is_resident(cand_runner))
                for i, feeds in enumerate(samples):
                    ref_out, cand_out = _run_both(
                        ref_runner, _feeds(seg, feeds, ref_store[i]),
                        cand_runner, _feeds(cseg, feeds, cand_store[i]), side, resident)
                    stats.add(names, ref_out, cand_out)
                    if resident:  # boundaries to the host: no device tensor outlives its session
                        ref_out = {n: to_host(ref_out[n]) for n in seg.carry}
                        cand_out = {n: to_host(cand_out[n]) for n in cseg.carry}
                    _keep(seg, ref_store[i], ref_out)
                    _keep(cseg, cand_store[i], cand_out)
                    del ref_out, cand_out
                    done += 1
                    if progress:
                        progress(done, total)
    return missing


@dataclass
class _Open:
    """One segment's runners, entered; closing ``stack`` exits them."""

    stack: ExitStack
    ref: Runner | _Idle
    cand: Runner


class _Opener:
    """Opens the segments' runners in ``order``; where ``ahead(k)``, segment k on a helper
    thread as soon as the one before it is taken. Leaving the ``with`` block closes a segment
    opened ahead that was not taken (after an error)."""

    def __init__(self, open_segment: Callable[[int], _Open], order: Sequence[int],
                 ahead: Callable[[int], bool] | None) -> None:
        self._open, self._order, self._ahead = open_segment, list(order), ahead
        self._helper = (ThreadPoolExecutor(1) if ahead is not None and len(self._order) > 1
                        else None)
        self._opening: dict[int, Future[_Open]] = {}

    def __enter__(self) -> _Opener:
        return self

    def take(self, k: int) -> _Open:
        """Segment ``k``'s runners (opened ahead, or now); the next segment starts opening."""
        job = self._opening.pop(k, None)
        current = job.result() if job is not None else self._open(k)
        later = self._order.index(k) + 1
        if self._helper is not None and later < len(self._order):
            nxt = self._order[later]
            if self._ahead is not None and self._ahead(nxt):
                self._opening[nxt] = self._helper.submit(self._open, nxt)
        return current

    def __exit__(self, *exc: object) -> None:
        for job in self._opening.values():
            if job.exception() is None:
                job.result().stack.close()
        self._opening.clear()
        if self._helper is not None:
            self._helper.shutdown()


class _Idle:
    """The runner of a segment with nothing to run or return."""

    def __enter__(self) -> _Idle:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {}

    run_resident = run


def _feeds(seg: Segment, feeds: Mapping[str, np.ndarray], store: Mapping[str, np.ndarray]
           ) -> dict[str, np.ndarray]:
    """A segment's inputs: the model inputs it reads and the boundary tensors it is given."""
    return {**{n: feeds[n] for n in seg.model_inputs if n in feeds},
            **{n: store[n] for n in seg.boundary}}


def _keep(seg: Segment, store: dict[str, np.ndarray], outputs: Mapping[str, np.ndarray]
          ) -> None:
    """Drop the boundary tensors no later segment reads; keep the ones it produced that a
    later segment reads."""
    for n in seg.release:
        del store[n]
    for n in seg.carry:
        store[n] = outputs[n]


def run_marking(model: onnx.ModelProto, samples: Sequence[Mapping[str, np.ndarray]],
                make_reference: RunnerFactory, make_candidate: RunnerFactory,
                sites: Sequence[TensorSite], stats: StatsPool, budget_bytes: int,
                progress: Progress | None = None, side: ThreadPoolExecutor | None = None
                ) -> tuple[int, list[str]]:
    """Mark the sites as outputs in chunks of ``budget_bytes`` (both runners) and run the
    whole model per chunk (``side`` as in ``run_segments``).

    Returns:
        (number of chunks, sites the candidate model did not expose).

    Raises:
        BackendError: A runner fails.
    """
    chunks = chunk_sites(sites, budget_bytes // 2)
    missing: list[str] = []
    total, done = len(chunks) * max(len(samples), 1), 0
    for chunk in chunks:
        names = [s.name for s in chunk]
        marked = mark_outputs(model, names)
        with make_reference(marked) as ref_runner, make_candidate(marked) as cand_runner:
            available = set(cand_runner.output_names())
            missing.extend(n for n in names if n not in available)
            for feeds in samples:
                ref_out, cand_out = _run_both(ref_runner, feeds, cand_runner, feeds, side)
                stats.add(names, ref_out, cand_out)
                del ref_out, cand_out
                done += 1
                if progress:
                    progress(done, total)
    return len(chunks), missing
