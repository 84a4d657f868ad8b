"""The per-engine table of how an out-of-range FP32 constant becomes FP16/BF16."""

from __future__ import annotations

import numpy as np
import pytest

from precision_doctor.formats import Precision
from precision_doctor.precision.constants import (
    ASSUMED,
    CONVERSIONS,
    clamping_engines,
    conversion_of,
    engines_on,
)

FLT_MIN = float(np.finfo(np.float32).min)


def test_every_row_has_a_source_and_a_rule():
    assert set(CONVERSIONS) == {"strongly-typed", "tensorrt", "onnxconverter-common", "ort-cuda"}
    for row in CONVERSIONS.values():
        assert row.source and row.rule in ("cast", "clamp", "as-written")
    assert ASSUMED == "strongly-typed"
    assert "float16.py" in CONVERSIONS["onnxconverter-common"].source
    assert "NVIDIA/TensorRT" in CONVERSIONS["tensorrt"].source


def test_conversions_of_minus_flt_max():
    x = np.array([FLT_MIN, -1.0, np.inf], np.float32)
    assert list(conversion_of(None).convert(x, Precision.FP16)) == [-np.inf, -1.0, np.inf]
    assert list(conversion_of("tensorrt").convert(x, Precision.FP16)) == [-65504.0, -1.0, np.inf]
    assert list(conversion_of("onnxconverter-common").convert(x, Precision.FP16)) == \
        [-10000.0, -1.0, np.inf]
    assert conversion_of("ort_cuda").rule == "as-written"
    assert conversion_of("strongly-typed").convert(x, Precision.BF16)[0] == -np.inf
    with pytest.raises(ValueError, match="fp16 only"):
        conversion_of("onnxconverter-common").convert(x, Precision.BF16)
    with pytest.raises(KeyError, match="known: strongly-typed"):
        conversion_of("openvino")


def test_in_words():
    words = engines_on(FLT_MIN, Precision.FP16)
    assert words["tensorrt"] == "TensorRT: clamped to -65504 with a warning"
    assert words["strongly-typed"] == "strongly typed Cast: becomes -inf"
    assert words["onnxconverter-common"] == "onnxconverter-common: clamped to -10000 with a warning"
    assert "as written" in words["ort-cuda"]
    assert clamping_engines(Precision.FP16) == ("tensorrt", "onnxconverter-common")
    assert clamping_engines(Precision.BF16) == ()
