"""Numerically safe rewrites that keep more of a model in FP16.

Each rewrite is an ``onnx_ir`` pass (call it on an ``ir.Model``; it returns the model, whether it
changed, and the records of what it did and why it did not apply elsewhere):

- ``fold-constants``: fold constant subgraphs (onnxscript's constant folder).
- ``saturate-constants``: clamp a masking constant beyond the target format's range (an
  attention mask of -FLT_MAX) to +-its largest finite value (needs the target format).
- ``fold-bias-add``: put a per-channel constant Add after Conv/ConvTranspose into the bias.
- ``fold-batchnorm``: fold BatchNormalization into the preceding Conv/ConvTranspose/Gemm.
- ``prescale-attention``: apply the attention's 1/sqrt(d) scale to Q before QK^T.
- ``fuse-layernorm``: fuse decomposed LayerNorms into ``LayerNormalization`` (opset >= 17).
- ``layernorm-fp32-stats``: ``stash_type`` = 1 (FP32 statistics) on every LayerNormalization.
- ``reduce-periodic-argument``: reduce a Sin/Cos/Tan argument modulo 2 pi in FP32 (needs the
  target format; its nodes and the argument's producers are asked for in FP32).
- ``prescale-normalized-residual``: scale a residual stream that only normalizations read by
  2^-k so that FP16 holds it (needs the target format and the stream's calibration maxima).

``apply_rewrites`` runs them on a copy of an ``onnx.ModelProto`` and returns a ``RewriteReport``.
"""

from precision_doctor.precision.rewrites.api import REWRITES, apply_rewrites, convert_opset
from precision_doctor.precision.rewrites.attention import PrescaleAttention
from precision_doctor.precision.rewrites.batchnorm import FoldBatchNorm, fold_batchnorm_params
from precision_doctor.precision.rewrites.bias_add import FoldBiasAdd
from precision_doctor.precision.rewrites.constant_folding import FoldConstants
from precision_doctor.precision.rewrites.graph_edit import RewritePassResult
from precision_doctor.precision.rewrites.layernorm import FuseLayerNorm
from precision_doctor.precision.rewrites.layernorm_stats import LayerNormFp32Stats
from precision_doctor.precision.rewrites.ranges import (
    PrescaleNormalizedResidual,
    ReducePeriodicArgument,
)
from precision_doctor.precision.rewrites.report import RewriteRecord, RewriteReport
from precision_doctor.precision.rewrites.saturate import SaturateConstants

__all__ = [
    "REWRITES", "FoldBatchNorm", "FoldBiasAdd", "FoldConstants", "FuseLayerNorm",
    "LayerNormFp32Stats", "PrescaleAttention", "PrescaleNormalizedResidual",
    "ReducePeriodicArgument",
    "RewritePassResult", "RewriteRecord", "RewriteReport", "SaturateConstants", "apply_rewrites",
    "convert_opset",
    "fold_batchnorm_params",
]
