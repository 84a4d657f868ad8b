"""The compiled statistics pass (``layerwise.fused``) gives the numpy path's records: counts
and maxima exactly, sums to float32 rounding, whatever NaN, Inf, huge, subnormal or zero
values the tensors hold."""

import importlib.util
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from precision_doctor.formats import FORMATS, Precision
from precision_doctor.graph.outputs import TensorSite
from precision_doctor.layerwise import fused
from precision_doctor.layerwise.stats import LayerRecord, _Accumulator

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                reason="numba is not installed")

SITE = TensorSite("t", "n", "Op", 0, None)
# values that each take a different branch of the statistics
SPECIAL = [0.0, -0.0, np.nan, np.inf, -np.inf, 3.4e38, -3.4e38, 1e20, 7e4, -7e4, 65504.0,
           6.2e-5, -3e-6, 5e-8, 2e-8, -1e-9, 1e-45, 1.0, -2.5]


def _numpy_record(pairs, fmt) -> LayerRecord:
    acc = _Accumulator(SITE)
    for r, c in pairs:
        acc.add(r, c, fmt.max, fmt.min_subnormal, fmt.min_normal)
    return acc.record(fmt.max)


def _assert_same(got: LayerRecord, want: LayerRecord) -> None:
    for field in ("mean_abs_err", "rel_l2"):
        a, b = getattr(got, field), getattr(want, field)
        assert a == pytest.approx(b, rel=1e-5, abs=1e-30) or (np.isnan(a) and np.isnan(b))
    assert replace(got, mean_abs_err=0.0, rel_l2=0.0) == replace(want, mean_abs_err=0.0,
                                                                rel_l2=0.0)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(1, 3 * fused.BLOCK + 7),
       special_share=st.sampled_from([0.0, 0.001, 0.01, 0.3, 0.9]),
       target=st.sampled_from([Precision.FP16, Precision.BF16, Precision.TF32]))
def test_compiled_statistics_equal_the_numpy_path(seed, size, special_share, target):
    rng = np.random.default_rng(seed)
    fmt = FORMATS[target]
    r = (rng.standard_normal(size) * 10.0 ** rng.integers(-9, 6)).astype(np.float32)
    c = (r * (1 + rng.standard_normal(size) * 1e-3)).astype(np.float32)
    for x in (r, c):
        hit = rng.random(size) < special_share
        x[hit] = rng.choice(np.array(SPECIAL, np.float32), int(hit.sum()))
    c[rng.random(size) < 0.05] = 0.0
    pairs = [(r, c), (c.copy(), r.copy())]
    want = _numpy_record(pairs, fmt)
    acc = _Accumulator(SITE)
    for a, b in pairs:
        acc.add(a, b, fmt.max, fmt.min_subnormal, fmt.min_normal, compiled=True)
    _assert_same(acc.record(fmt.max), want)


def test_blocks_with_nonfinite_values_take_the_numpy_path():
    """A NaN in one block and -3.4e38 (whose square overflows a float32 sum) in another: those
    two blocks are handed back, the rest is folded by the kernel, and the record is the numpy
    path's."""
    fmt = FORMATS[Precision.FP16]
    r = np.linspace(-3, 3, 5 * fused.BLOCK, dtype=np.float32)
    c = r * np.float32(1.001)
    c[fused.BLOCK + 5] = np.nan
    r[3 * fused.BLOCK + 1] = c[3 * fused.BLOCK + 1] = -3.4e38
    got = fused.fold(r, c, fmt.max, fmt.min_normal, fmt.min_subnormal / 2)
    assert got is not None
    assert got[3].tolist() == [fused.BLOCK, 3 * fused.BLOCK]
    assert got[2][0] == 3 * fused.BLOCK
    acc = _Accumulator(SITE)
    with np.errstate(over="raise"):
        acc.add(r, c, fmt.max, fmt.min_subnormal, fmt.min_normal, compiled=True)
    rec = acc.record(fmt.max)
    assert rec.cand_nan == 1 and rec.overflow == 1 and rec.numel == r.size
    _assert_same(rec, _numpy_record([(r, c)], fmt))


def test_the_kernel_loads_only_where_it_repays_its_load(monkeypatch):
    monkeypatch.setattr(fused, "_loaded", {})
    assert not fused.worth_loading(fused.MIN_PAIRS - 1)
    assert fused.worth_loading(fused.MIN_PAIRS)
    monkeypatch.setenv(fused.ENV, "numpy")
    assert not fused.worth_loading(fused.MIN_PAIRS)
    assert fused.kernel() is None
    one = np.ones(3, np.float32)
    assert fused.fold(one, one, 65504.0, 2.0 ** -14, 2.0 ** -25) is None


@pytest.mark.parametrize("compiled", [True, False])
def test_zeros_are_neither_flushed_nor_subnormal_when_half_a_subnormal_is_zero(compiled):
    """TF32's smallest subnormal is float32's: half of it rounds to 0 in float32, and the
    exact zeros of a ReLU must not count as subnormal (or as -1 flushed)."""
    fmt = FORMATS[Precision.TF32]
    r = np.zeros(3000, np.float32)
    r[::3] = 1.0
    r[1] = 1e-40  # a float32 subnormal
    acc = _Accumulator(SITE)
    acc.add(r, r.copy(), fmt.max, fmt.min_subnormal, fmt.min_normal, compiled=compiled)
    rec = acc.record(fmt.max)
    assert (rec.flush_to_zero, rec.subnormal, rec.lost_to_zero) == (0, 1, 0)


def test_a_comparison_with_the_kernel_gives_the_numpy_records(monkeypatch):
    """``compare_layerwise`` folds with the kernel where ``worth_loading`` says so: the same
    records as with the numpy path, sums to float32 rounding."""
    from test_layerwise_segments import residual_model, residual_samples

    from precision_doctor.layerwise.candidates import emulated, reference_factory
    from precision_doctor.layerwise.compare import compare_layerwise
    from precision_doctor.precision.plan import PrecisionPlan

    cand = emulated(PrecisionPlan(Precision.FP16))
    results = {}
    for min_pairs in (0, 1 << 62):
        monkeypatch.setattr(fused, "MIN_PAIRS", min_pairs)
        monkeypatch.setattr(fused, "_loaded", {} if min_pairs else dict(fused._loaded))
        results[min_pairs] = compare_layerwise(residual_model(), residual_samples(),
                                               reference_factory, cand.factory, Precision.FP16,
                                               1e-3, 1 << 30)
    compiled, numpy_only = results[0], results[1 << 62]
    assert len(compiled.records) == len(numpy_only.records) > 3
    for got, want in zip(compiled.records, numpy_only.records):
        _assert_same(got, want)


def test_a_kernel_that_fails_to_compile_leaves_the_numpy_path(monkeypatch):
    def broken():
        raise RuntimeError("LLVM ERROR: no target")

    monkeypatch.setattr(fused, "_loaded", {})
    monkeypatch.setattr(fused, "_compile", broken)
    with pytest.warns(RuntimeWarning, match="LLVM ERROR"):
        assert fused.kernel() is None
    one = np.ones(5, np.float32)
    assert fused.fold(one, one, 65504.0, 2.0 ** -14, 2.0 ** -25) is None
    acc = _Accumulator(SITE)
    acc.add(one, one * 2, 65504.0, 2.0 ** -24, 2.0 ** -14, compiled=True)
    assert acc.record(65504.0).max_abs_err == 1.0


def test_a_recorded_fp16_engine_is_compared_with_the_kernel_as_with_numpy(monkeypatch):
    """Recorded FP16 tensors are compared as float32 (exact), so the kernel folds them too."""
    from test_recorded import emulated_tensors
    from tiny_models import conv_bn, random_samples

    from precision_doctor.layerwise.candidates import reference_factory
    from precision_doctor.layerwise.recorded import compare_recorded

    model, samples = conv_bn(), random_samples((1, 3, 8, 8))
    iterations = emulated_tensors(model, samples)
    assert next(iter(iterations[0].values())).dtype == np.float16
    records = {}
    for min_pairs in (0, 1 << 62):
        monkeypatch.setattr(fused, "MIN_PAIRS", min_pairs)
        monkeypatch.setattr(fused, "_loaded", {} if min_pairs else dict(fused._loaded))
        records[min_pairs] = compare_recorded(model, [s.feeds for s in samples], iterations,
                                              reference_factory, None, Precision.FP16,
                                              1e-3).recorded.records
    assert len(records[0]) == 3
    for got, want in zip(records[0], records[1 << 62]):
        _assert_same(got, want)
