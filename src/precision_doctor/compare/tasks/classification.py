"""Classification agreement: does the candidate pick the same class as the reference?

Scores may be logits or probabilities of any shape; the class axis is ``axis`` (default the last)
and every other position (batch, and e.g. pixels of a segmentation map) is one decision.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from precision_doctor.compare.tasks.io import select_pair
from precision_doctor.errors import MetricError


def _class_last(ref: np.ndarray, cand: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    if ref.ndim == 0:
        raise MetricError("classification metrics need an output with a class axis, got a scalar")
    try:
        ref = np.moveaxis(ref, axis, -1)
        cand = np.moveaxis(cand, axis, -1)
    except (ValueError, IndexError) as exc:  # numpy's AxisError derives from both
        raise MetricError(f"class axis {axis} is out of range for an output of shape "
                          f"{ref.shape}; pass axis=N") from exc
    if ref.size == 0:
        raise MetricError(f"classification metrics got an empty output of shape {ref.shape}")
    return ref.reshape(-1, ref.shape[-1]), cand.reshape(-1, cand.shape[-1])


def topk_agreement_per_position(reference_scores: np.ndarray, candidate_scores: np.ndarray,
                                k: int = 1, axis: int = -1) -> np.ndarray:
    """Whether the reference's top-1 class is among the candidate's top ``k``, per position.

    Definitions (the usual "top-k accuracy" with the reference's top-1 class as the label, as in
    torchmetrics ``MulticlassAccuracy(top_k=k)``):

    * reference class ``r = argmax(reference)`` (ties: lowest index, as ``numpy.argmax``);
    * ``k == 1``: agreement iff ``argmax(candidate) == r``;
    * ``k > 1``: agreement iff fewer than ``k`` classes score strictly higher than class ``r``
      in the candidate, i.e. ``#{j : c_j > c_r} < k`` (a tie with the k-th class counts as in).

    A candidate position containing NaN never agrees (NaN is not a decision).

    Args:
        reference_scores: Scores (logits or probabilities), any float shape with a class axis.
        candidate_scores: Same shape as ``reference_scores``.
        k: How many of the candidate's best classes may contain the reference class (>= 1).
        axis: The class axis.

    Returns:
        Boolean array, one entry per position (all axes except ``axis`` flattened, C order).

    Raises:
        MetricError: ``k < 1`` or the class axis does not exist.
    """
    if k < 1:
        raise MetricError(f"top-k agreement needs k >= 1, got k={k}")
    ref, cand = _class_last(np.asarray(reference_scores), np.asarray(candidate_scores), axis)
    ref_class = np.argmax(ref, axis=-1)
    nan_rows = np.isnan(cand).any(axis=-1) if cand.dtype.kind == "f" else np.zeros(
        len(cand), dtype=bool)
    if k == 1:
        agree = np.argmax(cand, axis=-1) == ref_class
    else:
        cand_at_ref = np.take_along_axis(cand, ref_class[:, None], axis=-1)
        agree = (cand > cand_at_ref).sum(axis=-1) < k
    return agree & ~nan_rows


def top1_agreement(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray], *,
                   output: str | None = None, axis: int = -1) -> float:
    """Fraction of positions where the candidate's argmax class equals the reference's.

    Formula: ``mean_i [argmax_c cand[i, c] == argmax_c ref[i, c]]`` over every position ``i``.

    Args:
        reference: Reference outputs (name -> array).
        candidate: Candidate outputs (name -> array).
        output: Output holding the class scores (default: first output).
        axis: Class axis (default: last).

    Returns:
        Agreement in [0, 1]; 1.0 when every decision matches.

    Raises:
        MetricError: Missing output, shape mismatch, or bad axis.
    """
    ref, cand = select_pair(reference, candidate, output, role="class scores")
    return float(np.mean(topk_agreement_per_position(ref, cand, 1, axis)))


def top5_agreement(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray], *,
                   output: str | None = None, axis: int = -1, k: int = 5) -> float:
    """Fraction of positions where the reference's top-1 class is in the candidate's top ``k``.

    See :func:`topk_agreement_per_position` for the exact definition and tie rule. With fewer
    than ``k`` classes every finite position agrees.

    Args:
        reference: Reference outputs (name -> array).
        candidate: Candidate outputs (name -> array).
        output: Output holding the class scores (default: first output).
        axis: Class axis (default: last).
        k: Size of the candidate's top set (default 5).

    Returns:
        Agreement in [0, 1].

    Raises:
        MetricError: Missing output, shape mismatch, bad axis or k.
    """
    ref, cand = select_pair(reference, candidate, output, role="class scores")
    return float(np.mean(topk_agreement_per_position(ref, cand, k, axis)))
