"""Load one side (A or B) of a forensics comparison: an image with its preprocessing, or a tensor.

Source text forms:

- ``photo.jpg`` (any of ``IMAGE_SUFFIXES``) + a preprocessing spec (``parse_preprocess``);
- ``x.npy``;
- ``feeds.npz`` or ``feeds.npz:KEY``: the array named KEY (default: the only array, else the
  one named like the model's single image input);
- ``inputs.json``, ``inputs.json@3``, ``inputs.json:KEY@3``: Polygraphy ``--save-inputs`` data,
  iteration 3 (default 0), input KEY (same default as .npz).

Reading reuses ``precision_doctor.inputs`` (the same decoders ``load_samples`` uses).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from precision_doctor.errors import DataFormatError, InputError, InputNameError
from precision_doctor.inputs import (
    IMAGE_SUFFIXES,
    PRESETS,
    PreprocessSpec,
    decode_image,
    image_to_tensor,
    parse_preprocess,
    read_npy,
    read_npz,
    read_polygraphy_inputs,
)

_SELECTOR = re.compile(r"^(?P<path>.+?\.(?:npz|json))(?::(?P<key>[^@]+))?(?:@(?P<it>\d+))?$",
                       re.IGNORECASE)


@dataclass(frozen=True)
class LoadedInput:
    """One side of the comparison.

    Attributes:
        array: The tensor exactly as the pipeline produced it (batch dim, layout, dtype kept).
        desc: Where it came from, e.g. ``crop.png with ppocr-rec`` or ``feeds.npz:x``.
        spec: The preprocessing applied (images only).
    """

    array: np.ndarray
    desc: str
    spec: PreprocessSpec | None = None


def parse_source(text: str | Path) -> tuple[Path, str | None, int | None]:
    """Split ``file.npz:KEY`` / ``file.json:KEY@N`` into (path, key, iteration).

    An existing file is taken as a plain path even when its name contains ``:`` or ``@``.
    """
    raw = str(text)
    if Path(raw).exists():
        return Path(raw), None, None
    match = _SELECTOR.match(raw)
    if match is None:
        return Path(raw), None, None
    iteration = match.group("it")
    return Path(match.group("path")), match.group("key"), None if iteration is None \
        else int(iteration)


def _pick(arrays: Mapping[str, np.ndarray], key: str | None, where: str,
          input_names: Sequence[str]) -> tuple[str, np.ndarray]:
    if key is not None:
        if key not in arrays:
            raise InputNameError(f"{where} has no array {key!r}; it holds {list(arrays)}",
                                 file=where)
        return key, arrays[key]
    if len(arrays) == 1:
        return next(iter(arrays.items()))
    named = [n for n in input_names if n in arrays]
    if len(named) == 1:
        return named[0], arrays[named[0]]
    raise InputNameError(
        f"{where} holds several arrays {list(arrays)}; name the one to compare as "
        f"{where}:KEY (e.g. {where}:{next(iter(arrays))})", file=where)


def _spec_text(preprocess: PreprocessSpec | str | Mapping[str, object]) -> str:
    if isinstance(preprocess, str):
        return preprocess.strip()
    return str(parse_preprocess(preprocess))


def load_side(source: str | Path | np.ndarray,
              preprocess: PreprocessSpec | str | Mapping[str, object] | None = None,
              input_names: Sequence[str] = (), label: str = "A") -> LoadedInput:
    """Read one side of the comparison.

    Args:
        source: An array, or a source text (see the module docstring).
        preprocess: Required for images (preset name, ``key=value`` text or a spec); must be
            None for tensors, which are compared exactly as stored.
        input_names: Model input names, used to choose among several arrays of a .npz/JSON.
        label: ``A`` or ``B``, for error messages.

    Returns:
        ``LoadedInput`` with the tensor and its description.

    Raises:
        InputError: An image without a preprocessing spec, a spec for a tensor, an unknown
            file type, or a missing file.
        InputNameError: The array to compare cannot be chosen, or the key does not exist.
        DataFormatError: The file does not decode, or the iteration does not exist.
    """
    if isinstance(source, np.ndarray):
        if preprocess is not None:
            raise InputError(f"{label}: preprocessing applies to images; this side is a tensor")
        return LoadedInput(source, "array")
    path, key, iteration = parse_source(source)
    suffix = path.suffix.lower()
    if not path.is_file():
        raise InputError(f"{label}: input file not found: {path}", file=str(path))
    if suffix in IMAGE_SUFFIXES:
        if preprocess is None:
            raise InputError(
                f"{label}: {path.name} is an image; give its preprocessing (--preprocess-"
                f"{label.lower()}): a preset ({', '.join(PRESETS)}) or key=value pairs such as "
                "size=224x224,scale=1/255,order=rgb,layout=nchw", file=str(path))
        spec = parse_preprocess(preprocess)
        tensor = image_to_tensor(decode_image(path, exif=spec.exif), spec, name=path.name)
        return LoadedInput(tensor, f"{path.name} with {_spec_text(preprocess)}", spec)
    if preprocess is not None:
        raise InputError(f"{label}: {path.name} holds a ready tensor; preprocessing applies to "
                         "images only. Drop the preprocessing option for this side.",
                         file=str(path))
    if suffix == ".npy":
        return LoadedInput(read_npy(path), path.name)
    if suffix == ".npz":
        name, arr = _pick(read_npz(path), key, path.name, input_names)
        return LoadedInput(arr, f"{path.name}:{name}")
    if suffix == ".json":
        iterations = read_polygraphy_inputs(path)
        index = 0 if iteration is None else iteration
        if not 0 <= index < len(iterations):
            raise DataFormatError(f"{label}: {path.name} has {len(iterations)} iteration(s); "
                                  f"@{index} does not exist", file=str(path))
        name, arr = _pick(iterations[index], key, f"{path.name}@{index}", input_names)
        return LoadedInput(arr, f"{path.name}:{name}@{index}")
    raise InputError(f"{label}: {path.name}: unsupported file type {suffix!r}; use an image "
                     f"({', '.join(IMAGE_SUFFIXES)}) with a preprocessing spec, .npy, .npz or "
                     "Polygraphy .json", file=str(path))
