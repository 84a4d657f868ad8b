"""Transformer headroom: residual stream, LayerNorm statistics and attention scores vs FP16's range.

Three places break a transformer in FP16 (field reports 1, 2 and 4 of MISSION.md):

* **Residual stream** x (the LayerNorm input): overflows when max|x| > 65504.
* **LayerNorm variance**: var = mean((x - mean)^2). With FP16 statistics the square d^2 is
  stored in FP16, so it overflows when |x - mean| > sqrt(65504) = 255.94, long before x does;
  this is the "LayerNorm may overflow in FP16" warning. With FP32 statistics (a fused
  ``LayerNormalization`` with ``stash_type`` = 1, which ONNX Runtime CUDA and TensorRT compute
  internally in FP32) only x itself must fit.
* **Attention scores** s = QK^T before the softmax: when the exporter applies the 1/sqrt(d)
  scale *after* the MatMul, s is stored in FP16 unscaled and can overflow although the softmax
  input s/sqrt(d) would fit (d = 64 gives an 8x smaller softmax input).

For each site the *headroom* is ``65504 / peak`` (peak = the largest magnitude over all samples:
max|x|, max (x - mean)^2, max|s|), as a ratio of the quantity itself: 1.33 means the quantity
reached 75% of FP16's largest finite value (MiniLM's layer-0 LayerNorm square: 49,281).

Which statistics precision the diagnosis *assumed* follows the emulator (``precision.emulate``):
a decomposed chain is a row of ordinary nodes, each rounded to FP16 (FP16 statistics); a fused
``LayerNormalization`` runs on the rounded input in FP32 (FP32 statistics, as its ``stash_type``
= 1 asks), unless its ``stash_type`` is 0: then the emulator expands it into the rounded chain
(``precision.emulate_layernorm``) and FP16 statistics are assumed. Both are computed here for
every LayerNorm, on the real input: the relative L2 error of the normalized output with FP16
statistics and with FP32 statistics, so the report can say what the other choice would give.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.diagnosis.headroom.records import (
    STATISTICS,
    AttentionStat,
    LayerNormStat,
    TransformerReport,
    block_rows,
)
from precision_doctor.diagnosis.headroom.sites import (
    AttentionSite,
    LayerNormSite,
    assign_blocks,
    centered,
    find_attention,
    find_layernorms,
)
from precision_doctor.graph.outputs import mark_outputs
from precision_doctor.runners.ort import OrtRunner

FP16_MAX = 65504.0  # largest finite IEEE-754 binary16 value
FP16_SQRT_MAX = math.sqrt(FP16_MAX)  # 255.94: |x - mean| above this overflows d^2 in FP16
_F16 = np.float16


def _headroom(peak: float) -> float:
    return math.inf if peak == 0 else (0.0 if not math.isfinite(peak) else FP16_MAX / peak)


def _rel_l2(ref: np.ndarray, got: np.ndarray) -> float:
    if not np.isfinite(got).all():
        return math.inf
    den = float(np.linalg.norm(ref))
    return float(np.linalg.norm(got - ref)) / den if den else 0.0


def layernorm_statistics(x: np.ndarray, axis: int, eps: float) -> dict[str, float]:
    """Normalize ``x`` with FP16 statistics and with FP32 statistics, against exact FP64.

    FP16 statistics (each step stored in FP16, reductions accumulated in FP32, as the
    emulator models an FP16 engine running the decomposed chain)::

        m = f16(mean(x16)); d = f16(x16 - m); q = f16(d^2); v = f16(mean(q));
        y = f16(d / f16(sqrt(f16(v + eps))))

    FP32 statistics: y = f16((x16 - mean(x16)) / sqrt(var(x16) + eps)) computed in FP32 (the
    fused op with ``stash_type`` = 1). ``x16`` is x rounded to FP16 in both.

    Args:
        x: The LayerNorm input, float32, any shape.
        axis: First normalized axis (negative counts from the end).
        eps: Variance epsilon.

    Returns:
        ``dev_max`` (max|x - mean|), ``square_peak`` (dev_max^2), ``fp16_stats_overflow``
        (1.0 when q has inf), ``fp16_stats_rel_l2`` and ``fp32_stats_rel_l2`` (relative L2 of
        the normalized output vs FP64; inf when non-finite).
    """
    axes = tuple(range(axis % x.ndim, x.ndim))
    d64 = centered(x, axis)
    exact = d64 / np.sqrt((d64 ** 2).mean(axis=axes, keepdims=True) + eps)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        x16 = x.astype(_F16).astype(np.float32)
        m = x16.mean(axis=axes, keepdims=True).astype(_F16).astype(np.float32)
        d = (x16 - m).astype(_F16).astype(np.float32)
        q = (d * d).astype(_F16)
        v = q.astype(np.float32).mean(axis=axes, keepdims=True).astype(_F16).astype(np.float32)
        std = np.sqrt((v + np.float32(_F16(eps))).astype(_F16).astype(np.float32))
        y16 = (d / std.astype(_F16).astype(np.float32)).astype(_F16).astype(np.float64)
        m32 = x16.mean(axis=axes, keepdims=True)
        d32 = x16 - m32
        y32 = (d32 / np.sqrt((d32 * d32).mean(axis=axes, keepdims=True) + np.float32(eps))
               ).astype(_F16).astype(np.float64)
    dev_max = float(np.abs(d64).max()) if d64.size else 0.0
    return {"dev_max": dev_max, "square_peak": dev_max ** 2,
            "fp16_stats_overflow": float(not np.isfinite(q).all()),
            "fp16_stats_rel_l2": _rel_l2(exact, y16), "fp32_stats_rel_l2": _rel_l2(exact, y32)}


def _sites_of(model: onnx.ModelProto) -> tuple[list[LayerNormSite], list[AttentionSite]]:
    return find_layernorms(model), find_attention(model)


def analyze_transformer(model: onnx.ModelProto, samples: Sequence[Mapping[str, np.ndarray]]
                        ) -> TransformerReport | None:
    """Measure the FP16 headroom of every LayerNorm and attention on real inputs (FP32 runs).

    Args:
        model: FP32 model (nodes named).
        samples: Feeds (input name -> array), one ONNX Runtime CPU run each; only the LayerNorm
            inputs and the attention scores are fetched (a few tensors per block).

    Returns:
        The ``TransformerReport`` (without stress result; see ``diagnosis.headroom.stress``),
        or None when the model has neither LayerNorms nor attention.

    Raises:
        BackendError: ONNX Runtime fails on the model.
    """
    probe = HeadroomProbe(model)
    if not probe.lns and not probe.atts:
        return None
    with probe:
        return probe.measure(samples)


class HeadroomProbe:
    """The LayerNorm and attention sites (``lns``, ``atts``) of ``analyze_transformer`` and one
    FP32 session fetching them (opened by ``with``, which raises ``BackendError`` when ONNX
    Runtime cannot), set up once for many runs: the stress probe runs up to ~26 scales."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.lns, self.atts = _sites_of(model)
        self.blocks = assign_blocks(self.lns, self.atts)
        self.names = sorted({s.input for s in self.lns} | {a.scores for a in self.atts}
                            | {a.softmax_input for a in self.atts})
        self.graph_inputs = {i.name for i in model.graph.input}
        self.fetch_names = [n for n in self.names if n not in self.graph_inputs]
        self._model = model
        self._runner: OrtRunner | None = None

    def __enter__(self) -> HeadroomProbe:  # the marked copy only for a model with sites
        marked = mark_outputs(self._model, self.fetch_names)
        self._runner = OrtRunner(marked, name="transformer-probe").__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            self._runner.__exit__(*exc)

    def fetch(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The site tensors (LayerNorm inputs, attention scores) of one FP32 run, float32."""
        assert self._runner is not None, "use the probe inside a `with` block"
        got = {**{n: feeds[n] for n in self.names if n in self.graph_inputs},
               **self._runner.run(dict(feeds), self.fetch_names)}
        return {k: np.asarray(v, dtype=np.float32) for k, v in got.items()}

    def measure(self, samples: Sequence[Mapping[str, np.ndarray]]) -> TransformerReport:
        """``analyze_transformer``'s report over ``samples``."""
        lns, atts = self.lns, self.atts
        ln_acc: dict[str, dict[str, float]] = {}
        att_acc: dict[str, list[float]] = {}
        for feeds in samples:
            got = self.fetch(feeds)
            for s in lns:
                x = got[s.input]
                st = layernorm_statistics(x, s.axis, s.epsilon)
                st["input_max"] = float(np.abs(x).max()) if x.size else 0.0
                acc = ln_acc.setdefault(s.node, {})
                for k, v in st.items():
                    acc[k] = max(acc.get(k, -math.inf), v)
            for a in atts:
                sc, si = got[a.scores], got[a.softmax_input]
                acc2 = att_acc.setdefault(a.softmax, [0.0, -math.inf])
                acc2[0] = max(acc2[0], float(np.abs(sc).max()) if sc.size else 0.0)
                acc2[1] = max(acc2[1], float(si.max()) if si.size else -math.inf)
        blocks = self.blocks
        ln_stats = tuple(LayerNormStat(
            s.node, s.kind, s.input, blocks[s.node], a["input_max"], _headroom(a["input_max"]),
            a["dev_max"], a["square_peak"], _headroom(a["square_peak"]),
            "fp16" if s.fp16_statistics else "fp32",
            bool(a["fp16_stats_overflow"]),
            a["fp16_stats_rel_l2"], a["fp32_stats_rel_l2"])
            for s in lns for a in (ln_acc[s.node],))
        att_stats = tuple(AttentionStat(
            a.softmax, a.matmul, a.scores, blocks[a.softmax], a.scale, m, _headroom(m), si,
            bool(m > FP16_MAX and a.scale is not None and m * abs(a.scale) <= FP16_MAX))
            for a in atts for m, si in (att_acc[a.softmax],))
        kinds = sorted({"fused-stash0" if s.kind == "fused" and s.stash_type != 1 else s.kind
                        for s in lns})
        return TransformerReport(ln_stats, att_stats, block_rows(ln_stats, att_stats),
                                 tuple(STATISTICS[k] for k in kinds))


def fp32_statistics_nodes(model: onnx.ModelProto, samples: Sequence[Mapping[str, np.ndarray]]
                          ) -> dict[str, tuple[str, ...]]:
    """The statistics nodes of every decomposed LayerNorm whose FP16 statistics overflow.

    Keeping exactly these nodes (mean, ``x - mean``, its square, the variance, ``+ eps``,
    ``Sqrt``) in FP32 gives the LayerNorm FP32 statistics without fusing it: the strongly typed
    writer puts Casts around the reduction only, and the normalization ``d / std``, the scale
    and the bias stay FP16. It is the fallback for models that must stay below opset 17.

    Args:
        model: FP32 model (nodes named).
        samples: Real feeds (one FP32 run each, LayerNorm inputs only).

    Returns:
        LayerNorm first-node name -> its statistics node names, for the overflowing ones.
    """
    sites = {s.node: s for s in find_layernorms(model) if s.kind == "decomposed"}
    if not sites:
        return {}
    report = analyze_transformer(model, samples)
    assert report is not None
    return {s.node: sites[s.node].stats_nodes for s in report.layernorms
            if s.node in sites and s.fp16_stats_overflow and sites[s.node].stats_nodes}


__all__ = ["FP16_MAX", "HeadroomProbe", "analyze_transformer", "fp32_statistics_nodes",
           "layernorm_statistics"]
