"""INT8 and FP8 on a real model: PP-OCRv4 cls on real text crops (../shared)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image

from precision_doctor.api.options import as_model, as_samples
from precision_doctor.quant.diagnose import diagnose_quantized
from precision_doctor.quant.qformats import QUANT_FORMATS


@pytest.fixture(scope="module")
def cls_and_crops(shared_root):
    proto, _ = as_model(shared_root / "models" / "ppocrv4" / "cls.onnx")
    arrays = []
    for f in sorted((shared_root / "data" / "ocr" / "rec_crops" / "paddleocr").glob("*"))[:3]:
        rgb = np.asarray(Image.open(f).convert("RGB").resize((192, 48), Image.BILINEAR),
                         np.float32)
        arrays.append(((rgb / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)[None].astype(np.float32))
    return proto, as_samples([{proto.graph.input[0].name: a} for a in arrays], proto)


@pytest.mark.parametrize("target", ["int8", "fp8"])
def test_cls_survives_int8_and_fp8_with_every_layer_measured(cls_and_crops, target):
    proto, samples = cls_and_crops
    result = diagnose_quantized(proto, samples, QUANT_FORMATS[target])
    assert result.passed and not result.causes  # rel L2 ~1e-4 of the 2-class softmax
    layers = [m for m in result.layers if m.quantized]
    ops = {m.op_type for m in layers}
    assert len(layers) == 65 and ops == {"Conv", "GlobalAveragePool", "MaxPool", "MatMul"}
    assert all(math.isfinite(m.input_sqnr_db) and m.input_sqnr_db > 15 for m in layers)
    assert all(m.output_sqnr_db > 10 for m in layers)  # the error stays small inside too
    depthwise = [m for m in layers if m.depthwise]
    assert depthwise and all(m.weight_sqnr_db is not None for m in depthwise)
    data = result.to_dict()
    assert data["calibration"]["method"] == "max" and data["calibration"]["samples"] == 3
