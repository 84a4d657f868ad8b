"""Layerwise comparison: every intermediate floating tensor of a candidate vs the reference.

Tensors are marked as outputs in chunks that fit a memory budget; statistics are streamed over
samples, so only one chunk of one sample is ever held in memory. Per tensor it records the error
(relative L2, max/mean abs), NaN/Inf in the candidate, the reference's range against the target
format (overflow above its max, flush-to-zero below half its smallest subnormal, subnormals) and
the headroom in bits, log2(format max / observed max).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np
import onnx

from precision_doctor.formats import FORMATS, Precision
from precision_doctor.graph.outputs import (
    TensorSite,
    chunk_sites,
    float_activations,
    mark_outputs,
    producer_inputs,
)
from precision_doctor.jsonable import from_json_float, json_float
from precision_doctor.runners.base import Runner

RunnerFactory = Callable[[onnx.ModelProto], Runner]
Progress = Callable[[int, int], None]


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


@dataclass(frozen=True)
class LayerwiseResult:
    """Layerwise comparison of a candidate against the reference.

    Attributes:
        target: Format whose range is checked.
        threshold: Relative L2 error above which a tensor counts as diverged.
        records: One per compared tensor, in topological order.
        first_divergence: First tensor whose rel_l2 exceeds ``threshold`` (None if none).
        nan_birth: First tensor with NaN/Inf in the candidate whose producer's inputs are
            all finite (None if none).
        chunks: Number of marked-output chunks run.
        missing: Tensors that the candidate model did not expose.
    """

    target: str
    threshold: float
    records: tuple[LayerRecord, ...]
    first_divergence: str | None
    nan_birth: str | None
    chunks: int
    missing: tuple[str, ...] = field(default_factory=tuple)

    def record(self, tensor: str) -> LayerRecord | None:
        """The record of ``tensor`` or None."""
        for r in self.records:
            if r.tensor == tensor:
                return r
        return None

    def to_dict(self) -> dict:
        return {"target": self.target, "threshold": self.threshold,
                "first_divergence": self.first_divergence, "nan_birth": self.nan_birth,
                "chunks": self.chunks, "missing": list(self.missing),
                "records": [r.to_dict() for r in self.records]}

    @classmethod
    def from_dict(cls, data: dict) -> LayerwiseResult:
        return cls(data["target"], data["threshold"],
                   tuple(LayerRecord.from_dict(r) for r in data["records"]),
                   data.get("first_divergence"), data.get("nan_birth"), data.get("chunks", 0),
                   tuple(data.get("missing", ())))


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
            fmt_min_normal: float) -> None:
        r = np.asarray(ref).ravel()
        c = np.asarray(cand).ravel()
        if r.shape != c.shape or r.size == 0:
            return
        if r.dtype != c.dtype or r.dtype.kind != "f":
            r, c = r.astype(np.float64), c.astype(np.float64)
        self.numel += r.size
        r_ok, c_ok = np.isfinite(r), np.isfinite(c)
        if not (bool(r_ok.all()) and bool(c_ok.all())):
            self.nan += int(np.count_nonzero(np.isnan(c)))
            self.inf += int(np.count_nonzero(np.isinf(c)))
            self.ref_bad += int(r.size - np.count_nonzero(r_ok))
            self._range(np.abs(r[r_ok]), fmt_max, fmt_min_sub, fmt_min_normal)
            ok = r_ok & c_ok
            r, c = r[ok], c[ok]
            if r.size == 0:
                return
        else:
            self._range(np.abs(r), fmt_max, fmt_min_sub, fmt_min_normal)
        d = c - r
        ad = np.abs(d)
        self.cand_max = max(self.cand_max, float(np.abs(c).max()))
        self.err_max = max(self.err_max, float(ad.max()))
        self.err_sum += float(ad.sum(dtype=np.float64))
        self.err2 += float(np.dot(d, d))
        self.ref2 += float(np.dot(r, r))
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
            self.subnormal += int(np.count_nonzero((ar >= fmt_min_sub / 2) & (ar < fmt_min_normal)))

    def record(self, fmt_max: float) -> LayerRecord:
        s = self.site
        if self.nan or self.inf:
            rel = math.inf
        elif self.ref2 == 0:
            rel = 0.0 if self.err2 == 0 else math.inf
        else:
            rel = math.sqrt(self.err2 / self.ref2)
        headroom = math.log2(fmt_max / self.ref_max) if self.ref_max > 0 else math.inf
        return LayerRecord(s.name, s.node, s.op_type, s.index, self.numel, self.ref_max,
                           self.cand_max, self.err_max,
                           self.err_sum / self.numel if self.numel else 0.0, rel, self.nan,
                           self.inf, self.ref_bad, self.overflow, self.flush, self.subnormal,
                           self.lost, headroom)


def compare_layerwise(model: onnx.ModelProto, samples: Sequence[dict[str, np.ndarray]],
                      make_reference: RunnerFactory, make_candidate: RunnerFactory,
                      target: Precision, threshold: float, budget_bytes: int = 1 << 30,
                      tensors: Iterable[str] | None = None, progress: Progress | None = None
                      ) -> LayerwiseResult:
    """Compare every floating intermediate tensor of candidate vs reference.

    Args:
        model: The FP32 model both factories start from (tensor names must match).
        samples: Feed dicts.
        make_reference / make_candidate: Build a runner for a model with marked outputs.
        target: Format whose range is checked (FP16 max 65504 = largest finite binary16).
        threshold: rel_l2 above which a tensor counts as diverged.
        budget_bytes: Estimated bytes of marked outputs per chunk (both runners, one sample).
        tensors: Restrict to these tensor names (default: every floating activation).
        progress: Called as ``progress(done_runs, total_runs)``.

    Returns:
        ``LayerwiseResult``.

    Raises:
        BackendError: A runner fails.
    """
    shapes = {k: v.shape for k, v in samples[0].items()} if samples else {}
    sites = float_activations(model, shapes)
    if tensors is not None:
        wanted = set(tensors)
        sites = [s for s in sites if s.name in wanted]
    fmt = FORMATS[target]
    chunks = chunk_sites(sites, budget_bytes // 2)
    accs = {s.name: _Accumulator(s) for s in sites}
    missing: list[str] = []
    total, done = len(chunks) * max(len(samples), 1), 0
    for chunk in chunks:
        names = [s.name for s in chunk]
        marked = mark_outputs(model, names)
        with make_reference(marked) as ref_runner, make_candidate(marked) as cand_runner:
            available = set(cand_runner.output_names())
            missing.extend(n for n in names if n not in available)
            for feeds in samples:
                ref_out = ref_runner.run(feeds)
                cand_out = cand_runner.run(feeds)
                for n in names:
                    if n in ref_out and n in cand_out:
                        accs[n].add(ref_out[n], cand_out[n], fmt.max, fmt.min_subnormal,
                                    fmt.min_normal)
                del ref_out, cand_out
                done += 1
                if progress:
                    progress(done, total)
    records = tuple(accs[s.name].record(fmt.max) for s in sites if s.name not in missing)
    first = next((r.tensor for r in records if r.rel_l2 > threshold), None)
    return LayerwiseResult(target.value, threshold, records, first,
                           _nan_birth(model, records), len(chunks), tuple(sorted(set(missing))))


def _nan_birth(model: onnx.ModelProto, records: Sequence[LayerRecord]) -> str | None:
    """First tensor with NaN/Inf in the candidate whose producer's float inputs are finite."""
    by_name = {r.tensor: r for r in records}
    inputs_of = producer_inputs(model)
    for r in records:
        if not (r.cand_nan or r.cand_inf) or r.ref_nonfinite:
            continue
        upstream = [by_name[i] for i in inputs_of.get(r.tensor, []) if i in by_name]
        if all(not (u.cand_nan or u.cand_inf) for u in upstream):
            return r.tensor
    return None
