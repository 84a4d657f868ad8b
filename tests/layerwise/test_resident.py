"""Layerwise statistics reduced where the tensors are (``layerwise.resident``): the ONNX
statistics graph and the I/O-bound segment runs give the numpy path's records."""

import inspect
import math

import numpy as np
import onnxruntime as ort
import pytest
from test_layerwise_segments import residual_model, residual_samples
from tiny_models import conv_bn, random_samples

from precision_doctor.formats import FORMATS, Precision
from precision_doctor.graph.outputs import TensorSite
from precision_doctor.layerwise.candidates import emulated, reference_factory
from precision_doctor.layerwise.compare import compare_layerwise
from precision_doctor.layerwise.resident import (
    FIELDS,
    STATS_TEMP_BYTES,
    ResidentStats,
    chunk_elements,
    stats_model,
)
from precision_doctor.layerwise.stats import _Accumulator
from precision_doctor.precision.plan import PrecisionPlan

COUNTS = ("numel", "nan", "inf", "ref_bad", "overflow", "flush", "subnormal", "lost")
SUMS = ("ref_max", "cand_max", "err_max", "err_sum", "err2", "ref2")


def _pair(rng, nonfinite):
    shape = (3, 40, 70)
    r = (rng.standard_normal(shape) * np.exp(rng.uniform(-22, 12, shape))).astype(np.float32)
    c = (r * (1 + 1e-3 * rng.standard_normal(shape))).astype(np.float32)
    c[rng.random(shape) < 0.01] = 0  # lost to zero
    r[0, 0, :5] = 0
    if nonfinite:
        r.flat[5], r.flat[11], c.flat[7], c.flat[9] = np.nan, -np.inf, np.inf, np.nan
    return r, c


@pytest.mark.parametrize("target", [Precision.FP16, Precision.BF16])
@pytest.mark.parametrize("nonfinite", [False, True])
def test_statistics_graph_matches_the_numpy_accumulator(target, nonfinite):
    fmt = FORMATS[target]
    session = ort.InferenceSession(stats_model(fmt).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    r, c = _pair(np.random.default_rng(7), nonfinite)
    host = _Accumulator(None)
    host.add(r, c, fmt.max, fmt.min_subnormal, fmt.min_normal)
    device = _Accumulator(None)
    whole = {"r": r, "c": c, "lo": np.array([0]), "hi": np.array([r.size])}
    assert FIELDS == tuple(inspect.signature(_Accumulator.fold).parameters)[2:]
    device.fold(r.size, *session.run(None, whole)[0].tolist())
    if target is Precision.FP16:  # every count is exercised
        assert host.overflow > 0 and host.flush > 0 and host.subnormal > 0 and host.lost > 0
    for field in COUNTS:
        assert getattr(device, field) == getattr(host, field), field
    for field in SUMS:
        assert math.isclose(getattr(device, field), getattr(host, field), rel_tol=1e-6), field


def _records(model, samples, resident, budget=1):
    plan = PrecisionPlan(Precision.FP16)
    return compare_layerwise(model, samples, reference_factory, emulated(plan).factory,
                             Precision.FP16, 1e-3, budget, resident=resident)


@pytest.mark.parametrize("case", ["residual", "conv_bn"])
def test_io_bound_segments_give_the_same_records(case):
    """Every node its own segment (budget 1 byte): boundaries, an int64 shape tensor and a
    residual travel as OrtValues between I/O-bound sessions."""
    if case == "residual":
        model, samples = residual_model(), residual_samples(3)
    else:
        model, samples = conv_bn(), [s.feeds for s in random_samples((1, 3, 8, 8), count=2)]
    host, bound = _records(model, samples, False), _records(model, samples, True)
    assert bound.mode == host.mode == "segments" and bound.chunks == host.chunks > 1
    assert [r.tensor for r in bound.records] == [r.tensor for r in host.records]
    for a, b in zip(host.records, bound.records):
        for field in ("numel", "cand_nan", "cand_inf", "ref_nonfinite", "overflow",
                      "flush_to_zero", "subnormal", "lost_to_zero"):
            assert getattr(a, field) == getattr(b, field), (a.tensor, field)
        for field in ("ref_max_abs", "cand_max_abs", "max_abs_err", "mean_abs_err", "rel_l2"):
            assert math.isclose(getattr(a, field), getattr(b, field), rel_tol=1e-5,
                                abs_tol=1e-12), (a.tensor, field)
    assert bound.first_divergence == host.first_divergence


def test_statistics_in_slices_fold_into_the_whole_tensors_statistics():
    """``ResidentStats`` reduces a tensor larger than its slice in several runs (here 3 runs of
    at most 3000 elements for 8400): the same counts and, up to summation order, sums."""
    fmt = FORMATS[Precision.FP16]
    r, c = _pair(np.random.default_rng(3), True)
    host = _Accumulator(None)
    host.add(r, c, fmt.max, fmt.min_subnormal, fmt.min_normal)
    pool = ResidentStats([TensorSite("t", "n", "Add", 0, r.size)], fmt)
    try:
        pool.chunk = 3000
        pool.add(["t"], {"t": ort.OrtValue.ortvalue_from_numpy(r)},
                 {"t": ort.OrtValue.ortvalue_from_numpy(c)})
        device = pool.accs["t"]
    finally:
        pool.close()
    assert device.numel == r.size
    for field in COUNTS:
        assert getattr(device, field) == getattr(host, field), field
    for field in SUMS:
        assert math.isclose(getattr(device, field), getattr(host, field), rel_tol=1e-6), field


def test_the_slice_keeps_the_graphs_intermediates_within_their_bound():
    """The bound counts every full-size intermediate (masks 1 byte, float32 4, float64 8 per
    element): tens of bytes per element, so a slice is millions of elements, not the tensor."""
    model = stats_model(FORMATS[Precision.FP16])
    chunk = chunk_elements(model)
    per_element = STATS_TEMP_BYTES / chunk
    assert 40 < per_element < 200
    assert chunk_elements(model, 1) == 1 << 16
