"""Feeds from NumPy files: ``.npy`` (single-input models) and ``.npz`` (keys = input names).

Files are read with ``allow_pickle=False`` (a pickled object array is refused, never executed).
An array is one sample as stored, batch dim included; ``split_batch=True`` makes one sample per
entry of the leading dim (kept as a dim of size 1), e.g. a (16, 3, 224, 224) calibration array
becomes 16 samples named ``calib.npz[0]`` ... ``calib.npz[15]``.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from precision_doctor.errors import DataFormatError, InputNameError
from precision_doctor.inputs.feeds import Sample, check_sample
from precision_doctor.runners.base import TensorMeta

ARRAY_SUFFIXES = (".npy", ".npz")
# np.savez names positional arrays arr_0, arr_1, ... (numpy.savez documentation).
_POSITIONAL_KEY = "arr_0"


def read_npy(path: str | Path) -> np.ndarray:
    """Read one ``.npy`` array.

    Raises:
        DataFormatError: Missing, not a .npy file, truncated, or an object (pickle) array.
    """
    p = Path(path)
    try:
        arr = np.load(p, allow_pickle=False)
    except FileNotFoundError as exc:
        raise DataFormatError(f"array file not found: {p}", file=str(p)) from exc
    except (ValueError, OSError, EOFError) as exc:
        raise DataFormatError(
            f"{p}: not a readable .npy array ({exc}). Save it with numpy.save "
            "(object/pickled arrays are refused).", file=str(p)) from exc
    if not isinstance(arr, np.ndarray):
        raise DataFormatError(f"{p}: holds several arrays; name it .npz", file=str(p))
    return arr


def read_npz(path: str | Path) -> dict[str, np.ndarray]:
    """Read every array of an ``.npz`` archive, keys in file order.

    Raises:
        DataFormatError: Missing, not a zip/npz, truncated, or holds object (pickle) arrays.
    """
    p = Path(path)
    try:
        with np.load(p, allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    except FileNotFoundError as exc:
        raise DataFormatError(f"array file not found: {p}", file=str(p)) from exc
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise DataFormatError(
            f"{p}: not a readable .npz archive ({exc}). Save it with numpy.savez(path, "
            "**{input_name: array}) (object/pickled arrays are refused).", file=str(p)) from exc
    except AttributeError as exc:  # np.load returned a single array: a .npy named .npz
        raise DataFormatError(f"{p}: holds a single .npy array; name it .npy",
                              file=str(p)) from exc


def _single_input(inputs: Sequence[TensorMeta], source: str) -> TensorMeta:
    if len(inputs) != 1:
        raise InputNameError(
            f"{source}: a .npy file holds one array but the model has inputs "
            f"{[m.name for m in inputs]}; save a .npz with one key per input name instead",
            file=source)
    return inputs[0]


def _name_arrays(arrays: Mapping[str, np.ndarray], inputs: Sequence[TensorMeta]
                 ) -> dict[str, np.ndarray]:
    # A single positional array (np.savez(path, x)) feeds a single-input model.
    if len(inputs) == 1 and list(arrays) == [_POSITIONAL_KEY] and inputs[0].name not in arrays:
        return {inputs[0].name: arrays[_POSITIONAL_KEY]}
    return dict(arrays)


def split_along_batch(feeds: Mapping[str, np.ndarray], name: str) -> list[Sample]:
    """One sample per entry of the leading dim of every array (all must agree).

    Args:
        feeds: Input name -> array with a leading batch dim.
        name: Base sample name; samples are ``name[i]``.

    Returns:
        Samples whose arrays keep a leading dim of size 1.

    Raises:
        DataFormatError: A scalar array, or arrays with different leading dims.
    """
    sizes = {k: (v.shape[0] if v.ndim else None) for k, v in feeds.items()}
    if None in sizes.values() or len(set(sizes.values())) > 1:
        raise DataFormatError(
            f"{name}: cannot split along the batch dim: leading dims are {sizes}; every array "
            "needs the same leading (batch) dim", file=name)
    count = next(iter(sizes.values()), 0) or 0
    return [Sample(name=f"{name}[{i}]", feeds={k: v[i:i + 1] for k, v in feeds.items()})
            for i in range(count)]


def load_array_file(path: str | Path, inputs: Sequence[TensorMeta], split_batch: bool = False
                    ) -> list[Sample]:
    """Samples from one ``.npy`` or ``.npz`` file, checked against the model inputs.

    Args:
        path: ``.npy`` (single-input models) or ``.npz`` (keys = input names).
        inputs: Model inputs.
        split_batch: One sample per leading-dim entry instead of one per file.

    Returns:
        Validated samples (``check_feeds``): ``file`` or ``file[i]`` when split.

    Raises:
        DataFormatError: Unreadable file, or arrays that cannot be split.
        InputNameError: Names do not match the model's inputs.
        InputShapeError: Rank/shape/dtype mismatch.
    """
    p = Path(path)
    if p.suffix.lower() == ".npy":
        feeds = {_single_input(inputs, p.name).name: read_npy(p)}
    elif p.suffix.lower() == ".npz":
        feeds = _name_arrays(read_npz(p), inputs)
    else:
        raise DataFormatError(f"{p}: expected a .npy or .npz file", file=str(p))
    samples = split_along_batch(feeds, p.name) if split_batch else [Sample(p.name, feeds)]
    return [check_sample(s.name, s.feeds, inputs, file=str(p)) for s in samples]
