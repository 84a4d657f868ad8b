"""Streaming per-tensor error and range statistics of layerwise comparison.

``_Accumulator`` folds one (reference, candidate) pair of a tensor at a time into running
sums, so only the tensors of one segment (or chunk) of one sample are ever in memory;
``LayerRecord`` is the frozen result. ``StatsPool`` updates the accumulators of many tensors
in parallel threads (numpy and ``layerwise.fused`` release the GIL); each accumulator still
sees the samples in order, so results do not depend on the number of threads.
"""

from __future__ import annotations

import math
import os
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from precision_doctor.compare.metrics import l2_ratio
from precision_doctor.formats import FloatFormat
from precision_doctor.graph.outputs import TensorSite
from precision_doctor.jsonable import from_json_float, json_float
from precision_doctor.layerwise import fused


@dataclass(frozen=True)
class LayerRecord:
    """Statistics of one intermediate tensor over all samples.

    Attributes:
        tensor / node / op_type / index: Where the tensor comes from (index = topological
            position of the producing node).
        numel: Elements compared, all samples.
        ref_max_abs / cand_max_abs: Largest finite |value| in reference / candidate.
        max_abs_err / mean_abs_err: Absolute error statistics over finite pairs.
        rel_l2: Relative L2 error (inf when the candidate has NaN/Inf where reference is finite).
        cand_nan / cand_inf: NaN / Inf counts in the candidate.
        ref_nonfinite: NaN/Inf count in the reference.
        overflow: Reference elements with |x| > target format max.
        flush_to_zero: Non-zero reference elements with |x| < half the format's smallest
            subnormal (they become 0).
        subnormal: Reference elements in the format's subnormal range (reduced precision).
        lost_to_zero: Elements non-zero in the reference but exactly 0 in the candidate.
        headroom_bits: log2(format max / ref_max_abs); negative = overflow.
    """

    tensor: str
    node: str
    op_type: str
    index: int
    numel: int
    ref_max_abs: float
    cand_max_abs: float
    max_abs_err: float
    mean_abs_err: float
    rel_l2: float
    cand_nan: int
    cand_inf: int
    ref_nonfinite: int
    overflow: int
    flush_to_zero: int
    subnormal: int
    lost_to_zero: int
    headroom_bits: float

    def to_dict(self) -> dict:
        return {k: json_float(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict) -> LayerRecord:
        return cls(**{k: (from_json_float(v) if k in _FLOAT_FIELDS else v)
                      for k, v in data.items()})


_FLOAT_FIELDS = {"ref_max_abs", "cand_max_abs", "max_abs_err", "mean_abs_err", "rel_l2",
                 "headroom_bits"}


# Elements folded per pass (512 KiB of float32, within the 1 MiB L2 cache of the 2-core EPYC
# sandbox): 1.6x faster than whole-tensor passes on 6.5 MB det activations (2.7 -> 1.66 ms
# per tensor, 2026-11-24; 64-256 Ki elements all within 10%).
BLOCK = 1 << 17


class Scratch:
    """Reusable temporary arrays of one thread (grown to the largest block seen)."""

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}

    def get(self, slot: str, size: int, dtype: np.dtype | type) -> np.ndarray:
        """A 1-D array of ``size`` elements of ``dtype`` (contents undefined)."""
        buf = self._arrays.get(slot)
        if buf is None or buf.size < size or buf.dtype != np.dtype(dtype):
            buf = self._arrays[slot] = np.empty(size, dtype)
        return buf[:size]


class _Accumulator:
    """Streaming statistics of one tensor."""

    __slots__ = ("numel", "ref_max", "cand_max", "err_max", "err_sum", "err2", "ref2", "nan",
                 "inf", "ref_bad", "overflow", "flush", "subnormal", "lost", "site")

    def __init__(self, site: TensorSite) -> None:
        self.site = site
        self.numel = self.nan = self.inf = self.ref_bad = 0
        self.overflow = self.flush = self.subnormal = self.lost = 0
        self.ref_max = self.cand_max = self.err_max = self.err_sum = self.err2 = self.ref2 = 0.0

    def add(self, ref: np.ndarray, cand: np.ndarray, fmt_max: float, fmt_min_sub: float,
            fmt_min_normal: float, scratch: Scratch | None = None,
            compiled: bool = False) -> None:
        """Fold one sample of the tensor in (shapes must match; otherwise it is skipped).

        The tensor is folded in blocks of ``BLOCK`` elements, so that the statistics' passes
        after the first read of each block hit the cache. ``scratch`` (one per thread) holds
        the temporaries, so that large tensors do not allocate (and page-fault) fresh memory;
        they are taken once per tensor, and the floating-point error state set once per
        tensor, not per block: a block makes about twenty numpy calls, whose fixed cost (45-60
        us on the 2-core sandbox, 2026-11-28) is a sixth of a full block's time and all of a
        small tensor's (PP-OCRv4 rec: 403 tensors, about 4 blocks each). ``compiled``: fold a
        float32 pair (an FP16 one as float32, exactly) with ``layerwise.fused``'s kernel."""
        r = np.asarray(ref).ravel()
        c = np.asarray(cand).ravel()
        if r.shape != c.shape or r.size == 0:
            return
        if r.dtype != c.dtype or r.dtype.kind != "f":  # e.g. an FP16 recording: float32 holds it
            t = np.result_type(r, c) if r.dtype.kind == c.dtype.kind == "f" else np.float64
            r, c = r.astype(t), c.astype(t)
        if compiled and r.dtype == np.float32 and self._add_fused(
                r, c, fmt_max, fmt_min_sub, fmt_min_normal, scratch):
            return
        self._add_blocks(r, c, range(0, r.size, BLOCK), BLOCK, fmt_max, fmt_min_sub,
                         fmt_min_normal, scratch or Scratch())

    def _add_blocks(self, r: np.ndarray, c: np.ndarray, starts: Iterable[int], block: int,
                    fmt_max: float, fmt_min_sub: float, fmt_min_normal: float,
                    scratch: Scratch) -> None:
        """``_add_block`` on the blocks of ``block`` elements at ``starts`` (ascending), with
        the temporaries taken once."""
        size = min(r.size, block)
        ar, d = scratch.get("abs", size, r.dtype), scratch.get("diff", size, r.dtype)
        small = scratch.get("small", size, np.bool_)
        with np.errstate(over="ignore"):  # float32 sums of huge values: redone in float64
            for start in starts:
                rb, cb = r[start:start + block], c[start:start + block]
                n = rb.size
                if n != size:  # the last, shorter block
                    ar, d, small = ar[:n], d[:n], small[:n]
                self._add_block(rb, cb, fmt_max, fmt_min_sub, fmt_min_normal, scratch, ar, d,
                                small)

    def _add_fused(self, r: np.ndarray, c: np.ndarray, fmt_max: float, fmt_min_sub: float,
                   fmt_min_normal: float, scratch: Scratch | None) -> bool:
        """``add`` with ``layerwise.fused``'s kernel (False, nothing folded, without it);
        blocks with NaN/Inf or huge values take the numpy path."""
        if (got := fused.fold(r, c, fmt_max, fmt_min_normal, fmt_min_sub / 2)) is None:
            return False
        maxima, sums, counts, bad = got
        numel, over, small, flush, zero, lost = counts.tolist()
        if numel:  # positional, not a dict: rec folds 12,896 tensors, most of them small
            (r_top, c_top, e_top), (s, s2, r2) = maxima.tolist(), sums.tolist()
            self.fold(numel, r_top, c_top, e_top, s, s2, r2, 0, 0, 0, over, flush,
                      small - zero - flush, lost)
        if bad.size:
            self._add_blocks(r, c, bad.tolist(), fused.BLOCK, fmt_max, fmt_min_sub,
                             fmt_min_normal, scratch or Scratch())
        return True

    def _add_block(self, r: np.ndarray, c: np.ndarray, fmt_max: float, fmt_min_sub: float,
                   fmt_min_normal: float, scratch: Scratch, ar: np.ndarray, d: np.ndarray,
                   small: np.ndarray) -> None:
        """``add`` for one block (1-D, same dtype; ``ar``, ``d``, ``small``: temporaries of
        its size)."""
        np.abs(r, out=ar)
        r_top, c_hi, c_lo = float(ar.max()), float(c.max()), float(c.min())  # NaN propagates
        if not (math.isfinite(r_top) and math.isfinite(c_hi) and math.isfinite(c_lo)):
            self._add_nonfinite(r, c, fmt_max, fmt_min_sub, fmt_min_normal)
            return
        # Every element finite: the same statistics as ``_add_nonfinite`` in fewer passes.
        self.numel += r.size
        self.ref_max = max(self.ref_max, r_top)
        if r_top > fmt_max:
            self.overflow += int(np.count_nonzero(ar > fmt_max))
        np.less(ar, fmt_min_normal, out=small)
        n_small = int(np.count_nonzero(small))
        if n_small:
            self._small_values(ar, c, small, n_small, fmt_min_sub / 2, scratch)
        np.subtract(c, r, out=d)
        err2, ref2 = float(np.dot(d, d)), float(np.dot(r, r))
        np.abs(d, out=d)
        # sum |d| with einsum's SIMD sum: 3x faster than numpy's pairwise sum, 1.6x faster
        # than a BLAS dot with ones; float32 accumulation within one block, float64 across
        err_sum = float(np.einsum("i->", d))
        if not math.isfinite(err2 + ref2 + err_sum):  # |x| >~ 1e19: float32 sums overflow
            err_sum, err2, ref2 = _sums64(r, c)
        self.err2, self.ref2, self.err_sum = (self.err2 + err2, self.ref2 + ref2,
                                              self.err_sum + err_sum)
        self.cand_max = max(self.cand_max, max(c_hi, -c_lo))
        self.err_max = max(self.err_max, float(d.max()))

    def _small_values(self, ar: np.ndarray, c: np.ndarray, small: np.ndarray, n_small: int,
                      half_sub: float, scratch: Scratch) -> None:
        """Flush/subnormal/lost counts of the ``small`` elements (|ref| < min normal).

        flush = #(0 < |r| < half_sub), subnormal = #(half_sub <= |r| < min normal),
        lost = #(small, r != 0, c == 0). Few small elements: gathered by index. Many (exact
        zeros after ReLU): by differences of mask counts, skipped when all are exact zeros.
        """
        if n_small * 8 <= ar.size:  # sparse: gather the few small elements
            idx = np.flatnonzero(small)
            rs, cs = ar[idx], c[idx]
            nonzero = rs > 0
            self.flush += int(np.count_nonzero(nonzero & (rs < half_sub)))
            self.subnormal += int(np.count_nonzero(nonzero & (rs >= half_sub)))
            self.lost += int(np.count_nonzero(nonzero & (cs == 0)))
            return
        mask = scratch.get("mask", ar.size, np.bool_)
        n_zero = int(np.count_nonzero(np.equal(ar, 0, out=mask)))
        if n_zero == n_small:  # every small element is an exact zero: nothing flushed or lost
            return
        # zeros included; half_sub rounds to 0 in float32 for TF32/FP32 (nothing to flush)
        n_half = max(n_zero, int(np.count_nonzero(np.less(ar, half_sub, out=mask))))
        self.flush += n_half - n_zero
        self.subnormal += n_small - n_half
        c_zero = np.equal(c, 0, out=mask)
        lost = int(np.count_nonzero(np.logical_and(small, c_zero, out=small)))
        np.equal(ar, 0, out=small)
        lost -= int(np.count_nonzero(np.logical_and(small, c_zero, out=small)))
        self.lost += lost

    def _add_nonfinite(self, r: np.ndarray, c: np.ndarray, fmt_max: float, fmt_min_sub: float,
                       fmt_min_normal: float) -> None:
        """``add`` for a sample with NaN/Inf in the reference or the candidate."""
        self.numel += r.size
        r_ok, c_ok = np.isfinite(r), np.isfinite(c)
        self.nan += int(np.count_nonzero(np.isnan(c)))
        self.inf += int(np.count_nonzero(np.isinf(c)))
        self.ref_bad += int(r.size - np.count_nonzero(r_ok))
        self._range(np.abs(r[r_ok]), fmt_max, fmt_min_sub, fmt_min_normal)
        ok = r_ok & c_ok
        r, c = r[ok], c[ok]
        if r.size == 0:
            return
        d = c - r
        ad = np.abs(d)
        self.cand_max = max(self.cand_max, float(np.abs(c).max()))
        self.err_max = max(self.err_max, float(ad.max()))
        with np.errstate(over="ignore"):
            err_sum, err2, ref2 = float(ad.sum()), float(np.dot(d, d)), float(np.dot(r, r))
        if not math.isfinite(err_sum + err2 + ref2):  # float32 sums of huge finite values
            err_sum, err2, ref2 = _sums64(r, c)
        self.err2, self.ref2, self.err_sum = (self.err2 + err2, self.ref2 + ref2,
                                              self.err_sum + err_sum)
        small = np.abs(r) < fmt_min_normal
        if small.any():
            self.lost += int(np.count_nonzero(small & (r != 0) & (c == 0)))

    def _range(self, ar: np.ndarray, fmt_max: float, fmt_min_sub: float,
               fmt_min_normal: float) -> None:
        """Range statistics of the finite reference magnitudes ``ar``."""
        if ar.size == 0:
            return
        self.ref_max = max(self.ref_max, float(ar.max()))
        self.overflow += int(np.count_nonzero(ar > fmt_max))
        if float(ar.min()) < fmt_min_normal:  # fast path: nothing small, nothing to count
            nonzero = ar > 0
            self.flush += int(np.count_nonzero(nonzero & (ar < fmt_min_sub / 2)))
            self.subnormal += int(np.count_nonzero(nonzero & (ar >= fmt_min_sub / 2)
                                                   & (ar < fmt_min_normal)))

    def fold(self, numel: int, ref_max: float, cand_max: float, err_max: float, err_sum: float,
             err2: float, ref2: float, nan: float, inf: float, ref_bad: float, overflow: float,
             flush: float, subnormal: float, lost: float) -> None:
        """Fold in one sample's statistics computed elsewhere (``layerwise.fused``'s kernel,
        ``layerwise.resident``'s graph, whose ``FIELDS`` follow this order): its element count,
        maxima, sums and counts (counts may come as floats)."""
        self.numel += numel
        self.ref_max, self.cand_max = max(self.ref_max, ref_max), max(self.cand_max, cand_max)
        self.err_max = max(self.err_max, err_max)
        self.err_sum, self.err2 = self.err_sum + err_sum, self.err2 + err2
        self.ref2, self.nan, self.inf = self.ref2 + ref2, self.nan + int(nan), self.inf + int(inf)
        self.ref_bad, self.overflow = self.ref_bad + int(ref_bad), self.overflow + int(overflow)
        self.flush, self.subnormal = self.flush + int(flush), self.subnormal + int(subnormal)
        self.lost += int(lost)

    def record(self, fmt_max: float) -> LayerRecord:
        s = self.site
        rel = l2_ratio(self.err2, self.ref2, self.nan + self.inf)
        headroom = math.log2(fmt_max / self.ref_max) if self.ref_max > 0 else math.inf
        return LayerRecord(s.name, s.node, s.op_type, s.index, self.numel, self.ref_max,
                           self.cand_max, self.err_max,
                           self.err_sum / self.numel if self.numel else 0.0, rel, self.nan,
                           self.inf, self.ref_bad, self.overflow, self.flush, self.subnormal,
                           self.lost, headroom)


def _sums64(r: np.ndarray, c: np.ndarray) -> tuple[float, float, float]:
    """sum |c - r|, sum (c - r)^2, sum r^2 of finite pairs, in float64."""
    r64 = r.astype(np.float64)
    d64 = c.astype(np.float64) - r64
    return float(np.abs(d64).sum()), float(np.dot(d64, d64)), float(np.dot(r64, r64))


class StatsPool:
    """Accumulators of the compared tensors, updated in parallel threads.

    Args:
        sites: The tensors to accumulate, in topological order.
        fmt: The target format (range checks).
        threads: Worker threads (default: up to 2, the CPU count). Each call to ``add``
            waits for its tensors, so every accumulator receives the samples in order.
        compiled: Fold float32 pairs with ``layerwise.fused``'s kernel (``fused.worth_loading``).

    The workers of one ``add`` take its tensors from one queue: one job per worker, not one
    per tensor, since handing a job over costs more than folding a small tensor (2 workers:
    about 100 us of CPU per tiny tensor with a job each, 35 us from one queue; measured
    2026-11-28 on the 2-core sandbox, where PP-OCRv4 rec folds 12,896 tensors).
    """

    def __init__(self, sites: Sequence[TensorSite], fmt: FloatFormat,
                 threads: int | None = None, compiled: bool = False) -> None:
        self.accs = {s.name: _Accumulator(s) for s in sites}
        self.fmt = fmt
        self.compiled = compiled
        self._local = threading.local()
        workers = threads if threads is not None else min(2, os.cpu_count() or 1)
        self._workers = workers
        self._pool = ThreadPoolExecutor(workers) if workers > 1 else None
        self._pending: list[Future] = []
        self._queue: deque[tuple[str, np.ndarray, np.ndarray]] = deque()

    def add(self, names: Sequence[str], ref: Mapping[str, np.ndarray],
            cand: Mapping[str, np.ndarray]) -> None:
        """Fold the ``names`` present in both result dicts into their accumulators.

        With worker threads this returns once the previous call's tensors are folded and this
        call's are queued: the next sample's runs overlap these statistics (det layerwise
        1.2 vs 1.4 s, +0.1 GB peak RSS, measured 2026-11-24), and the arrays stay referenced
        until folded. ``records`` (or ``flush``) waits for the last call.
        """
        todo = [n for n in names if n in ref and n in cand]
        if self._pool is None:
            for n in todo:
                self._add(n, ref[n], cand[n])
            return
        self.flush()
        # each tensor leaves the queue with its arrays, which are freed once folded
        self._queue = queue = deque((n, ref[n], cand[n]) for n in todo)
        self._pending = [self._pool.submit(self._drain, queue)
                         for _ in range(min(self._workers, len(todo)))]

    def _drain(self, queue: deque[tuple[str, np.ndarray, np.ndarray]]) -> None:
        """Fold the tensors taken from ``queue`` until it is empty (``popleft`` is atomic)."""
        while True:
            try:
                name, ref, cand = queue.popleft()
            except IndexError:
                return
            self._add(name, ref, cand)
            del ref, cand

    def flush(self) -> None:
        """Wait until every tensor given to ``add`` is folded in (re-raises its error)."""
        pending, self._pending = self._pending, []
        for job in pending:
            job.result()

    def _add(self, name: str, ref: np.ndarray, cand: np.ndarray) -> None:
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = Scratch()
        f = self.fmt
        self.accs[name].add(ref, cand, f.max, f.min_subnormal, f.min_normal, scratch,
                            self.compiled)

    def records(self, sites: Sequence[TensorSite], skip: set[str]) -> tuple[LayerRecord, ...]:
        """Records of ``sites`` (minus ``skip``), in the given order."""
        self.flush()
        return tuple(self.accs[s.name].record(self.fmt.max) for s in sites if s.name not in skip)

    def close(self) -> None:
        """Stop the worker threads and free the temporaries (unfolded tensors are dropped)."""
        self._queue.clear()
        for job in self._pending:
            job.cancel()
        self._pending = []
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        self._local = threading.local()
