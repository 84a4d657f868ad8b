"""The layerwise statistics of one float32 (reference, candidate) pair in one compiled pass.

``layerwise.stats`` folds a tensor with about twenty numpy calls per block, each a pass over
the block: 2.1-2.2 ns per element pair on the 2-core sandbox against 0.6-0.7 ns here
(``benchmarks/probes/stats_kernel.py``, 2026-11-28), as much CPU as the model runs
themselves (PP-OCRv4 rec: 8.1 s of statistics against 4.5 s of segment runs,
``benchmarks/probes/layerwise_profile.py``, 2026-11-28). Here numba compiles the same
statistics into three loops (``layerwise.kernels``) over blocks of ``BLOCK`` elements that
stay in the L1 cache, each vectorized by LLVM (AVX2 on the sandbox's EPYC):

* ``_sums``: ``d = c - r`` and the float32 sums of ``|d|``, ``d^2``, ``r^2``. Only
  reassociation and FMA contraction are allowed (no ``nnan``/``ninf``), so a NaN or Inf in
  either tensor, or a float32 sum that overflows (``|x| >~ 1e19``), makes a sum non-finite:
  the block is then handed back to the numpy path, which handles those cases.
* ``_maxima``: max |r|, |c|, |d| as the largest uint32 bit pattern with the sign bit cleared
  (non-negative finite floats order as their bit patterns; integer max reductions vectorize,
  float ones with NaN semantics do not).
* ``_counts``: overflow (|r| > format max), small (|r| < min normal), flushed (non-zero, below
  half the smallest subnormal), exact zeros, and lost (small, non-zero, candidate exactly 0),
  as float32 sums of 0/1 (exact: a block has 4096 elements < 2^24).

Sums are float32 within a block and float64 across blocks, as in the numpy path (which uses
blocks of 2^17); the two agree to ~1e-6 relative, counts and maxima exactly.

Loading numba costs about 0.75 s of CPU and 115 MB of memory per process (its import and
the cached machine code; the first use after installation compiles for about 2.4 s and caches
next to ``kernels.py``), so a comparison uses the kernel only when it folds enough element
pairs to repay that (``worth_loading``). ``preload()`` starts the load in a background
thread, so that it overlaps the model runs that precede a layerwise comparison. Without numba
(or with ``PRECISION_DOCTOR_STATS=numpy``) the numpy path is used.
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import Any, Callable

import numpy as np

# Elements per block: r, c and d of a block (48 KiB) stay in L1/L2 between the three loops;
# the counts are float32 sums of 0/1, exact for blocks below 2^24 elements.
BLOCK = 4096
# Environment variable that selects the numpy statistics ("numpy") instead of the kernel.
ENV = "PRECISION_DOCTOR_STATS"
# Element pairs from which the kernel is used. In a comparison numpy folds a pair in 3.2
# (PP-OCRv4 det) to 4.3 ns (rec), the kernel in 1.2-1.25 ns (CPU seconds of the statistics over
# the pairs folded, benchmarks/probes/layerwise_profile.py, 2026-11-28), so 0.75 s of load
# (probes/stats_kernel.py) breaks even at about 4e8 pairs. At det's 5.2e8 (3 images at 640x640)
# it was a wash in diagnose's wall time (13.62 s median against 13.27 s with numpy,
# layerwise_2026-11-28_cpu2_fused.json) for 115 MB more; at rec's 1.9e9 (32 crops) it saved 4 s
# (36.2 against 40.9 s) there. Twice the break-even.
MIN_PAIRS = 1_000_000_000

_lock = threading.Lock()
_loaded: dict[str, Any] = {}


def _compile() -> Callable[..., int] | None:
    """The jitted ``fold`` of ``layerwise.kernels`` (None without numba)."""
    try:
        from precision_doctor.layerwise import kernels
    except ImportError:
        return None
    return kernels.fold


def worth_loading(pairs: int) -> bool:
    """Whether folding ``pairs`` (reference, candidate) element pairs repays loading the
    kernel (``MIN_PAIRS``; always True once it is loaded)."""
    return _loaded.get("fold") is not None or (pairs >= MIN_PAIRS and not _disabled())


def _disabled() -> bool:
    """``PRECISION_DOCTOR_STATS=numpy``."""
    return os.environ.get(ENV, "").lower() == "numpy"


def kernel() -> Callable[..., int] | None:
    """The compiled kernel, loading numba on first call; None without numba, when
    ``PRECISION_DOCTOR_STATS=numpy``, or when numba fails to import or compile it (a
    ``RuntimeWarning`` says why; the statistics then use numpy). Thread-safe."""
    if _disabled():
        return None
    with _lock:
        if "fold" not in _loaded:
            try:
                fold = _compile()
                if fold is not None:  # load (or compile) the machine code now
                    one = np.zeros(1, np.float32)
                    _fold_into(fold, one, one, 1.0, 1.0, 1.0)
            except Exception as exc:  # numba's own errors (typing, LLVM, an old NumPy)
                warnings.warn(f"the compiled layerwise statistics are unavailable ({exc!r}); "
                              f"using numpy. Set {ENV}=numpy to skip numba.", RuntimeWarning,
                              stacklevel=2)
                fold = None
            _loaded["fold"] = fold
        return _loaded["fold"]


def preload() -> None:
    """Load the kernel in a daemon thread (no-op once loaded): numba's import and machine
    code then overlap whatever the caller runs next (ONNX Runtime releases the GIL)."""
    if "fold" not in _loaded and not _disabled():
        threading.Thread(target=kernel, name="pd-stats-kernel", daemon=True).start()


def fold(r: np.ndarray, c: np.ndarray, fmt_max: float, fmt_min_normal: float,
         half_subnormal: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The statistics of a float32 pair, or None without the kernel.

    Args:
        r / c: Reference and candidate, 1-D C-contiguous float32 of one size.
        fmt_max: The format's largest finite value (overflow: |r| > it).
        fmt_min_normal: Its smallest normal value (small: |r| < it).
        half_subnormal: Half its smallest subnormal (flush-to-zero: 0 < |r| < it).

    Returns:
        ``(maxima, sums, counts, bad)``: float32[3] max |r|, |c|, |d|; float64[3] sums of
        |d|, d^2, r^2; int64[6] elements, overflow, small, flushed, zeros, lost, all over
        the finite blocks only; int64 start offsets of the blocks (``BLOCK`` elements, the last
        one shorter) that were skipped because a sum was not finite (NaN/Inf in a tensor, or
        float32 sums that overflow): the caller folds those with the numpy path.
    """
    kern = kernel()
    if kern is None:
        return None
    return _fold_into(kern, r, c, fmt_max, fmt_min_normal, half_subnormal)


def _fold_into(kern: Callable[..., int], r: np.ndarray, c: np.ndarray, fmt_max: float,
               fmt_min_normal: float, half_subnormal: float
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    maxima = np.zeros(3, np.uint32)
    sums = np.zeros(3, np.float64)
    counts = np.zeros(6, np.int64)
    bad = np.empty(-(-r.size // BLOCK), np.int64)
    n_bad = kern(r, c, np.float32(fmt_max), np.float32(fmt_min_normal),
                 np.float32(half_subnormal), BLOCK, maxima, sums, counts, bad)
    return maxima.view(np.float32), sums, counts, bad[:n_bad]
