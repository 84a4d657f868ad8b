"""Precision inference from Format/Datatype strings and tactic names (real strings)."""

from __future__ import annotations

import pytest

from precision_doctor.audit.precision import (
    infer_precision,
    parse_format,
    side_precision,
    tactic_hint,
    tf32_tactic,
)
from precision_doctor.audit.records import TensorInfo


@pytest.mark.parametrize("fmt,dtype", [
    ("Row major linear FP32", "fp32"),
    ("Channel major FP16 format where channel % 8 == 0", "fp16"),
    ("Row major linear FP16 format", "fp16"),
    ("Channel major FP32 format where channel % 4 == 0", "fp32"),
    ("Thirty-two wide channel vectorized row major Int8 format", "int8"),
    ("Four wide channel vectorized row major Int8 format", "int8"),
    ("Row major linear Int32", "int32"),
    ("Half", "fp16"), ("Float", "fp32"), ("BFloat16", "bf16"), ("FP8", "fp8"),
    ("Row major linear BFloat16 format", "bf16"), ("Row major linear FP8 format", "fp8"),
    ("Channel major BFloat16 format where channel % 8 == 0", "bf16"),
    ("Row major linear BOOL", "bool"), ("UInt8", "uint8"), ("Int64", "int64"),
    ("Unknown format", "unknown"), ("", "unknown"),
])
def test_parse_format(fmt: str, dtype: str) -> None:
    assert parse_format(fmt) == dtype


@pytest.mark.parametrize("tactic,level", [
    ("sm80_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize256x64", "confirmed"),
    ("sm86_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize64x64x64_stage3", "confirmed"),
    ("ampere_s1688gemm_fp32_128x128_ldg8_f2f_stages_32x3_nn", "likely"),
    ("cutlass_80_tensorop_s16816gemm_128x128_32x3_nn_align4", "likely"),
    ("ampere_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1", None),
    ("sm80_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nhwckrsc_nhwc_tilesize32x32x8_ffma", None),
    ("sm80_xmma_gemm_f16f16_f16f16_f16_tn_n_tilesize32x32x64_stage6", None),
    (None, None), ("", None),
])
def test_tf32_tactic(tactic: str | None, level: str | None) -> None:
    assert tf32_tactic(tactic) == level


def test_tactic_hint() -> None:
    assert tactic_hint("ampere_h16816gemm_64x64_ldg8_relu") == "fp16"
    assert tactic_hint("sm75_xmma_fprop_implicit_gemm_interleaved_i8i8_i8i32_f32") == "int8"
    assert tactic_hint("sm86_xmma_gemm_f32f32_tf32f32_f32_tn") == "tf32"
    assert tactic_hint("__myl_Res_0x63adb2bae59ff89a94fc133e2755c132") is None


def t(dtype: str, shape: tuple[int, ...] = (1, 8), fmt: str | None = None) -> TensorInfo:
    return TensorInfo("x", dtype, fmt or dtype, shape)


def test_side_precision_ignores_scalars_and_shape_tensors() -> None:
    # TensorRT 10 FP16 gemm: Half matrices, Float alpha/beta scalars.
    assert side_precision([t("fp16"), t("fp16"), t("fp32", (1,)), t("fp32", (1,))]) == "fp16"
    assert side_precision([t("int32"), t("fp16")]) == "fp16"
    assert side_precision([t("int64")]) is None
    assert side_precision([t("fp16"), t("fp32")]) == "mixed"
    assert side_precision([t("fp32", (1,))]) == "fp32"


def test_infer_conversion_is_mixed() -> None:
    p, i, o, ev = infer_precision([t("fp32")], [t("fp16")], None, conversion=True)
    assert (p, i, o) == ("mixed", "fp32", "fp16")
    assert ev[0] == "converts fp32 -> fp16"


def test_infer_region_with_mixed_inputs_takes_outputs() -> None:
    p, i, o, ev = infer_precision([t("fp16"), t("fp32")], [t("fp16")], None, fused=True)
    assert (p, i, o) == ("fp16", "mixed", "fp16")
    assert "precision taken from the outputs" in ev[0]
    assert "internal precision is not reported" in ev[-1]


def test_infer_tf32_and_fused_without_formats() -> None:
    p, *_ , ev = infer_precision([t("fp32")], [t("fp32")], "sm80_xmma_gemm_f32f32_tf32f32_f32")
    assert p == "tf32" and "TF32" in ev[0]
    p, i, o, ev = infer_precision([], [], None, fused=True)
    assert (p, i, o) == ("unknown", None, None) and "fused Myelin region" in ev[0]
    assert infer_precision([], [], None)[0] == "none"
    assert infer_precision([t("int32")], [t("int32")], None)[0] == "int"
    assert infer_precision([t("unknown")], [t("unknown")], None)[0] == "unknown"
