"""The numba loops of ``layerwise.fused`` (imported by it on first use: importing this module
imports numba, about 0.3 s).

Each loop is written so that LLVM vectorizes it: no branches, one element type per loop
(numba widens mixed integer arithmetic to int64, which halves the vector width), integer max
reductions on bit patterns (float ones with NaN semantics stay scalar). The loops are inlined
into ``fold`` (numba IR), which is compiled once with its floating-point flags: a shorter
first compile than four separately compiled functions, and faster loops (first compile and
speed: ``benchmarks/probes/stats_kernel.py``).
"""

from __future__ import annotations

import numba
import numpy as np

# fold's floating-point flags, which its inlined loops take: reassociation (vectorized sums)
# and FMA, never "no NaN/Inf": NaN and Inf must reach the sums
_MATH = {"reassoc", "contract", "nsz", "arcp"}
_inline = numba.njit(nogil=True, boundscheck=False, inline="always")


@_inline
def _sums(r, c, d):
    """d = c - r (written to ``d``); float32 sums of |d|, d^2 and r^2."""
    s, s2, r2 = np.float32(0.0), np.float32(0.0), np.float32(0.0)
    for i in range(r.size):
        x = r[i]
        e = c[i] - x
        d[i] = e
        s += abs(e)
        s2 += e * e
        r2 += x * x
    return s, s2, r2


@_inline
def _maxima(rb, cb, db):
    """Largest magnitude of three finite float32 blocks, as uint32 bit patterns."""
    mask = np.uint32(0x7FFFFFFF)
    m1, m2, m3 = np.uint32(0), np.uint32(0), np.uint32(0)
    for i in range(rb.size):
        x, y, z = np.uint32(rb[i] & mask), np.uint32(cb[i] & mask), np.uint32(db[i] & mask)
        m1 = x if x > m1 else m1
        m2 = y if y > m2 else m2
        m3 = z if z > m3 else m3
    return m1, m2, m3


@_inline
def _counts(r, c, top, normal, half):
    """#(|r| > top), #(|r| < normal), #(0 < |r| < half), #(r == 0), #(small, r != 0, c == 0),
    as float32 sums of 0/1 (exact below 2^24 elements)."""
    f32 = np.float32
    over, small, flush, zero, lost = f32(0), f32(0), f32(0), f32(0), f32(0)
    for i in range(r.size):
        a = abs(r[i])
        s = a < normal
        nonzero = a > 0
        over += f32(a > top)
        small += f32(s)
        flush += f32(nonzero & (a < half))
        zero += f32(a == 0)
        lost += f32(s & nonzero & (c[i] == 0))
    return over, small, flush, zero, lost


@numba.njit(nogil=True, boundscheck=False, cache=True, fastmath=_MATH)
def fold(r, c, top, normal, half, block, maxima, sums, counts, bad):
    """See ``layerwise.fused.fold`` (``block``: elements per block, ``fused.BLOCK``); returns
    the number of blocks written to ``bad``."""
    n = r.size
    d = np.empty(min(n, block), np.float32)
    d_bits, r_bits, c_bits = d.view(np.uint32), r.view(np.uint32), c.view(np.uint32)
    n_bad = 0
    for start in range(0, n, block):
        stop = min(n, start + block)
        m = stop - start
        rb, cb = r[start:stop], c[start:stop]
        s, s2, r2 = _sums(rb, cb, d[:m])
        if not (np.isfinite(s) and np.isfinite(s2) and np.isfinite(r2)):
            bad[n_bad] = start
            n_bad += 1
            continue
        sums[0] += s
        sums[1] += s2
        sums[2] += r2
        m1, m2, m3 = _maxima(r_bits[start:stop], c_bits[start:stop], d_bits[:m])
        maxima[0] = max(maxima[0], m1)
        maxima[1] = max(maxima[1], m2)
        maxima[2] = max(maxima[2], m3)
        over, small, flush, zero, lost = _counts(rb, cb, top, normal, half)
        counts[0] += m
        counts[1] += np.int64(over)
        counts[2] += np.int64(small)
        counts[3] += np.int64(flush)
        counts[4] += np.int64(zero)
        counts[5] += np.int64(lost)
    return n_bad
