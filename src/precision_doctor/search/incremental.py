"""Incremental evaluation of a search's plans: each plan runs from the first segment whose nodes
it changes, on the boundary tensors an earlier plan left there.

A search evaluates dozens of plans that each keep a different set of nodes in FP32; many share
their decisions in the first part of the graph with a plan evaluated before (a ddmin step
removes a few nodes from the last passing set). Here the model is cut into about
``SEARCH_SEGMENTS`` consecutive segments of similar cost, each cut where few bytes cross it
(``graph.segments.balanced_segments``), and each segment is emulated on its own
(``EmulatorRunner`` of a segment model applies the plan to its own nodes).

* **States.** After segment k of sample i, the tensors later segments read (and the graph
  outputs produced so far) are kept under the key (i, k, the plan's decisions in segments
  0..k). A plan with the same decisions in segments 0..k starts at segment k + 1 from that
  state: the same segments in the same precisions computed it from the same inputs, so the
  evaluation is the same bits as running every segment (tests/search/test_incremental.py).
  States are kept within ``CACHE_BYTES``, a tensor held by several states (consecutive states
  share most) counted once, as copies (ONNX Runtime's outputs are views of its arena, where a
  kept one would pin its chunk); the least recently used go first.
* **Sessions.** A segment's emulation and ONNX Runtime session depend only on the plan's
  decisions for that segment's nodes: they are kept per (segment, decisions), so a new plan
  builds only the segments it changes; ``SESSIONS_PER_SEGMENT`` unused ones are kept each.

Where fewer than ``PLANS_KEPT`` plans' states of one sample fit ``CACHE_BYTES`` (PP-OCRv4 det,
up to 992x736: 79 MiB a plan), whole models are evaluated: ``fix`` on det skipped 44 of 1140
segment runs at 256 MiB, in the same time, at 2.3x the peak RSS (sessions kept on the search's
shared CPU arena; ``search_cost_2026-11-28_cpu2.json``, ``probes/incremental_memory.py``).

Every plan, the first one included, runs on these segments. Segment runs are not always the
bits of one whole-model run: ONNX Runtime may fuse FP32 nodes across a cut in the whole graph.
``incremental_scope`` measures what the cuts alone change in the all-FP32 plan on every sample
(``cut_error``) and evaluates incrementally only below ``CUT_ERROR``.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import onnx

from precision_doctor.compare.metrics import relative_l2
from precision_doctor.formats import Precision
from precision_doctor.graph.external import SMALL_MODEL_BYTES, external_bytes
from precision_doctor.graph.load import input_metadata
from precision_doctor.graph.segments import (
    balanced_segments,
    missing_types,
    node_costs,
    segment_model,
    why_not_segmentable,
)
from precision_doctor.graph.shapes import infer_types
from precision_doctor.precision.conv_bias import FUSED
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners.base import Feeds, TensorMeta
from precision_doctor.runners.device import current as current_device
from precision_doctor.runners.emulator import EmulatorRunner

# Segments a search's model is cut into: more reuse finer-grained, more runs per sample.
SEARCH_SEGMENTS = 12
# Unused sessions kept per segment (each holds the segment's weights and their rounded copy;
# none where the weights take ``graph.external.SMALL_MODEL_BYTES`` or more).
SESSIONS_PER_SEGMENT = 1
# Largest relative L2 the cuts alone may cause in the all-FP32 plan (``cut_error``), else whole
# models: 0 on PP-OCRv4 det and rec, 1.5e-6 on the Whisper encoder, 0.10 on a quantize_dynamic
# MiniLM (SkipLayerNorm fused across a cut; ``benchmarks/probes/incremental_cuts.py``).
CUT_ERROR = 1e-5
# Plans whose states of one sample must fit ``CACHE_BYTES`` together (the last passing plan,
# the start plan, the plan evaluated and the next), else each plan evicts what the next needs.
PLANS_KEPT = 4
# Bytes of kept states: the layerwise segment budget (``layerwise.compare.LAYERWISE_BUDGET``).
CACHE_BYTES = 256 << 20


@dataclass
class Counts:
    """What the incremental evaluation saved (for reports and benchmarks)."""

    segment_runs: int = 0  # segments run
    segments_skipped: int = 0  # segments a kept state spared
    sessions_built: int = 0  # segment sessions opened
    sessions_reused: int = 0  # segment sessions taken from the kept ones


@dataclass
class _Session:
    runner: EmulatorRunner
    pins: int = 0


@dataclass
class _Plan:
    plan: PrecisionPlan
    keys: list[frozenset]  # per segment: its nodes' decisions
    prefixes: list[int]  # per segment: id of the decisions of segments 0..k
    pinned: set[tuple[int, frozenset]] = field(default_factory=set)


class IncrementalEmulation:
    """Evaluates plans of one model on fixed samples, segment by segment, reusing what earlier
    plans computed (module docstring).

    Args:
        model: The FP32 model (``applicable``: sorted, no control flow).
        default: The low precision of every plan (FP16 or BF16).
        samples: The samples every evaluation draws from (``.feeds``); ``run_sample(i, ...)``
            must be given ``samples[i]``'s feeds.
        conv_bias: The engine's convolution bias model (``precision.conv_bias``).
        segments: Segments to cut the model into.
        cache_bytes: Bytes of kept boundary tensors.
        cpu_mem_arena: ONNX Runtime's CPU arena for the segment sessions.

    Use as a context manager (it holds sessions).

    Raises:
        ValueError: The model cannot be cut (``applicable``) or a boundary is untyped.
    """

    def __init__(self, model: onnx.ModelProto, default: Precision, samples: Sequence,
                 conv_bias: str = FUSED, segments: int = SEARCH_SEGMENTS,
                 cache_bytes: int = CACHE_BYTES, cpu_mem_arena: bool = False) -> None:
        why = applicable(model)
        if why is not None:
            raise ValueError(why)
        self.model, self.default, self.samples = model, default, samples
        self.conv_bias, self.cache_bytes = conv_bias, cache_bytes
        self.cpu_mem_arena = cpu_mem_arena
        self.outputs = [o.name for o in model.graph.output]
        feeds = samples[0].feeds if samples else {}
        # boundary types as declared (samples differ in shape); one sample's weigh the nodes
        types = infer_types(model)
        sized = infer_types(model, {k: np.shape(v) for k, v in feeds.items()})
        cost, sizes = node_costs(model, sized)
        cuts = balanced_segments(model, cost, sizes, segments)
        # one plan's states of one sample: each carried tensor once, first sample's shapes
        self.chain_bytes = sum(sizes.get(n, 0) for c in cuts for n in c.carry)
        if missing_types(cuts, types):
            raise ValueError("type inference leaves a segment boundary untyped")
        self.segments, self.subs, self.produces = list(cuts), [], []
        for seg in cuts:
            made = {o for nd in model.graph.node[seg.start:seg.stop] for o in nd.output}
            self.produces.append([o for o in self.outputs if o in made])
            self.subs.append(segment_model(model, seg, self.produces[-1], types, len(cuts))
                             if seg.carry or self.produces[-1] else None)
        # weights that do not fit twice (external ones counted): only the sessions in use
        small = model.ByteSize() + external_bytes(model) < SMALL_MODEL_BYTES
        self.idle_sessions = SESSIONS_PER_SEGMENT if small else 0
        self.segment_of = {nd.name: k for k, seg in enumerate(self.segments)
                           for nd in model.graph.node[seg.start:seg.stop] if nd.name}
        self.counts = Counts()
        self._lock = threading.Lock()
        self._prefix_ids: dict[tuple[int, frozenset], int] = {}
        self._states: OrderedDict[tuple[int, int, int], tuple[dict, dict]] = OrderedDict()
        self._held: dict[int, list] = {}  # id -> [array, states holding it]
        self._state_bytes = 0
        self._sessions: list[OrderedDict[frozenset, _Session]] = [
            OrderedDict() for _ in self.segments]

    def __enter__(self) -> IncrementalEmulation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every kept session and drop every kept state."""
        with self._lock:
            for kept in self._sessions:
                for s in kept.values():
                    s.runner.__exit__(None, None, None)
                kept.clear()
            self._states.clear()
            self._held.clear()
            self._state_bytes = 0

    def cut_error(self, stop: float = math.inf) -> float:
        """Relative L2 (worst output and sample) between the segment runs and a whole-model run
        of the all-FP32 plan: what cutting the graph alone changes (ONNX Runtime fusing FP32
        nodes across a cut). On every sample, as a fusion's effect can depend on the data: the
        whole graph of a QuantizeLinear -> DequantizeLinear -> MatMul runs ONNX Runtime's x86
        ``MatMulIntegerToFloat``, whose u8 x s8 products saturate in pairs at the int16 limit;
        cut, it runs in float (a fuzzed graph: equal on one sample, 0.14 apart on the other,
        ``tests/fuzz/test_regressions.py``). Stops above ``stop``. Raises ``BackendError``."""
        plan = PrecisionPlan(self.default).keep_fp32(list(self.segment_of), "cut check")
        worst = 0.0
        with EmulatorRunner(self.model, plan, cpu_mem_arena=self.cpu_mem_arena,
                            conv_bias=self.conv_bias) as whole, self.runner(plan) as cut:
            for sample in self.samples:
                ref, got = whole.run(sample.feeds), cut.run(sample.feeds)
                worst = max([worst, *(relative_l2([ref[n]], [got[n]]) for n in self.outputs)])
                if worst > stop:
                    break
        return worst

    def runner(self, plan: PrecisionPlan, name: str | None = None) -> IncrementalRunner:
        """A runner of ``plan`` (not entered) on these segments; ``ValueError`` where
        ``plan``'s default is not this evaluation's."""
        if plan.default is not self.default:
            raise ValueError(f"plan default {plan.default.value} is not {self.default.value}")
        return IncrementalRunner(self, plan, name or f"emulate-{plan.default.value}")

    def _describe(self, plan: PrecisionPlan) -> _Plan:  # its per-segment keys and prefix ids
        per: list[set] = [set() for _ in self.segments]
        for node, decision in plan.overrides.items():
            k = self.segment_of.get(node)
            if k is not None:
                per[k].add((node, decision.precision))
        keys = [frozenset(p) for p in per]
        prefixes, parent = [], -1
        with self._lock:
            for key in keys:
                parent = self._prefix_ids.setdefault((parent, key), len(self._prefix_ids))
                prefixes.append(parent)
        return _Plan(plan, keys, prefixes)

    def _first_to_run(self, p: _Plan, i: int) -> tuple[int, tuple[dict, dict] | None]:
        """(first segment to run for sample i, the kept (store, outputs) it starts from)."""
        with self._lock:
            for k in range(len(self.segments) - 1, -1, -1):
                state = self._states.get((i, k, p.prefixes[k]))
                if state is not None:
                    self._states.move_to_end((i, k, p.prefixes[k]))
                    return k + 1, state
        return 0, None

    def _session(self, p: _Plan, k: int) -> EmulatorRunner:
        key = p.keys[k]
        with self._lock:
            kept = self._sessions[k].get(key)
            if kept is not None:
                self._sessions[k].move_to_end(key)
                if (k, key) not in p.pinned:
                    kept.pins += 1
                    p.pinned.add((k, key))
                    self.counts.sessions_reused += 1
                return kept.runner
        sub = self.subs[k]
        assert sub is not None
        runner = EmulatorRunner(sub, p.plan, cpu_mem_arena=self.cpu_mem_arena,
                                conv_bias=self.conv_bias).__enter__()
        with self._lock:
            if key in self._sessions[k]:  # opened meanwhile by the other thread
                runner.__exit__(None, None, None)
            else:
                self._sessions[k][key] = _Session(runner)
                self.counts.sessions_built += 1
            kept = self._sessions[k][key]
            if (k, key) not in p.pinned:
                kept.pins += 1
                p.pinned.add((k, key))
            self._evict_sessions(k)  # after pinning: the new session is in use
            return kept.runner

    def _evict_sessions(self, k: int) -> None:
        idle = [key for key, s in self._sessions[k].items() if s.pins == 0]
        for key in idle[:max(0, len(idle) - self.idle_sessions)]:
            self._sessions[k].pop(key).runner.__exit__(None, None, None)

    def _release(self, p: _Plan) -> None:
        with self._lock:
            for k, key in p.pinned:
                kept = self._sessions[k].get(key)
                if kept is not None:
                    kept.pins -= 1
            p.pinned.clear()
            for k in range(len(self.segments)):
                self._evict_sessions(k)

    def _keep_state(self, key: tuple[int, int, int], store: dict, outs: dict) -> None:
        """Keep the state after a segment; a tensor that several states hold (consecutive
        segments pass most on) is counted once; the least recently used states go first."""
        with self._lock:
            if key in self._states:
                return
            arrays = [*store.values(), *outs.values()]
            self._states[key] = (dict(store), dict(outs))
            self._hold(arrays, +1)
            while self._state_bytes > self.cache_bytes and self._states:
                old = self._states.popitem(last=False)[1]
                self._hold([*old[0].values(), *old[1].values()], -1)

    def _hold(self, arrays: Sequence[np.ndarray], delta: int) -> None:
        for a in arrays:
            held = self._held.get(id(a))
            if held is None:
                held = self._held[id(a)] = [a, 0]
                self._state_bytes += int(np.asarray(a).nbytes)
            held[1] += delta
            if held[1] <= 0:
                del self._held[id(a)]
                self._state_bytes -= int(np.asarray(a).nbytes)

    def run_plan_sample(self, p: _Plan, i: int | None, feeds: Feeds) -> dict[str, np.ndarray]:
        """Outputs of plan ``p`` on sample ``i`` (None: not cached), from its first segment
        without a kept state."""
        start, state = self._first_to_run(p, i) if i is not None else (0, None)
        store, outs = (dict(state[0]), dict(state[1])) if state is not None else ({}, {})
        self.counts.segments_skipped += start
        for k in range(start, len(self.segments)):
            seg = self.segments[k]
            if self.subs[k] is not None:
                result = self._session(p, k).run({**{n: feeds[n] for n in seg.model_inputs},
                                                  **{n: store[n] for n in seg.boundary}})
                self.counts.segment_runs += 1
                for n in seg.release:
                    store.pop(n, None)
                # ORT's outputs are views of its arena, where kept ones would pin their chunks
                own = np.array if i is not None else np.asarray
                store.update({n: own(result[n]) for n in seg.carry})
                outs.update({n: own(result[n]) for n in self.produces[k]})
            if i is not None and k + 1 < len(self.segments):
                self._keep_state((i, k, p.prefixes[k]), store, outs)
        return {n: outs[n] for n in self.outputs}


class IncrementalRunner:
    """A ``Runner`` of one plan on an ``IncrementalEmulation`` (construct it with
    ``IncrementalEmulation.runner``). ``run_sample(i, feeds)`` reuses and keeps states of
    sample i; ``run(feeds)`` runs every segment and keeps nothing. Both raise ``BackendError``
    where ONNX Runtime rejects a segment's emulation or fails to run it."""

    def __init__(self, owner: IncrementalEmulation, plan: PrecisionPlan, name: str) -> None:
        self.owner, self.plan, self.name = owner, plan, name
        self._p: _Plan | None = None

    def __enter__(self) -> IncrementalRunner:
        owner = self.owner
        self._p = owner._describe(self.plan)
        # open the segments every sample will run (on the opener thread of a prefetch)
        first = min((owner._first_to_run(self._p, i)[0] for i in range(len(owner.samples))),
                    default=0)
        for k in range(first, len(owner.segments)):
            if owner.subs[k] is not None:
                owner._session(self._p, k)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._p is not None:
            self.owner._release(self._p)
            self._p = None

    def input_metadata(self) -> list[TensorMeta]:
        return input_metadata(self.owner.model)

    def output_names(self) -> list[str]:
        return list(self.owner.outputs)

    def run(self, feeds: Feeds, output_names: Sequence[str] | None = None
            ) -> dict[str, np.ndarray]:
        return self.run_sample(None, feeds, output_names)

    def run_sample(self, index: int | None, feeds: Feeds,
                   output_names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Outputs on sample ``index`` of the owner's samples (its ``feeds``; None: a sample
        of its own, nothing reused or kept). Raises ``BackendError`` where ONNX Runtime fails.
        """
        assert self._p is not None, "use the runner inside a `with` block"
        out = self.owner.run_plan_sample(self._p, index, feeds)
        return {n: out[n] for n in (output_names or self.owner.outputs)}


def applicable(model: onnx.ModelProto) -> str | None:
    """Why ``model`` cannot be evaluated incrementally, or None when it can."""
    made = {o for node in model.graph.node for o in node.output}
    passed = [o.name for o in model.graph.output if o.name not in made]
    if passed:
        return f"graph output {passed[0]!r} is not computed by a node"
    return why_not_segmentable(model)


def incremental_scope(model: onnx.ModelProto, default: Precision, samples: Sequence,
                      conv_bias: str = FUSED, cpu_mem_arena: bool = False, wanted: bool = True,
                      cache_bytes: int = CACHE_BYTES) -> IncrementalEmulation | nullcontext:
    """An ``IncrementalEmulation`` for a search on the CPU (on a GPU each plan is one feed of
    the switched session, ``runners.sessions.switched``), or an empty context where it does not
    apply: not ``wanted``, a GPU, a model that cannot be cut, a boundary left untyped, fewer
    than ``PLANS_KEPT`` plans' states of one sample within ``cache_bytes``, cuts that change
    the all-FP32 plan's outputs by more than ``CUT_ERROR``.

    Args:
        model, default, samples, conv_bias, cpu_mem_arena, cache_bytes: As for the class.
        wanted: False: always the empty context.
    """
    if not wanted or current_device().is_cuda or applicable(model) is not None:
        return nullcontext()
    try:
        made = IncrementalEmulation(model, default, samples, conv_bias,
                                    cache_bytes=cache_bytes, cpu_mem_arena=cpu_mem_arena)
    except ValueError:  # a boundary type inference cannot tell: whole-model evaluations
        return nullcontext()
    if PLANS_KEPT * made.chain_bytes > cache_bytes or made.cut_error(stop=CUT_ERROR) > CUT_ERROR:
        made.close()
        return nullcontext()
    return made

