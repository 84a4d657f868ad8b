"""A real transformer (all-MiniLM-L6-v2, BERT) in FP16: passes, with its FP16 hazards named.

Needs ``.models/minilm_op17.onnx`` and ``.models/minilm_inputs.npz`` (git-ignored), written by
``python3 benchmarks/export_minilm.py``; skips when they are absent (e.g. in CI).
"""

from pathlib import Path

import pytest

from precision_doctor.diagnosis.diagnose import diagnose
from precision_doctor.formats import Precision
from precision_doctor.graph import input_metadata, load_model
from precision_doctor.inputs import load_samples
from precision_doctor.layerwise.candidates import emulated
from precision_doctor.precision.plan import PrecisionPlan

MODELS = Path(__file__).resolve().parents[2] / ".models"
pytestmark = pytest.mark.slow


def test_minilm_op17_passes_fp16_and_names_mask_and_epsilon_hazards():
    path, data = MODELS / "minilm_op17.onnx", MODELS / "minilm_inputs.npz"
    if not (path.is_file() and data.is_file()):
        pytest.skip("run benchmarks/export_minilm.py to write .models/minilm_op17.onnx")
    model = load_model(path)
    samples = load_samples(data, input_metadata(model))
    report = diagnose(model, samples, Precision.FP16, emulated(PrecisionPlan(Precision.FP16)),
                      noise=False, layerwise=False)
    assert report.verdict == "pass"
    out = report.outputs[0]
    assert out.name == "last_hidden_state" and out.metrics.rel_l2 < 5e-3
    kinds = {(f.kind, f.op_type) for f in report.findings}
    # the attention-mask fill value finfo(float32).min becomes -inf in FP16 (benign before Softmax)
    assert ("parameter-out-of-range", "Where") in kinds
    # LayerNorm epsilon 1e-12 is 0 in FP16
    assert ("underflow", "LayerNormalization") in kinds
