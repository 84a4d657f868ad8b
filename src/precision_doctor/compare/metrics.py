"""Error statistics between a reference output and a candidate output.

All statistics are computed in float64 over every element of every sample (samples may have
different shapes, e.g. detection maps of differently sized images). Definitions:

* abs error e_i = |c_i - r_i|; max/mean/median/p99 of e over finite pairs.
* relative L2 error = ||c - r||_2 / ||r||_2 (0 when both are 0; inf when only r is 0).
* cosine similarity = <c, r> / (||c|| ||r||).
* SNR (dB) = 10 log10(||r||^2 / ||c - r||^2) (inf for identical outputs).
* argmax agreement = share of positions where argmax over the last axis agrees; computed only
  for outputs of rank >= 2 whose last axis has 2..100000 entries and that are not image-like
  (rank 4 maps are skipped: argmax over a spatial axis means nothing).

Outputs whose shape depends on the data (a TTS voice's audio, whose length is set by rounded
durations; NonZero/TopK counts) can come out in another shape than the reference's. Such a
sample is not comparable element by element: it is counted in ``shape_changed``, left out of
the statistics above, and the output's relative L2 error is inf (it is not reproduced).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Iterable, Mapping, Sequence

import numpy as np

from precision_doctor.jsonable import from_json_float, json_float


@dataclass(frozen=True)
class OutputMetrics:
    """Error statistics of one output over all samples.

    Attributes:
        numel: Elements compared.
        max_abs / mean_abs / median_abs / p99_abs: Absolute error statistics (output units).
        rel_l2: Relative L2 error (dimensionless).
        cosine: Cosine similarity in [-1, 1].
        snr_db: Signal-to-noise ratio in dB.
        ref_max_abs: Largest |reference| value.
        nan / inf: NaN / Inf counts in the candidate.
        ref_nonfinite: NaN/Inf count in the reference.
        argmax_agreement: Share of argmax decisions that agree, or None when not meaningful.
        shape_changed: Samples whose candidate shape differs from the reference's (left out
            of every statistic but ``rel_l2``, which is then inf).
    """

    numel: int
    max_abs: float
    mean_abs: float
    median_abs: float
    p99_abs: float
    rel_l2: float
    cosine: float
    snr_db: float
    ref_max_abs: float
    nan: int
    inf: int
    ref_nonfinite: int
    argmax_agreement: float | None = None
    shape_changed: int = 0

    @property
    def finite_statistics(self) -> bool:
        """Whether the error statistics describe the whole output: no NaN/Inf in the
        candidate and no sample of another shape (else only the counts mean something)."""
        return not (self.nan or self.inf or self.shape_changed)

    def to_dict(self) -> dict:
        return {k: json_float(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict) -> OutputMetrics:
        return cls(**{k: (from_json_float(v) if isinstance(v, (str, float)) else v)
                      for k, v in data.items()})


def _argmax_applicable(shape: tuple[int, ...]) -> bool:
    return len(shape) >= 2 and len(shape) != 4 and 2 <= shape[-1] <= 100_000


def compute_metrics(reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray]
                    ) -> OutputMetrics:
    """Statistics of one output across samples.

    Args:
        reference: One array per sample (any float/int dtype).
        candidate: One array per sample; a sample whose shape differs from the reference's
            is counted in ``shape_changed`` and left out of the statistics.

    Returns:
        ``OutputMetrics``.
    """
    changed = [i for i, (r, c) in enumerate(zip(reference, candidate))
               if np.shape(r) != np.shape(c)]
    if changed:
        keep = [i for i in range(len(reference)) if i not in set(changed)]
        same = compute_metrics([reference[i] for i in keep], [candidate[i] for i in keep])
        return replace(same, rel_l2=math.inf, snr_db=-math.inf,
                       shape_changed=len(changed))
    # one sample at a time (float64 copies of one sample, not of all of them), so that large
    # outputs cost one pass (256 real rec outputs of 1x40x6625: 1.4-2.2 s instead of 3.3-4.2 s
    # on 2 cores, benchmarks/probes/metrics_speed.py, 2026-11-26)
    numel = ref_nonfinite = nan = inf = 0
    ref2 = err2 = cand2 = cross = 0.0
    ref_max = 0.0
    errors: list[np.ndarray] = []
    for ra, ca in zip(reference, candidate):
        r = np.asarray(ra, np.float64).ravel()
        c = np.asarray(ca, np.float64).ravel()
        numel += r.size
        r_ok, c_ok = np.isfinite(r), np.isfinite(c)
        if not (r_ok.all() and c_ok.all()):
            ref_nonfinite += int(r.size - np.count_nonzero(r_ok))
            nan += int(np.count_nonzero(np.isnan(c)))
            inf += int(np.count_nonzero(np.isinf(c)))
            ok = r_ok & c_ok
            r, c = r[ok], c[ok]
        d = c - r
        ref2 += float(np.dot(r, r))
        err2 += float(np.dot(d, d))
        cand2 += float(np.dot(c, c))
        cross += float(np.dot(c, r))
        if r.size:
            ref_max = max(ref_max, float(np.max(np.abs(r))))
        errors.append(np.abs(d, out=d))
    e = np.concatenate(errors) if errors else np.zeros(0)
    rel_l2 = l2_ratio(err2, ref2, nan + inf)
    cosine = (cross / math.sqrt(cand2 * ref2)
              if cand2 > 0 and ref2 > 0 else float(cand2 == ref2))
    snr = math.inf if err2 == 0 else (10 * math.log10(ref2 / err2) if ref2 > 0 else -math.inf)
    agreement = None
    if len(reference) and _argmax_applicable(reference[0].shape):
        agree = total = 0
        for ra, ca in zip(reference, candidate):
            a, b = np.argmax(ra, axis=-1), np.argmax(ca, axis=-1)
            agree += int((a == b).sum())
            total += a.size
        agreement = agree / total if total else None
    has = e.size > 0
    median, p99 = (float(q) for q in np.quantile(e, [0.5, 0.99])) if has else (0.0, 0.0)
    return OutputMetrics(
        numel=numel,
        max_abs=float(e.max()) if has else 0.0,
        mean_abs=float(e.mean()) if has else 0.0,
        median_abs=median, p99_abs=p99,
        rel_l2=rel_l2, cosine=cosine, snr_db=snr, ref_max_abs=ref_max,
        nan=nan, inf=inf, ref_nonfinite=ref_nonfinite, argmax_agreement=agreement)


def l2_ratio(err2: float, ref2: float, nonfinite: int = 0) -> float:
    """Relative L2 error sqrt(err2 / ref2) from the squared norms of the error and of the
    reference: inf when the candidate has ``nonfinite`` NaN/Inf values, 0 for an exact zero
    reference reproduced exactly, inf for any error against a zero reference."""
    if nonfinite:
        return math.inf
    if ref2 == 0:
        return 0.0 if err2 == 0 else math.inf
    return math.sqrt(err2 / ref2)


def relative_l2(reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray]) -> float:
    """Relative L2 error ||c - r|| / ||r|| over all samples (inf if the candidate is not finite
    or a sample's shape differs)."""
    return relative_l2_of(l2_terms(r, c) for r, c in zip(reference, candidate))


def l2_terms(reference: np.ndarray, candidate: np.ndarray) -> tuple[float, float] | None:
    """One sample's terms of ``relative_l2``: (||c - r||^2, ||r||^2) in float64; None where the
    candidate is not finite or has another shape than the reference (not reproduced)."""
    r64, c64 = np.asarray(reference, np.float64), np.asarray(candidate, np.float64)
    if r64.shape != c64.shape or not np.isfinite(c64).all():
        return None
    d = c64 - r64
    return float(np.vdot(d, d)), float(np.vdot(r64, r64))


def relative_l2_of(terms: Iterable[tuple[float, float] | None]) -> float:
    """``relative_l2`` from per-sample ``l2_terms``, added in the order given (inf at the first
    None: a candidate that is not finite)."""
    num = den = 0.0
    for term in terms:
        if term is None:
            return math.inf
        num += term[0]
        den += term[1]
    return l2_ratio(num, den)


def shape_changes(reference: Mapping[str, Sequence[np.ndarray]],
                  candidate: Mapping[str, Sequence[np.ndarray]]) -> dict[str, list[int]]:
    """Output name -> the samples whose candidate shape differs from the reference's (only
    outputs with such samples; integer outputs included)."""
    changed = {}
    for name, refs in reference.items():
        cands = candidate.get(name, ())
        bad = [i for i, (r, c) in enumerate(zip(refs, cands)) if np.shape(r) != np.shape(c)]
        if bad:
            changed[name] = bad
    return changed
