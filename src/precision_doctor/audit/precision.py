"""Infer the precision a TensorRT layer ran in from its tensor formats and its tactic name.

TensorRT's layer information has no "precision" field (TREx infers it the same way). What it
does report:

* ``Format/Datatype`` of every input/output: long strings before TensorRT 10 Myelin kernels
  ("Row major linear FP32", "Channel major FP16 format where channel % 8 == 0",
  "Thirty-two wide channel vectorized row major Int8 format", "Row major linear BFloat16
  format") and bare type names in TensorRT 10 kgen/gemm kernels ("Half", "Float").
* ``TacticName``, the kernel: ``sm80_xmma_..._f32f32_tf32f32_f32_...`` names a TF32 tensor-core
  kernel, ``..._f16f16_f16f16_f16_...``/``h16816``/``hmma`` an FP16 one.

Precision rule (see ``infer_precision``; every layer carries its evidence): the compute type
shared by its inputs and outputs, ignoring Int32/Int64/Bool shape tensors and one-element
scalars (the FP32 alpha/beta of a TensorRT 10 FP16 GEMM). A conversion is ``mixed``; FP32
tensors with a TF32 tactic are ``tf32``.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

from precision_doctor.audit.records import CONFIRMED, LIKELY, TensorInfo

# Word token of a Format/Datatype string -> dtype. Tokens are lower-case alphanumeric words, so
# "BFloat16" never reads as "Float" and "UInt8" never as "Int8".
_TOKEN_DTYPE = {
    "fp32": "fp32", "float": "fp32", "float32": "fp32",
    "fp16": "fp16", "half": "fp16", "float16": "fp16",
    "bfloat16": "bf16", "bf16": "bf16",
    "fp8": "fp8", "e4m3": "fp8", "e5m2": "fp8", "fp8e4m3": "fp8", "fp8e5m2": "fp8",
    "fp4": "fp4", "e2m1": "fp4",
    "double": "fp64", "fp64": "fp64",
    "int8": "int8", "uint8": "uint8", "int4": "int4",
    "int16": "int16", "uint16": "uint16", "int32": "int32", "uint32": "uint32",
    "int64": "int64", "uint64": "uint64", "bool": "bool",
}
# Types that carry the layer's arithmetic (quantized int8/int4 included); others are shape/index.
COMPUTE_DTYPES = frozenset({"fp32", "fp16", "bf16", "fp8", "fp4", "fp64", "int8", "uint8",
                            "int4"})

# TF32 tactics. Confirmed: the kernel name says tf32 (e.g.
# "sm80_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_..._tensor16x8x8", seen in
# the TREx A100 FP32 ResNet sample). Likely: cuDNN/cuBLAS/CUTLASS single-precision tensor-core
# kernels on Ampere or newer ("ampere_s1688...", "tensorop_s16816..."): a tensor-core MMA with
# FP32 storage runs its multiplies in TF32 (NVIDIA A100 architecture whitepaper, 2020).
_TF32_CONFIRMED = re.compile(r"tf32", re.IGNORECASE)
_TF32_LIKELY = re.compile(r"(?:ampere|hopper|sm_?(?:8\d|9\d|1\d\d)|tensorop)_s(?:1688|16816)",
                          re.IGNORECASE)
# FP16 tactics (corroborating evidence only).
_FP16_TACTIC = re.compile(r"f16f16|h1688|h16816|hmma|fp16|_h884|half", re.IGNORECASE)
_INT8_TACTIC = re.compile(r"i8i8|int8|imma|i8816", re.IGNORECASE)


def parse_format(fmt: str) -> str:
    """The data type named by a ``Format/Datatype`` string.

    Args:
        fmt: E.g. "Row major linear FP32", "Channel major FP16 format where channel % 8 == 0",
            "Half", "Row major linear BFloat16 format", "Four wide channel vectorized row major
            Int8 format".

    Returns:
        ``fp32``, ``fp16``, ``bf16``, ``fp8``, ``fp4``, ``fp64``, ``int8``, ``uint8``,
        ``int32``, ``int64``, ``bool``, ... or ``unknown`` when no type word is found.
    """
    for token in re.findall(r"[a-z0-9]+", fmt.lower()):
        if token in _TOKEN_DTYPE:
            return _TOKEN_DTYPE[token]
    return "unknown"


def tf32_tactic(tactic: str | None) -> str | None:
    """Whether a tactic (kernel) name is a TF32 tensor-core kernel.

    Returns:
        ``confirmed`` when the name contains "tf32", ``likely`` for Ampere+ single-precision
        tensor-core kernels (``ampere_s1688...``, ``tensorop_s16816...``), else None.
    """
    if not tactic:
        return None
    if _TF32_CONFIRMED.search(tactic):
        return CONFIRMED
    if _TF32_LIKELY.search(tactic):
        return LIKELY
    return None


def _elements(shape: Sequence[int]) -> int | None:
    if not shape or any(d < 0 for d in shape):
        return None
    return math.prod(shape)


def side_precision(tensors: Sequence[TensorInfo]) -> str | None:
    """The compute dtype of one side (inputs or outputs) of a layer.

    Shape/index tensors (int32/int64/bool) are ignored, and so are one-element tensors when
    larger ones exist (the FP32 alpha/beta scalars of a TensorRT 10 FP16 GEMM).

    Returns:
        The dtype when all remaining tensors share it, ``mixed`` when they do not, or None when
        the side has no compute tensor.
    """
    compute = [t for t in tensors if t.dtype in COMPUTE_DTYPES]
    if not compute:
        return None
    big = [t for t in compute if (_elements(t.shape) or 2) > 1] or compute
    kinds = sorted({t.dtype for t in big})
    return kinds[0] if len(kinds) == 1 else "mixed"


def _describe(side: str, tensors: Sequence[TensorInfo]) -> str | None:
    if not tensors:
        return None
    formats = list(dict.fromkeys(t.format for t in tensors))
    return f"{side}: " + "; ".join(formats)


def infer_precision(inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo],
                    tactic: str | None, weights_type: str | None = None, fused: bool = False,
                    conversion: bool = False,
                    ) -> tuple[str, str | None, str | None, tuple[str, ...]]:
    """Precision of one layer, with the evidence.

    Rule: the compute dtype shared by the inputs and outputs (shape tensors and scalars
    ignored). A conversion (a reformat/cast layer, or one input and one output of different
    types) is ``mixed``. Another layer whose sides differ (e.g. a Myelin region fed an FP32
    network input and FP16 activations, writing FP16) takes the precision of its outputs,
    which TensorRT kernels write in their compute precision; the evidence says so. FP32 with a
    TF32 tactic is ``tf32``.

    Args:
        inputs: The layer's input tensors.
        outputs: The layer's output tensors.
        tactic: ``TacticName``, when reported.
        weights_type: ``Weights.Type`` ("Half", "Float", "Int8"), when reported.
        fused: The layer is a Myelin-fused region/kernel (only its boundary is visible).
        conversion: The layer only converts/copies data (Reformat, MyelinReformat, NoOp).

    Returns:
        ``(precision, input_precision, output_precision, evidence)``.
    """
    evidence = [e for e in (_describe("inputs", inputs), _describe("outputs", outputs)) if e]
    if weights_type:
        evidence.append(f"weights: {weights_type}")
    if tactic:
        evidence.append(f"tactic: {tactic}")
    if not inputs and not outputs:
        if fused:
            evidence.insert(0, "fused Myelin region: TensorRT reports no tensor formats for it, "
                               "its precision is not visible")
            return "unknown", None, None, tuple(evidence)
        evidence.insert(0, "no input/output tensors reported")
        return "none", None, None, tuple(evidence)
    if all(t.dtype == "unknown" for t in (*inputs, *outputs)):
        evidence.insert(0, "tensor formats not recognised")
        return "unknown", None, None, tuple(evidence)
    in_p, out_p = side_precision(inputs), side_precision(outputs)
    if in_p is None and out_p is None:
        kinds = sorted({t.dtype for t in (*inputs, *outputs)})
        evidence.insert(0, f"only shape/index tensors ({', '.join(kinds)})")
        return ("bool" if kinds == ["bool"] else "int"), None, None, tuple(evidence)
    if in_p is None or out_p is None or in_p == out_p:
        precision = in_p or out_p or "unknown"
    elif conversion or (in_p != "mixed" and out_p != "mixed"
                        and len(inputs) == 1 and len(outputs) == 1):
        precision = "mixed"
        evidence.insert(0, f"converts {in_p} -> {out_p}")
    else:
        precision = out_p if out_p != "mixed" else in_p
        evidence.insert(0, f"inputs {in_p}, outputs {out_p}: precision taken from the "
                           f"{'outputs' if out_p != 'mixed' else 'inputs'}")
    if precision == "fp32":
        tf32 = tf32_tactic(tactic)
        if tf32 == CONFIRMED:
            precision = "tf32"
            evidence.insert(0, "FP32 tensors computed by a TF32 tensor-core tactic")
        elif tf32 == LIKELY:
            evidence.insert(0, "FP32 tensors; the tactic looks like a TF32 tensor-core kernel")
    if fused:
        evidence.append("fused Myelin region: only its boundary tensors are visible; its "
                        "internal precision is not reported")
    return precision, in_p, out_p, tuple(evidence)


def tactic_hint(tactic: str | None) -> str | None:
    """The precision a tactic name suggests (``tf32``, ``fp16``, ``int8``) or None."""
    if not tactic:
        return None
    if tf32_tactic(tactic):
        return "tf32"
    if _INT8_TACTIC.search(tactic):
        return "int8"
    if _FP16_TACTIC.search(tactic):
        return "fp16"
    return None
