"""``layernorm-fp32-stats``: ask every fused LayerNorm for FP32 statistics (``stash_type`` = 1).

    LayerNormalization(x, g, b, stash_type=0)  =>  LayerNormalization(x, g, b, stash_type=1)

Why: the variance of a LayerNorm squares x - mean, which overflows FP16 once |x - mean| > 255.9
(sqrt(65504)); Whisper tiny.en's last encoder LayerNorm reaches 632 on real speech. ONNX's
``stash_type`` says in which type mean and inverse standard deviation are computed: 1 = float32
whatever the input type. With FP32 statistics only the input and output are FP16, which is the
"LayerNorm in FP32" the field reports needed, without putting the whole block in FP32. In an
FP32 model the attribute changes nothing (the statistics were already FP32).

Engine settings it relies on: the engine must honour ``stash_type`` (ONNX Runtime CPU and CUDA
do; TensorRT's strongly typed ``INormalizationLayer`` computes FP16 LayerNorm with FP32
accumulation; check the built engine's layer information when in doubt).

Checks: ``stash_type`` is already 1 (nothing to do), or the node is not in the default domain.
Decomposed LayerNorms are fused first by ``fuse-layernorm``, which writes ``stash_type`` = 1.
One that stays decomposed (``fuse-layernorm`` not selected, or its check failed) and whose FP16
statistics overflow on the calibration data gets FP32 statistics from ``fix`` instead: its six
statistics nodes are kept FP32 in the plan (Casts around the reduction only; see
``diagnosis.headroom.probe.fp32_statistics_nodes``), when this rule is selected.
"""

from __future__ import annotations

from typing import ClassVar

import onnx_ir as ir

from precision_doctor.precision.rewrites.graph_edit import RewritePassResult
from precision_doctor.precision.rewrites.report import RewriteRecord

FP32_STASH = 1  # ONNX LayerNormalization: stash_type 1 = float32 statistics (the default)


class LayerNormFp32Stats(ir.passes.InPlacePass):
    """Pass: set ``stash_type`` = 1 on every ``LayerNormalization`` of the main graph."""

    rule: ClassVar[str] = "layernorm-fp32-stats"

    def call(self, model: ir.Model) -> RewritePassResult:
        """Rewrite in place; one record per LayerNormalization."""
        records = []
        for node in [n for n in model.graph if n.op_type == "LayerNormalization"]:
            name = (node.name or "",)
            if node.domain not in ("", "ai.onnx"):
                records.append(RewriteRecord(self.rule, False, name, (),
                                             f"domain '{node.domain}' is not ONNX's"))
                continue
            attr = node.attributes.get("stash_type")
            stash = attr.as_int() if attr is not None else FP32_STASH
            if stash == FP32_STASH:
                records.append(RewriteRecord(self.rule, False, name, (),
                                             "stash_type is already 1 (FP32 statistics)",
                                             {"stash_type": stash}))
                continue
            node.attributes["stash_type"] = ir.AttrInt64("stash_type", FP32_STASH)
            records.append(RewriteRecord(
                self.rule, True, name, name, f"stash_type {stash} -> 1: mean and variance in "
                "FP32, input and output stay in the model's precision", {"stash_type": stash}))
        return RewritePassResult(model, any(r.applied for r in records), tuple(records))
