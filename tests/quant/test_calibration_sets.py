"""Calibration apart from evaluation: ``calibration=`` calibrates only, one set is split (seeded,
disjoint), the reports count both."""

from __future__ import annotations

import numpy as np
import quant_models

import precision_doctor as pd


def _feeds(scale: float, n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": (rng.uniform(-1, 1, (1, 64, 32)) * scale).astype(np.float32)}
            for _ in range(n)]


def _amax(report: dict) -> float:
    return report["calibration"]["tensors"]["x"]["amax"]


def test_calibration_given_apart_calibrates_only_and_the_report_counts_both():
    model, _ = quant_models.deep_chain(layers=2)
    wide, narrow = _feeds(4.0, 3, 0), _feeds(1.0, 5, 1)
    d = pd.diagnose_quantized(model, narrow, target="int8", calibration=wide, quiet=True)
    top = max(float(np.abs(f["x"]).max()) for f in wide)
    assert abs(_amax(d.to_dict()) - top) < 1e-6 * top  # max: the calibration set's range
    cal = d.to_dict()["calibration"]
    assert cal["samples"] == 3 and cal["disjoint"] and cal["source"] == "samples in memory"
    assert d.to_dict()["evaluation"] == {"samples": 5}
    swapped = pd.diagnose_quantized(model, wide, target="int8", calibration=narrow,
                                    quiet=True)
    assert _amax(swapped.to_dict()) < top / 2  # calibrated on the narrow set now
    # an iterator streams: every sample used, read once
    streamed = pd.diagnose_quantized(model, narrow, target="int8", calibration=iter(wide),
                                     quiet=True)
    assert _amax(streamed.to_dict()) == _amax(d.to_dict())
    assert streamed.to_dict()["calibration"]["samples"] == 3


def test_one_set_is_split_into_disjoint_halves_and_one_sample_is_reused():
    model, _ = quant_models.deep_chain(layers=2)
    d = pd.diagnose_quantized(model, _feeds(1.0, 7, 2), target="int8", quiet=True).to_dict()
    assert d["calibration"]["samples"] == 4 and d["evaluation"]["samples"] == 3
    assert d["calibration"]["disjoint"] and d["calibration"]["source"] == \
        "split of --data, seed 0"
    one = pd.diagnose_quantized(model, _feeds(1.0, 1, 2), target="int8", quiet=True).to_dict()
    assert one["calibration"]["samples"] == one["evaluation"]["samples"] == 1
    assert not one["calibration"]["disjoint"] and "nothing to split" in \
        one["calibration"]["source"]
