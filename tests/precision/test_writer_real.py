"""The strongly typed writer on the real PP-OCRv4 models with real images (all-FP16 plans).

Measured on ONNX Runtime 1.31 CPU (relative L2 of the written model vs the CPU emulator of the
plan the writer implemented, ``report.effective_plan()``): det 2.8e-3, rec 2.5e-3, cls 1.4e-8.
The written model is slightly closer to FP32 than the emulator (det 2.0e-3 vs 3.3e-3, rec 2.7e-3
vs 3.2e-3) because ORT CPU runs ops without FP16 kernels in FP32 islands (its own Casts), so
tensors inside an island are not rounded to FP16 as an engine would.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from real_inputs import CASES, real_image

from precision_doctor.formats import Precision
from precision_doctor.graph.load import load_model
from precision_doctor.precision.emulate import emulate
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.precision.writer import write_mixed_precision

pytestmark = pytest.mark.shared

# Cast nodes expected: graph input + graph output, plus det's BatchNormalization (running
# variance 9.8e7 > 65504) kept FP32: one Cast in, one out.
EXPECTED_CASTS = {"det": 4, "rec": 2, "cls": 2}




def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0].astype(np.float64)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _cast_pairs(model: onnx.ModelProto) -> int:
    producers = {o: n for n in model.graph.node for o in n.output}
    return sum(1 for n in model.graph.node if n.op_type == "Cast" and n.input[0] in producers
               and producers[n.input[0]].op_type == "Cast")


@pytest.mark.parametrize("name", sorted(CASES))
def test_all_fp16_plan_on_real_model(shared_dir: Path, name: str):
    model = load_model(shared_dir / "models" / "ppocrv4" / f"{name}.onnx")
    out, report = write_mixed_precision(model, PrecisionPlan(Precision.FP16))
    assert report.ort_validated and report.opset_after == report.opset_before
    assert report.casts_inserted == EXPECTED_CASTS[name] and _cast_pairs(out) == 0
    assert list(out.metadata_props) == list(model.metadata_props)
    assert [v.name for v in out.graph.input] == [v.name for v in model.graph.input]
    assert [v.name for v in out.graph.output] == [v.name for v in model.graph.output]
    assert report.io_dtypes == {v.name: "float32" for v in [*model.graph.input,
                                                             *model.graph.output]}
    x = real_image(shared_dir, name)
    written = _run(out, x)
    emulated = _run(emulate(model, report.effective_plan())[0], x)
    assert np.isfinite(written).all()
    assert _rel(written, emulated) < 1e-2
    assert _rel(written, _run(model, x)) < 1e-2


def test_det_batchnorm_with_huge_variance_is_kept_fp32(shared_dir: Path):
    model = load_model(shared_dir / "models" / "ppocrv4" / "det.onnx")
    _, report = write_mixed_precision(model, PrecisionPlan(Precision.FP16))
    (kept,) = report.kept_fp32
    assert kept.op_type == "BatchNormalization" and kept.reason == "parameter-out-of-range"
    assert kept.max_abs is not None and kept.max_abs > 9e7 and kept.limit == 65504
    assert report.nodes_per_precision["fp32"] == 1


def test_rec_keeps_its_character_list(shared_dir: Path):
    model = load_model(shared_dir / "models" / "ppocrv4" / "rec.onnx")
    out, _ = write_mixed_precision(model, PrecisionPlan(Precision.FP16))
    characters = {p.key: p.value for p in out.metadata_props}["character"]
    assert characters == {p.key: p.value for p in model.metadata_props}["character"]
    assert len(characters.splitlines()) > 6000


def test_bf16_plan_raises_opset_to_22_on_real_model(shared_dir: Path):
    model = load_model(shared_dir / "models" / "ppocrv4" / "cls.onnx")
    out, report = write_mixed_precision(model, PrecisionPlan(Precision.BF16))
    assert (report.opset_before, report.opset_after) == (11, 22)  # Conv accepts bf16 from 22
    assert report.ir_version_after >= 10 and report.casts_inserted == 2
    assert not report.kept_fp32 and list(out.metadata_props) == list(model.metadata_props)
