"""Each named quantization mechanism is found on a tiny model built to have it, and named by
the narrower cure that removes its error (``quant.causes``)."""

from __future__ import annotations

import pytest
import quant_models

from precision_doctor.compare.tolerance import Tolerance
from precision_doctor.quant.diagnose import diagnose_quantized
from precision_doctor.quant.qformats import QUANT_FORMATS
from precision_doctor.search.objective import Objective

INT8 = QUANT_FORMATS["int8"]


def _diagnose(build, calibrator="max", tolerance=0.1):
    model, samples = build()
    return diagnose_quantized(model, samples, INT8,
                              Objective(tolerances={"*": Tolerance(tolerance)}), calibrator)


@pytest.mark.parametrize(("build", "calibrator", "tolerance", "kind", "unit", "cure"), [
    ("outlier_gemm", "max", 0.1, "outlier-channels", "proj", "per-channel"),
    ("clipped_spikes", "percentile", 0.1, "clipped-tail", "proj", "max-calibration"),
    ("depthwise_taps", "max", 0.1, "depthwise-weights", "dw", "float-weights"),
    ("flat_softmax", "max", 0.1, "wide-distribution", "pv", "fp16"),
])
def test_a_single_layer_mechanism_is_named_by_its_cure(build, calibrator, tolerance, kind, unit,
                                                       cure):
    result = _diagnose(getattr(quant_models, build), calibrator, tolerance)
    assert not result.passed
    assert [(c.kind, c.units, c.cure) for c in result.causes] == [(kind, (unit,), cure)]
    cause = result.causes[0]
    assert cause.removed >= 0.9  # the narrower cure removes the error, measured
    assert cause.error_after < cause.error_before
    assert result.explained_share >= 0.9
    layer = next(m for m in result.layers if m.unit == unit)
    assert layer.cure is not None and layer.cure >= 0.9  # FP16 cures it too
    assert layer.error_share is not None and layer.error_share >= 0.9


def test_the_measures_say_what_each_mechanism_looks_like():
    outlier = next(m for m in _diagnose(quant_models.outlier_gemm).layers if m.unit == "proj")
    assert outlier.channel_spread > 50  # one channel 100x the rest
    flat = next(m for m in _diagnose(quant_models.flat_softmax).layers if m.unit == "pv")
    assert flat.after == "Softmax" and flat.zeroed_share > 0.9
    dw = next(m for m in _diagnose(quant_models.depthwise_taps).layers if m.unit == "dw")
    assert dw.input_sqnr_db == float("inf")  # integer inputs at scale 1: exact
    assert dw.weight_sqnr_db is not None and dw.weight_sqnr_db < 60


def test_equal_small_noise_over_many_layers_is_accumulated_requantization():
    result = _diagnose(quant_models.deep_chain, tolerance=0.005)
    assert not result.passed
    (cause,) = result.causes
    assert cause.kind == "accumulated-requantization" and cause.cure == "joint-fp16"
    assert 4 <= len(cause.units) < 8 and cause.removed >= 0.3  # blocks carrying half of it
    tried = [m for m in result.layers if m.cure is not None]
    assert len(tried) == 6 and all(m.cure < 0.2 for m in tried)  # no single layer is it
    assert len(result.blocks) == 8  # one layer per block: each measured alone
    assert all(0.05 < b["share"] < 0.25 for b in result.blocks)  # about 1/8 each
    sqnr = [m.output_sqnr_db for m in result.layers]
    assert sqnr[-1] < sqnr[0] - 3  # the noise grows with depth


def test_a_model_within_tolerance_passes_with_no_causes_and_no_trials():
    result = _diagnose(quant_models.deep_chain, tolerance=0.2)
    assert result.passed and not result.causes
    assert all(m.cure is None for m in result.layers)
    data = result.to_dict()
    assert data["passed"] and data["verdict"].startswith("survives INT8")
    assert len(data["layers"]) == 8 and data["layers"][0]["unit"] == "layer0"
