"""quant.qformats: Q/DQ bit-identical to onnx.reference and ONNX Runtime CPU (opset 21)."""

import functools
import math
import warnings

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from precision_doctor.quant.qformats import (
    QUANT_FORMATS,
    QuantFormat,
    clipped_share,
    dequantize,
    fake_quant,
    parse_quant_target,
    quantize,
    sqnr_db,
)

FORMATS = list(QUANT_FORMATS.values())


@functools.cache
def _qdq(fmt_name: str, scale_size: int, axis: int) -> tuple[ReferenceEvaluator,
                                                            ort.InferenceSession]:
    """x -> QuantizeLinear -> DequantizeLinear with a zero point of the format's type (0)."""
    fmt = QUANT_FORMATS[fmt_name]
    scale_dims = [scale_size] if scale_size else []
    zp = helper.make_tensor("zp", fmt.onnx_type, scale_dims, [0] * max(scale_size, 1))
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], axis=axis),
             helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], axis=axis)]
    graph = helper.make_graph(
        nodes, "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b"]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, scale_dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"]),
         helper.make_tensor_value_info("q", fmt.onnx_type, ["a", "b"])],
        initializer=[zp])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return ReferenceEvaluator(model), session


def _assert_same_bits(ours: np.ndarray, theirs: np.ndarray) -> None:
    """Equal float32 bit patterns (signed zeros included); any NaN matches any NaN."""
    a, b = np.asarray(ours, np.float32), np.asarray(theirs, np.float32)
    assert a.shape == b.shape
    nan = np.isnan(a)
    np.testing.assert_array_equal(nan, np.isnan(b))
    np.testing.assert_array_equal(a.view(np.uint32)[~nan], b.view(np.uint32)[~nan])


def _midpoints(fmt: QuantFormat) -> np.ndarray:
    """Values exactly half-way between neighbouring levels of ``fmt`` (in units of the scale)."""
    if not fmt.is_float:
        return np.arange(-130, 130) + 0.5
    grid = np.arange(256, dtype=np.uint8).view(fmt.dtype).astype(np.float64)
    grid = np.unique(grid[np.isfinite(grid)])
    return (grid[:-1] + grid[1:]) / 2


@st.composite
def _cases(draw: st.DrawFn) -> tuple[QuantFormat, np.ndarray, np.ndarray, int]:
    fmt = draw(st.sampled_from(FORMATS))
    shape = (draw(st.integers(1, 4)), draw(st.integers(1, 6)))
    axis = draw(st.sampled_from([0, 1, -1]))
    per_channel = draw(st.booleans())
    n_scales = shape[axis] if per_channel else 1
    powers = st.integers(-24, 12).map(lambda e: float(2.0 ** e))  # exact ties stay exact
    plain = st.floats(2.0 ** -20, 1e4, width=32)
    scale = np.array(draw(st.lists(st.one_of(powers, plain), min_size=n_scales,
                                   max_size=n_scales)), np.float32)
    # In units of the scale: any float32 (huge, tiny, subnormal, inf, nan), exact half-way
    # values of the format, and values just beyond its largest level.
    units = st.one_of(
        st.floats(width=32),
        st.sampled_from(_midpoints(fmt).tolist()),
        st.floats(-1.2, 1.2).map(lambda f: f * fmt.qmax),
        st.sampled_from([fmt.qmax + 0.5, -fmt.qmax - 0.5, 2 ** 31, -(2 ** 31) - 1.0]))
    u = draw(hnp.arrays(np.float64, shape, elements=units))
    s_b = scale.reshape([-1 if d == axis % 2 else 1 for d in range(2)]) if per_channel else scale
    with np.errstate(over="ignore", invalid="ignore"):
        x = (u * s_b).astype(np.float32)
    return fmt, x, (scale if per_channel else scale.reshape(())), axis


@settings(max_examples=200, deadline=None)
@given(_cases())
def test_qdq_bit_identical_to_onnx_reference_and_ort(case):
    fmt, x, scale, axis = case
    reference, session = _qdq(fmt.name, scale.size if scale.ndim else 0, axis)
    q = quantize(x, scale, fmt, axis=axis)
    y = fake_quant(x, scale, fmt, axis=axis)
    assert q.dtype == fmt.dtype and y.dtype == np.float32 and y.shape == x.shape
    _assert_same_bits(dequantize(q, scale, fmt, axis=axis), y)

    with warnings.catch_warnings():  # the reference casts huge int8 values to int32
        warnings.simplefilter("ignore", RuntimeWarning)
        y_ref, q_ref = reference.run(None, {"x": x, "s": scale})
    # onnx.reference (1.23) does np.rint(x / s).astype(np.int32) before clipping to int8, so
    # x / s >= 2**31 (and +inf) wraps to INT32_MIN and gives -128; ORT and the spec saturate
    # to 127. Compare there with ORT only.
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = x / (scale if scale.ndim == 0
                     else scale.reshape([-1 if d == axis % 2 else 1 for d in range(2)]))
    keep = ~(ratio >= 2.0 ** 31) if not fmt.is_float else np.ones(x.shape, bool)
    _assert_same_bits(y[keep], y_ref[keep])
    _assert_same_bits(q[keep].astype(np.float32), q_ref[keep].astype(np.float32))
    if not fmt.is_float:
        assert np.all(q[~keep] == 127)

    y_ort = session.run(["y"], {"x": x, "s": scale})[0]
    _assert_same_bits(y, y_ort)
    if fmt.name != "fp8e5m2":  # ORT's Python API cannot return an E5M2 tensor at all
        q_ort = session.run(["q"], {"x": x, "s": scale})[0]
        if fmt.is_float:  # returned as uint8 bit patterns
            q_ort = q_ort.view(fmt.dtype)
        _assert_same_bits(q.astype(np.float32), q_ort.astype(np.float32))


def test_rounding_and_saturation():
    int8, e4m3, e5m2 = QUANT_FORMATS["int8"], QUANT_FORMATS["fp8"], QUANT_FORMATS["fp8e5m2"]
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 127.5, -128.5, 1e30, -np.inf, np.nan], np.float32)
    assert quantize(x, 1.0, int8).tolist() == [0, 2, 2, 0, -2, 127, -128, 127, -128, -128]
    y = fake_quant(np.array([17.0, 19.0, 460.0, 1e6, -np.inf, np.nan], np.float32), 1.0, e4m3)
    np.testing.assert_array_equal(y[:5], [16.0, 20.0, 448.0, 448.0, -448.0])  # ties to even
    assert np.isnan(y[5])
    assert fake_quant(np.float32(1e9), 1.0, e5m2) == 57344.0
    # One float32 division, not a multiplication by 1 / scale: 1.55 / 0.1 = 15.499999 -> 15
    # where 1.55 * (1 / 0.1) = 15.5 -> 16.
    assert quantize(np.float32(1.55), np.float32(0.1), int8) == 15


def test_format_limits_and_scale_for():
    assert [f.qmax for f in FORMATS] == [127.0, 448.0, 57344.0]
    assert [f.dtype for f in FORMATS] == [np.dtype(np.int8), np.dtype(ml_dtypes.float8_e4m3fn),
                                         np.dtype(ml_dtypes.float8_e5m2)]
    int8 = QUANT_FORMATS["int8"]
    assert int8.scale_for(254.0) == np.float32(2.0)
    assert isinstance(int8.scale_for(1.0), np.float32)
    safe = np.float32(1 / 127)
    np.testing.assert_array_equal(int8.scale_for(np.array([0.0, np.inf, np.nan, 127.0])),
                                  [safe, safe, safe, 1.0])
    assert int8.scale_for(1e-44) == np.finfo(np.float32).tiny
    assert np.all(fake_quant(np.zeros(3, np.float32), int8.scale_for(0.0), int8) == 0)
    with pytest.raises(ValueError, match="amax must be >= 0"):
        int8.scale_for(-1.0)


def test_parse_quant_target():
    for name in ("fp8", "FP8", "fp8e4m3", "E4M3", "float8e4m3fn", "fp8_e4m3fn", "fp8-e4m3"):
        assert parse_quant_target(name) is QUANT_FORMATS["fp8"]
    for name in ("fp8e5m2", "E5M2", "float8_e5m2"):
        assert parse_quant_target(name) is QUANT_FORMATS["fp8e5m2"]
    assert parse_quant_target(" INT8 ") is QUANT_FORMATS["int8"]
    for name in ("fp16", "bf16", "fp32", "int4", ""):
        assert parse_quant_target(name) is None


def test_scale_shape_errors():
    int8 = QUANT_FORMATS["int8"]
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="needs `axis`"):
        quantize(x, np.ones(3, np.float32), int8)
    with pytest.raises(ValueError, match="axis 0 of the tensor has 2"):
        quantize(x, np.ones(3, np.float32), int8, axis=0)
    with pytest.raises(ValueError, match="out of range"):
        quantize(x, np.ones(3, np.float32), int8, axis=2)
    with pytest.raises(ValueError, match="blocked"):
        quantize(x, np.ones((2, 3), np.float32), int8, axis=0)
    with pytest.raises(ValueError, match="view uint8"):
        dequantize(np.zeros(3, np.uint8), 1.0, QUANT_FORMATS["fp8"])
    assert np.all(quantize(x, np.array([0.5], np.float32), int8) == 2)  # 1 value: per tensor


def test_sqnr_db():
    ref = np.array([1.0, -2.0, 3.0], np.float32)
    assert sqnr_db(ref, ref) == math.inf
    assert sqnr_db(np.zeros(3), np.zeros(3)) == math.inf
    assert sqnr_db(ref, ref + 0.1) == pytest.approx(10 * math.log10(14 / 0.03))
    assert sqnr_db(ref, np.array([1.0, np.nan, 3.0])) == -math.inf
    assert sqnr_db(np.zeros(3), ref) == -math.inf
    assert math.isnan(sqnr_db(np.array([np.inf, 1.0]), np.array([np.inf, 1.0])))
    assert math.isnan(sqnr_db(np.zeros(0), np.zeros(0)))
    with pytest.raises(ValueError, match="equal shapes"):
        sqnr_db(ref, ref[:2])


def test_clipped_share():
    x = np.array([0.5, -2.0, 3.0, np.inf, np.nan], np.float32)
    assert clipped_share(x, 1.0) == pytest.approx(3 / 5)
    assert clipped_share(x, 3.0) == pytest.approx(1 / 5)
    assert clipped_share(np.zeros(0), 1.0) == 0.0
