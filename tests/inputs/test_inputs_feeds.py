"""check_feeds: names, ranks, fixed/symbolic dims, dtype casts, NaN handling."""

from __future__ import annotations

import numpy as np
import pytest

from precision_doctor.errors import InputError, InputNameError, InputShapeError
from precision_doctor.inputs import check_feeds, nonfinite_count
from precision_doctor.runners.base import TensorMeta

F32 = np.dtype(np.float32)
IMAGE = TensorMeta("x", F32, ("batch", 3, "h", "w"))
MASK = TensorMeta("mask", np.dtype(np.int64), ("batch", 8))


def test_valid_feeds_are_returned_in_model_order_with_dynamic_dims_resolved() -> None:
    feeds = {"mask": np.ones((2, 8), np.int64), "x": np.zeros((2, 3, 17, 33), np.float32)}
    out = check_feeds(feeds, [IMAGE, MASK])
    assert list(out) == ["x", "mask"]
    assert out["x"].shape == (2, 3, 17, 33)


def test_missing_and_extra_names_list_the_expected_ones() -> None:
    with pytest.raises(InputNameError, match=r"missing input\(s\) \['mask'\]") as info:
        check_feeds({"x": np.zeros((1, 3, 4, 4), np.float32)}, [IMAGE, MASK])
    assert "['x', 'mask']" in str(info.value)
    with pytest.raises(InputNameError, match=r"unknown input\(s\) \['y'\]"):
        check_feeds({"x": np.zeros((1, 3, 4, 4), np.float32), "y": np.zeros(1)}, [IMAGE])


def test_wrong_rank_and_fixed_dim_name_input_and_dim() -> None:
    with pytest.raises(InputShapeError, match="'x' has rank 3"):
        check_feeds({"x": np.zeros((3, 4, 4), np.float32)}, [IMAGE])
    with pytest.raises(InputShapeError, match="'x' dim 1: the model expects 3, the data has 4"):
        check_feeds({"x": np.zeros((1, 4, 4, 4), np.float32)}, [IMAGE])


def test_shared_symbolic_dims_must_agree() -> None:
    feeds = {"x": np.zeros((2, 3, 4, 4), np.float32), "mask": np.zeros((3, 8), np.int64)}
    with pytest.raises(InputShapeError, match="symbolic dim 'batch'"):
        check_feeds(feeds, [IMAGE, MASK])


def test_negative_and_none_dims_are_dynamic() -> None:
    meta = TensorMeta("x", F32, (-1, 3, "?", "?"))
    assert check_feeds({"x": np.zeros((5, 3, 2, 2), np.float32)}, [meta])["x"].shape[0] == 5


def test_safe_casts() -> None:
    out = check_feeds({"x": np.zeros((1, 3, 2, 2), np.float64)}, [IMAGE])
    assert out["x"].dtype == np.float32
    out = check_feeds({"x": np.zeros((1, 3, 2, 2), np.uint8)}, [IMAGE])
    assert out["x"].dtype == np.float32
    meta32 = TensorMeta("ids", np.dtype(np.int32), (4,))
    assert check_feeds({"ids": np.arange(4)}, [meta32])["ids"].dtype == np.int32


def test_unsafe_casts_raise() -> None:
    with pytest.raises(InputShapeError, match="'mask' is int64 but the data is float32"):
        check_feeds({"mask": np.zeros((1, 8), np.float32)}, [MASK])
    meta32 = TensorMeta("ids", np.dtype(np.int32), (1,))
    with pytest.raises(InputShapeError, match="outside its range"):
        check_feeds({"ids": np.array([2**40])}, [meta32])
    half = TensorMeta("h", np.dtype(np.float16), (2,))
    with pytest.raises(InputShapeError, match="outside its range"):
        check_feeds({"h": np.array([1.0, 1e5], np.float32)}, [half])
    flag = TensorMeta("flag", np.dtype(bool), (1,))
    with pytest.raises(InputShapeError):
        check_feeds({"flag": np.array([1])}, [flag])


def test_nan_is_kept_and_counted_unless_everything_is_nan() -> None:
    data = np.zeros((1, 3, 2, 2), np.float32)
    data[0, 0, 0, 0] = np.nan
    data[0, 1, 0, 0] = np.inf
    out = check_feeds({"x": data}, [IMAGE])
    assert nonfinite_count(out) == {"x": 2}
    assert nonfinite_count({"ids": np.arange(3)}) == {"ids": 0}
    with pytest.raises(InputError, match="every value is NaN"):
        check_feeds({"x": np.full((1, 3, 2, 2), np.nan, np.float32)}, [IMAGE])


def test_bfloat16_inputs_are_floats() -> None:
    import ml_dtypes

    meta = TensorMeta("b", np.dtype(ml_dtypes.bfloat16), (3,))
    out = check_feeds({"b": np.array([1.0, np.nan, 2.0], np.float32)}, [meta])
    assert out["b"].dtype == np.dtype(ml_dtypes.bfloat16)
    assert nonfinite_count(out) == {"b": 1}


def test_real_cls_metadata_with_minus_one_dims(shared_dir) -> None:
    from precision_doctor.graph.load import input_metadata, load_model

    metas = input_metadata(load_model(shared_dir / "models/ppocrv4/cls.onnx"))
    feeds = check_feeds({"x": np.zeros((2, 3, 48, 192), np.float32)}, metas)
    assert feeds["x"].shape == (2, 3, 48, 192)


@pytest.mark.parametrize("data", [np.float32(0.5), np.float64(0.5)])
def test_a_scalar_input_stays_a_scalar(data):
    """A 0-d feed keeps its shape, cast or not (``np.ascontiguousarray`` would make it [1])."""
    from precision_doctor.inputs.feeds import cast_input

    out = cast_input(TensorMeta("t", F32, ()), np.asarray(data))
    assert out.shape == () and out.dtype == np.float32
