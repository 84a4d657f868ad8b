"""Task metric for transformer encoders whose output is a sequence of hidden vectors.

``min_cosine``: the smallest cosine similarity, over every position (token, audio frame) of
every sample, between the reference and candidate hidden vectors (last axis). 1.0 = identical
directions; a position whose LayerNorm collapsed (FP16 variance overflow: the normalized row
becomes 0) scores 0. Used as ``benchmarks/transformer_metrics.py:min_cosine`` with threshold
0.99 (sentence-embedding and speech-feature consumers compare hidden vectors by cosine; 0.999 on
every one of 9 x 1500 Whisper frames is below FP16 rounding for a few near-silent frames: the
first run with 0.999 needed 16 FP32 nodes even after the LayerNorm was cured).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def min_cosine(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray],
               output: str | None = None) -> float:
    """Smallest per-position cosine similarity of the hidden vectors of ``output``.

    Args:
        reference / candidate: Output name -> array [..., hidden] (float).
        output: Output to compare (default: the first).

    Returns:
        Minimum cosine in [-1, 1]; 0 for a zero vector against a non-zero one, 1 when both are 0;
        -1 when the candidate has NaN/Inf.
    """
    name = output or next(iter(reference))
    ref = np.asarray(reference[name], np.float64)
    cand = np.asarray(candidate[name], np.float64)
    if not np.isfinite(cand).all():
        return -1.0
    ref2, cand2 = ref.reshape(-1, ref.shape[-1]), cand.reshape(-1, cand.shape[-1])
    nr, nc = np.linalg.norm(ref2, axis=1), np.linalg.norm(cand2, axis=1)
    dot = (ref2 * cand2).sum(axis=1)
    both_zero = (nr == 0) & (nc == 0)
    cos = np.where(both_zero, 1.0, dot / np.maximum(nr * nc, np.finfo(np.float64).tiny))
    return float(cos.min()) if cos.size else 1.0
