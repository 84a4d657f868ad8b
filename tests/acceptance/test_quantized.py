"""Dynamically quantized encoders in FP16: the causes are named with a joint measured cure and
``fix`` meets the default tolerance.

``onnxruntime.quantization.quantize_dynamic`` writes ``MatMulInteger`` + ``DynamicQuantizeLinear``;
the int32 accumulator is Cast to float and multiplied by the scales. In FP16 those Casts overflow
(PP-OCRv4 rec: one reaches 1.15e5 > 65504 on the first 3 paddleocr crops) and the output is
inf/NaN. Acceptance: ``diagnose`` is not ``unexplained`` and its findings' cure (alone or joint)
removes >= 90% of the output error; ``fix --target fp16`` writes a model that meets the default
tolerance (rel L2 <= 1e-2), verified by the tool on the same samples.

Models: :mod:`real_quantized` (rec built from the ``rapidocr_onnxruntime`` wheel in a tmp dir;
MiniLM and the Whisper encoder from ``.models``, skipped when absent).

MiniLM is harder than rec: ``DynamicQuantizeLinear`` rounds activations to 8 bits, so an FP32-level
change upstream flips roundings. ONNX Runtime CPU's own ``SkipLayerNormFusion`` moves the quantized
MiniLM's output by rel L2 0.101 against the same graph run without optimizations (0.105 for
opset 14; the float model: 6e-7), measured 2026-11-28 with onnxruntime 1.32.0.
"""

from __future__ import annotations

import onnx
import pytest
import real_quantized
from real_quantized import QuantizedCase

import precision_doctor as pd

pytestmark = [pytest.mark.slow, pytest.mark.shared]
INT_TO_FLOAT_CASTS = "_output_quantized_cast"  # quantize_dynamic's name for the int32 -> float Cast


@pytest.fixture(scope="session")
def quantized_rec(tmp_path_factory: pytest.TempPathFactory) -> QuantizedCase:
    return real_quantized.quantized_rec(tmp_path_factory.mktemp("quantized"))


@pytest.fixture(scope="session")
def quantized_whisper(tmp_path_factory: pytest.TempPathFactory) -> QuantizedCase:
    return real_quantized.quantized_whisper(tmp_path_factory.mktemp("quantized"))


@pytest.fixture(scope="session")
def quantized_minilm(tmp_path_factory: pytest.TempPathFactory) -> QuantizedCase:
    return real_quantized.quantized_minilm(tmp_path_factory.mktemp("quantized"))


def _diagnose(case: QuantizedCase) -> pd.Diagnosis:
    return pd.diagnose(str(case.path), case.samples, target="fp16", noise=False, quiet=True)


def _assert_causes_named(d: pd.Diagnosis) -> None:
    assert d.verdict == "fail"  # FP16 turns the output to inf/NaN
    assert d.assessment is not None and d.assessment.kind != "unexplained", d.assessment
    assert d.explained_share is not None and d.explained_share >= 0.9, d.assessment
    # the float side of the quantized MatMuls is named: an int32 -> float Cast overflows
    assert any(f.op_type == "Cast" and INT_TO_FLOAT_CASTS in f.node and f.kind
               in ("activation-overflow", "overflow") for f in d.findings), \
        [(f.kind, f.node) for f in d.findings]


def _assert_fix_meets_default_tolerance(case: QuantizedCase, tmp_path) -> None:
    f = pd.fix(str(case.path), case.samples, target="fp16", quiet=True)
    assert f.passed, f.report.get("score_after")
    assert f.report["score_after"]["passed"]
    written = f.save(tmp_path / f"{case.name}_fp16.onnx")
    onnx.checker.check_model(str(written["model"]))


def test_quantized_rec_diagnose_names_the_int32_cast_overflow(quantized_rec):
    _assert_causes_named(_diagnose(quantized_rec))


def test_quantized_rec_fix_meets_the_default_tolerance(quantized_rec, tmp_path):
    _assert_fix_meets_default_tolerance(quantized_rec, tmp_path)


def test_quantized_minilm_diagnose_names_a_joint_cure(quantized_minilm):
    _assert_causes_named(_diagnose(quantized_minilm))


def test_quantized_minilm_fix_meets_the_default_tolerance(quantized_minilm, tmp_path):
    _assert_fix_meets_default_tolerance(quantized_minilm, tmp_path)


def test_quantized_whisper_diagnose_names_a_joint_cure(quantized_whisper):
    _assert_causes_named(_diagnose(quantized_whisper))


def test_quantized_whisper_fix_meets_the_default_tolerance(quantized_whisper, tmp_path):
    _assert_fix_meets_default_tolerance(quantized_whisper, tmp_path)
