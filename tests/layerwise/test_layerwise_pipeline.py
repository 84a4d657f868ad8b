"""How layerwise comparison overlaps its work: the statistics workers share one queue per
call. It changes no record."""

import gc
import weakref

import numpy as np

from precision_doctor.formats import FORMATS, Precision
from precision_doctor.graph.outputs import TensorSite
from precision_doctor.layerwise.stats import BLOCK, StatsPool

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
