"""How layerwise comparison overlaps its work: the statistics workers share one queue per
call, and the next segment's runners open while this one runs. Neither changes a record."""

import gc
import threading
import weakref

import numpy as np
import pytest
from test_layerwise_segments import residual_model, residual_samples

from precision_doctor.errors import BackendError
from precision_doctor.formats import FORMATS, Precision
from precision_doctor.graph.outputs import TensorSite, float_activations
from precision_doctor.graph.segments import plan_segments
from precision_doctor.graph.shapes import infer_types
from precision_doctor.layerwise import candidates
from precision_doctor.layerwise.candidates import emulated, reference_factory
from precision_doctor.layerwise.engines import node_output_bytes, run_segments, side_thread
from precision_doctor.layerwise.stats import BLOCK, StatsPool
from precision_doctor.precision.plan import PrecisionPlan

FP16 = Precision.FP16


def _pairs(rng, count):
    """(reference, candidate) pairs of one to three blocks, with zeros and FP16 subnormals."""
    out = []
    for k in range(count):
        r = rng.standard_normal(BLOCK * (k % 3) + 1000 + k).astype(np.float32) * 100
        r[::9] = 0.0
        r[1::13] = 3e-6
        out.append((r, (r * (1 + rng.standard_normal(r.size) * 1e-3)).astype(np.float32)))
    return out


def test_workers_sharing_a_queue_give_the_records_of_one_thread():
    rng = np.random.default_rng(1)
    sites = [TensorSite(f"t{i}", f"n{i}", "Op", i, None) for i in range(7)]
    names = [s.name for s in sites]
    fmt = FORMATS[FP16]
    pools = [StatsPool(sites, fmt, threads) for threads in (1, 2, 3)]
    try:
        for _ in range(3):  # samples in order, each tensor once per call
            pairs = _pairs(rng, len(sites))
            ref = {n: p[0] for n, p in zip(names, pairs)}
            cand = {n: p[1] for n, p in zip(names, pairs)}
            for pool in pools:
                pool.add(names[:-1], ref, cand)  # the last tensor is not in this segment
        records = [pool.records(sites, set()) for pool in pools]
    finally:
        for pool in pools:
            pool.close()
    assert records[0] == records[1] == records[2]
    assert records[0][-1].numel == 0 and all(r.numel for r in records[0][:-1])


def test_a_folded_tensor_is_not_held_by_the_queue():
    rng = np.random.default_rng(2)
    sites = [TensorSite("a", "n", "Op", 0, None), TensorSite("b", "n", "Op", 1, None)]
    (ra, ca), (rb, cb) = _pairs(rng, 2)
    alive = weakref.ref(ra)
    pool = StatsPool(sites, FORMATS[FP16], 2)
    try:
        pool.add(["a", "b"], {"a": ra, "b": rb}, {"a": ca, "b": cb})
        pool.flush()
        del ra
        gc.collect()
        assert alive() is None
    finally:
        pool.close()


class _Counting:
    """Runner factory wrapper: how many runners are open at once, the most ever, how many were
    made on a helper thread (opened ahead), and a failure on the ``fail_at``-th runner opened.
    Whether a runner opened ahead overlaps the one before depends on timing; which thread
    made it does not."""

    def __init__(self, factory, fail_at=None):
        self.factory, self.fail_at = factory, fail_at
        self.open = self.most = self.made = self.ahead = 0
        self.lock = threading.Lock()
        self.beside: dict[tuple[str, ...], int] = {}  # weights -> runners open when it opened

    def __call__(self, model):
        with self.lock:
            self.made += 1
            self.ahead += threading.current_thread() is not threading.main_thread()
            if self.fail_at is not None and self.made >= self.fail_at:
                raise BackendError("refused on purpose")
        runner, outer = self.factory(model), self
        weights = tuple(sorted(t.name for t in model.graph.initializer))

        class Wrapped:
            def __enter__(self):
                runner.__enter__()
                with outer.lock:
                    outer.beside[weights] = outer.open
                    outer.open += 1
                    outer.most = max(outer.most, outer.open)
                return self

            def __exit__(self, *exc):
                with outer.lock:
                    outer.open -= 1
                return runner.__exit__(*exc)

            def __getattr__(self, name):
                return getattr(runner, name)

        return Wrapped()


def _run(ahead_bytes, reference, candidate):
    model, samples = residual_model(), residual_samples()
    sites = float_activations(model, {"x": (1, 4, 8), "m": (1, 4, 8)})
    cut = plan_segments(model, node_output_bytes(model, sites), 1)  # one node each
    stats = StatsPool(sites, FORMATS[FP16], 2)
    side = side_thread()
    try:
        missing = run_segments(model, cut, infer_types(model), samples, reference, candidate,
                               sites, stats, side=side, ahead_bytes=ahead_bytes)
        return stats.records(sites, set(missing))
    finally:
        stats.close()
        if side is not None:
            side.shutdown()


def test_opening_the_next_segment_ahead_gives_the_same_records():
    made = {}
    for ahead_bytes in (0, 1 << 20):
        reference = _Counting(reference_factory)
        candidate = _Counting(emulated(PrecisionPlan(FP16)).factory)
        made[ahead_bytes] = (_run(ahead_bytes, reference, candidate), reference.made,
                             candidate.made)
        assert reference.open == candidate.open == 0  # every runner exited
        assert max(reference.most, candidate.most) <= (2 if ahead_bytes else 1)
        assert (reference.ahead > 0) == (candidate.ahead > 0) == (ahead_bytes > 0)
    assert made[0] == made[1 << 20]  # the same records from the same runners


def test_a_segment_with_more_weights_than_allowed_opens_after_the_one_before():
    reference = _Counting(reference_factory)
    candidate = _Counting(emulated(PrecisionPlan(FP16)).factory)
    _run(1, reference, candidate)  # segments without weights open ahead, "proj" (w) does not
    assert reference.ahead > 0 and reference.most <= 2 and reference.beside[("w",)] == 0


def test_a_segment_that_fails_to_open_ahead_leaves_no_runner_open():
    reference = _Counting(reference_factory, fail_at=4)
    candidate = _Counting(emulated(PrecisionPlan(FP16)).factory)
    with pytest.raises(BackendError, match="on purpose"):
        _run(1 << 20, reference, candidate)
    assert reference.open == candidate.open == 0


def test_the_kept_emulation_is_not_sized_again(monkeypatch):
    model = residual_model()
    cand = emulated(PrecisionPlan(FP16))
    cand.factory(model)  # the plain run: emulates the whole model and keeps it
    sized = []
    monkeypatch.setattr(candidates, "small_in_memory", lambda m: sized.append(m) or True)
    graph, _ = cand.graph(model)
    assert graph is not None and not sized
