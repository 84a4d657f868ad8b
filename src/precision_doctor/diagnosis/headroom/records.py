"""The transformer headroom report: per-LayerNorm, per-attention and per-block records of FP16
headroom (the diagnosis report's ``transformer`` key), measured by ``headroom.probe``.

Headroom is ``65504 / peak`` (FP16's largest finite value over the quantity's largest magnitude);
``probe``'s module docstring has the math. Every record round-trips through JSON (non-finite
floats as the strings "inf"/"nan", ``jsonable``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from precision_doctor.jsonable import from_json_float, json_float


@dataclass(frozen=True)
class LayerNormStat:
    """Measured range of one LayerNorm (over all samples).

    Attributes:
        node / kind / input / block: Where (see ``LayerNormSite``; block per ``assign_blocks``).
        input_max: max|x|, the residual stream's magnitude; ``input_headroom`` = 65504 / it.
        dev_max: max|x - mean|; ``square_peak`` = dev_max^2 is the peak of the variance's
            square; ``variance_headroom`` = 65504 / square_peak (< 1: FP16 statistics overflow).
        statistics: What the diagnosis assumed: ``fp16`` (decomposed, or fused with
            ``stash_type`` != 1) or ``fp32`` (fused, ``stash_type`` = 1).
        fp16_stats_overflow: d^2 overflows with FP16 statistics on these inputs.
        fp16_stats_rel_l2 / fp32_stats_rel_l2: Worst-sample relative L2 error of the normalized
            output with FP16 / FP32 statistics (``layernorm_statistics``).
    """

    node: str
    kind: str
    input: str
    block: int
    input_max: float
    input_headroom: float
    dev_max: float
    square_peak: float
    variance_headroom: float
    statistics: str
    fp16_stats_overflow: bool
    fp16_stats_rel_l2: float
    fp32_stats_rel_l2: float


@dataclass(frozen=True)
class AttentionStat:
    """Measured range of one attention's scores (over all samples).

    Attributes:
        softmax / matmul / scores / block: Where (see ``AttentionSite``).
        scale: Constant applied after QK^T (None: pre-scaled or unscaled).
        scores_max: max|QK^T| as stored (before the scale); ``scores_headroom`` = 65504 / it.
        softmax_input_max: Largest softmax input (signed: mask values are large negatives).
        overflow_before_scale: QK^T exceeds 65504 while the scaled scores would fit: the case
            pre-scaling (``prescale-attention``) cures.
    """

    softmax: str
    matmul: str
    scores: str
    block: int
    scale: float | None
    scores_max: float
    scores_headroom: float
    softmax_input_max: float
    overflow_before_scale: bool


@dataclass(frozen=True)
class BlockRow:
    """One transformer block: the smallest headroom of each kind and the site that limits it.

    Attributes:
        block: Block index (``assign_blocks``).
        residual_max / residual_headroom: Largest LayerNorm input and 65504 / it.
        square_peak / variance_headroom: Largest (x - mean)^2 and 65504 / it (FP16 statistics).
        scores_max / scores_headroom: Largest |QK^T| and 65504 / it (None without attention).
        limiting: ``residual``, ``variance`` or ``scores``: the kind with the least headroom
            under the statistics the diagnosis assumed; ``node``: its site.
        headroom: That least headroom.
    """

    block: int
    residual_max: float | None
    residual_headroom: float | None
    square_peak: float | None
    variance_headroom: float | None
    scores_max: float | None
    scores_headroom: float | None
    limiting: str
    node: str
    headroom: float


_FLOATS = ("input_max", "input_headroom", "dev_max", "square_peak", "variance_headroom",
           "fp16_stats_rel_l2", "fp32_stats_rel_l2", "scores_max", "scores_headroom",
           "softmax_input_max", "residual_max", "residual_headroom", "headroom", "scale")


def _to_json(obj) -> dict:
    return {k: json_float(v) if k in _FLOATS and v is not None else v
            for k, v in asdict(obj).items()}


def _from_json(cls, d: Mapping):
    return cls(**{k: from_json_float(v) if k in _FLOATS and v is not None else v
                  for k, v in d.items()})


@dataclass(frozen=True)
class TransformerReport:
    """Per-site and per-block FP16 headroom of a transformer (the report's ``transformer`` key).

    Attributes:
        layernorms / attention / blocks: The tables.
        statistics: One sentence per LayerNorm kind present: the statistics precision assumed.
        stress: The stress probe's result as a dict (``StressResult.to_dict``), or None.
    """

    layernorms: tuple[LayerNormStat, ...]
    attention: tuple[AttentionStat, ...]
    blocks: tuple[BlockRow, ...]
    statistics: tuple[str, ...]
    stress: dict | None = None

    def to_dict(self) -> dict:
        return {"layernorms": [_to_json(s) for s in self.layernorms],
                "attention": [_to_json(s) for s in self.attention],
                "blocks": [_to_json(b) for b in self.blocks],
                "statistics": list(self.statistics), "stress": self.stress}

    @classmethod
    def from_dict(cls, d: Mapping) -> TransformerReport:
        return cls(tuple(_from_json(LayerNormStat, s) for s in d.get("layernorms", ())),
                   tuple(_from_json(AttentionStat, s) for s in d.get("attention", ())),
                   tuple(_from_json(BlockRow, b) for b in d.get("blocks", ())),
                   tuple(d.get("statistics", ())), d.get("stress"))

    def with_stress(self, stress: dict | None) -> TransformerReport:
        return TransformerReport(self.layernorms, self.attention, self.blocks, self.statistics,
                                 stress)


STATISTICS = {
    "decomposed": "decomposed LayerNorms: FP16 statistics assumed (every node of the "
                  "ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div chain rounded to FP16, as an FP16 "
                  "engine runs an unfused chain); (x - mean)^2 overflows above |x - mean| = 255.9",
    "fused": "fused LayerNormalization: FP32 statistics assumed (stash_type=1: ONNX Runtime "
             "CUDA and TensorRT compute mean and variance in FP32 on the FP16 input); if the "
             "engine computes them in FP16, see fp16_stats_overflow per LayerNorm",
    "fused-stash0": "LayerNormalization with stash_type=0: FP16 statistics assumed (the "
                    "emulator expands it into its statistics chain); layernorm-fp32-stats sets "
                    "stash_type=1",
}


def block_rows(lns: Sequence[LayerNormStat], atts: Sequence[AttentionStat]
               ) -> tuple[BlockRow, ...]:
    """One row per transformer block: the least headroom of each kind and the site that limits
    the block (``BlockRow``); ``variance`` competes only under FP16 statistics, unless the block
    has nothing else to show."""
    rows = []
    for b in sorted({s.block for s in lns} | {a.block for a in atts}):
        ln_b = [s for s in lns if s.block == b]
        at_b = [a for a in atts if a.block == b]
        cands: list[tuple[float, str, str]] = []
        res = max(ln_b, key=lambda s: s.input_max, default=None)
        var = max(ln_b, key=lambda s: s.square_peak, default=None)
        att = max(at_b, key=lambda a: a.scores_max, default=None)
        if res is not None:
            cands.append((res.input_headroom, "residual", res.node))
        if var is not None and var.statistics == "fp16":
            cands.append((var.variance_headroom, "variance", var.node))
        if att is not None:
            cands.append((att.scores_headroom, "scores", att.matmul))
        if var is not None and var.statistics == "fp32" and not cands:
            cands.append((var.variance_headroom, "variance", var.node))
        head, kind, node = min(cands)
        rows.append(BlockRow(
            b, res.input_max if res else None, res.input_headroom if res else None,
            var.square_peak if var else None, var.variance_headroom if var else None,
            att.scores_max if att else None, att.scores_headroom if att else None,
            kind, node, head))
    return tuple(rows)


__all__ = ["STATISTICS", "AttentionStat", "BlockRow", "LayerNormStat", "TransformerReport",
           "block_rows"]
