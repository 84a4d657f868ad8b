"""``Sample`` (one set of model feeds) and ``check_feeds``: validate feeds against model inputs.

Rules of ``check_feeds`` (what is an error and what is fixed silently):

- names must match the model's inputs exactly (``InputNameError`` lists both sides);
- rank and every fixed dim must match (``InputShapeError`` names input, dim index, expected and
  got); symbolic dims are resolved from the data, and a symbolic name used by several inputs
  (e.g. ``batch``) must get one value;
- dtype: a value-preserving cast is done (float64 -> float32, int -> float, int64 -> int32 when
  the values fit, float32 -> float16 when no finite value exceeds 65504, float16/bfloat16 ->
  float32 exactly: the FP32 upcast of a model shipped in FP16/BF16, ``graph.upcast``, takes
  FP32 where the shipped model took FP16/BF16 feeds); float -> int/bool, and int/float -> bool
  raise ``InputShapeError``;
- NaN/Inf are kept (real data may contain them and the report must show it; count them with
  ``nonfinite_count``) unless *every* value of a float input is NaN, which raises ``InputError``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from precision_doctor.errors import InputError, InputNameError, InputShapeError
from precision_doctor.runners.base import TensorMeta


@dataclass(frozen=True)
class Sample:
    """One set of feeds for one model run.

    Attributes:
        name: Where it came from: a file name, ``file.npz[3]`` (one batch entry of a split
            array), ``input.json[0]`` (a Polygraphy iteration) or ``random[2]``.
        feeds: Input name -> array, in model input order after ``check_feeds``.
        source_size: ``(height, width)`` in pixels of the decoded image before preprocessing,
            for image samples (None otherwise). Task metrics that map outputs back to the
            source image (``db-boxes``, ``coco-map-drop``) receive it.
        input_size: ``(height, width)`` of the image in the model input tensor after
            preprocessing (the padded canvas for ``resize=height`` and ``letterbox``), for
            image samples.
        input_box: ``(top, left, height, width)`` of the whole resized source image in the
            input tensor's pixels (``inputs.resize.ResizePlan.image_box``: a letterbox offset,
            a crop as a negative offset), for image samples; ``coco-map-drop`` maps boxes back
            to the source image with it.
    """

    name: str
    feeds: dict[str, np.ndarray]
    source_size: tuple[int, int] | None = None
    input_size: tuple[int, int] | None = None
    input_box: tuple[int, int, int, int] | None = None

    def describe(self) -> dict[str, object]:
        """JSON-ready summary: name and, per input, shape and dtype (no data)."""
        out: dict[str, object] = {
            "name": self.name,
            "feeds": {k: {"shape": list(v.shape), "dtype": str(v.dtype)}
                      for k, v in self.feeds.items()}}
        if self.source_size is not None:
            out["source_size"] = list(self.source_size)
        if self.input_size is not None:
            out["input_size"] = list(self.input_size)
        if self.input_box is not None:
            out["input_box"] = list(self.input_box)
        return out


def is_dynamic_dim(dim: object) -> bool:
    """True for a symbolic dim: a name, None, or a negative int (ORT/Polygraphy conventions)."""
    return not isinstance(dim, (int, np.integer)) or int(dim) < 0


def _shape_text(shape: Sequence[object]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _check_names(feeds: Mapping[str, np.ndarray], inputs: Sequence[TensorMeta]) -> None:
    expected = [m.name for m in inputs]
    missing = [n for n in expected if n not in feeds]
    extra = sorted(n for n in feeds if n not in expected)
    if not missing and not extra:
        return
    parts = []
    if missing:
        parts.append(f"missing input(s) {missing}")
    if extra:
        parts.append(f"unknown input(s) {extra}")
    raise InputNameError(
        f"{' and '.join(parts)}; the model expects exactly {expected} "
        f"(got {sorted(feeds)}). Rename the arrays (.npz keys / JSON names) to the model's "
        "input names.", missing=missing or None, extra=extra or None)


def _check_shape(meta: TensorMeta, arr: np.ndarray, symbols: dict[str, tuple[str, int]]) -> None:
    shape = tuple(meta.shape)
    if arr.ndim != len(shape):
        raise InputShapeError(
            f"input {meta.name!r} has rank {arr.ndim} (shape {list(arr.shape)}) but the model "
            f"expects rank {len(shape)} {_shape_text(shape)}", input=meta.name)
    for index, (dim, got) in enumerate(zip(shape, arr.shape, strict=True)):
        if not is_dynamic_dim(dim):
            if int(dim) != got:
                raise InputShapeError(
                    f"input {meta.name!r} dim {index}: the model expects {dim}, the data has "
                    f"{got} (data shape {list(arr.shape)}, model shape {_shape_text(shape)})",
                    input=meta.name, dim=index)
        elif isinstance(dim, str) and dim not in ("?", ""):
            seen = symbols.setdefault(dim, (meta.name, got))
            if seen[1] != got:
                raise InputShapeError(
                    f"symbolic dim {dim!r} is {seen[1]} in input {seen[0]!r} but {got} in input "
                    f"{meta.name!r} (dim {index}); inputs sharing a dim name must agree",
                    input=meta.name, dim=index)


def _is_float(dtype: np.dtype) -> bool:
    """numpy floats and ml_dtypes' (bfloat16, float8*), which numpy files under kind 'V'."""
    if dtype.kind == "f":
        return True
    try:
        ml_dtypes.finfo(dtype)
    except ValueError:
        return False
    return True


def _as_numpy_float(arr: np.ndarray) -> np.ndarray:
    """``arr`` itself for numpy floats; a float32 view-copy for ml_dtypes (NaN/Inf kept)."""
    return arr if arr.dtype.kind == "f" else arr.astype(np.float32)


def _fits(arr: np.ndarray, target: np.dtype) -> bool:
    if arr.size == 0:
        return True
    if target.kind in "iu":
        info = np.iinfo(target)
        return bool(arr.min() >= info.min and arr.max() <= info.max)
    values = arr.astype(np.float64)
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return True
    return bool(np.abs(finite).max() <= float(ml_dtypes.finfo(target).max))


def cast_input(meta: TensorMeta, arr: np.ndarray) -> np.ndarray:
    """Cast ``arr`` to the input's dtype when no value changes meaning.

    Args:
        meta: The model input.
        arr: The data.

    Returns:
        ``arr`` itself (C-contiguous) when the dtype already matches, otherwise a cast copy.

    Raises:
        InputShapeError: Float data for an integer/bool input, non-bool data for a bool input,
            or values out of the target type's range (e.g. > 65504 for float16).
    """
    target = np.dtype(meta.dtype)
    source = arr.dtype
    if source == target or target == np.dtype(object):
        return np.asarray(arr, order="C")  # a 0-d feed stays 0-d
    allowed = (
        (_is_float(target) and (_is_float(source) or source.kind in "iub"))
        or (target.kind in "iu" and source.kind in "iub")
    )
    if not allowed:
        raise InputShapeError(
            f"input {meta.name!r} is {target} but the data is {source}; casting {source} to "
            f"{target} could change values. Convert the data to {target} yourself.",
            input=meta.name)
    if source.kind != "b" and not _fits(arr, target):
        raise InputShapeError(
            f"input {meta.name!r} is {target} but the {source} data has values outside its "
            f"range (min {arr.min()}, max {arr.max()}); they would overflow when cast",
            input=meta.name)
    return np.asarray(arr.astype(target), order="C")


def check_feeds(feeds: Mapping[str, np.ndarray], inputs: Sequence[TensorMeta]
                ) -> dict[str, np.ndarray]:
    """Validate feeds against the model's inputs and cast them to the input dtypes.

    Args:
        feeds: Input name -> array (any shape; dynamic axes are resolved from the data).
        inputs: The model inputs (e.g. ``runner.input_metadata()``).

    Returns:
        Input name -> C-contiguous array with the model's dtype, in model input order.

    Raises:
        InputNameError: Missing or extra names (the message lists the expected names).
        InputShapeError: Wrong rank, a fixed dim mismatch, inconsistent symbolic dims, or a
            dtype that cannot be cast without changing values.
        InputError: A float input whose values are all NaN.
    """
    _check_names(feeds, inputs)
    symbols: dict[str, tuple[str, int]] = {}
    out: dict[str, np.ndarray] = {}
    for meta in inputs:
        arr = np.asarray(feeds[meta.name])
        _check_shape(meta, arr, symbols)
        arr = cast_input(meta, arr)
        if _is_float(arr.dtype) and arr.size and bool(np.isnan(_as_numpy_float(arr)).all()):
            raise InputError(f"input {meta.name!r}: every value is NaN; check how the data "
                             "was produced", input=meta.name)
        out[meta.name] = arr
    return out


def check_sample(name: str, feeds: Mapping[str, np.ndarray], inputs: Sequence[TensorMeta],
                 file: str | None = None, hint: str = "",
                 source_size: tuple[int, int] | None = None,
                 input_size: tuple[int, int] | None = None,
                 input_box: tuple[int, int, int, int] | None = None) -> Sample:
    """``check_feeds`` for one named sample; errors are re-raised prefixed with its name.

    Args:
        name: Sample name (file name, ``file[i]``).
        feeds: Input name -> array.
        inputs: Model inputs.
        file: Source file recorded in the error context.
        hint: Text appended to the error message (e.g. how to fix a preprocessing spec).
        source_size: ``(height, width)`` of the source image, for image samples.
        input_size: ``(height, width)`` of the image in the input tensor, for image samples.
        input_box: Where the resized image lies in the input tensor (see ``Sample``).

    Returns:
        The validated ``Sample``.

    Raises:
        InputError: As ``check_feeds`` (same subclass), message prefixed with ``name``.
    """
    try:
        return Sample(name, check_feeds(feeds, inputs), source_size, input_size, input_box)
    except InputError as exc:
        context = {**exc.context, "sample": name, "file": file}
        raise type(exc)(f"{name}: {exc.message}{hint}", **context) from exc


def nonfinite_count(feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Number of NaN/Inf values per input (0 for non-float inputs).

    Args:
        feeds: Input name -> array.

    Returns:
        Input name -> count of elements where ``np.isfinite`` is False.
    """
    counts = {}
    for name, arr in feeds.items():
        arr = np.asarray(arr)
        finite = np.isfinite(_as_numpy_float(arr)) if _is_float(arr.dtype) else None
        counts[name] = 0 if finite is None else int(arr.size - np.count_nonzero(finite))
    return counts
