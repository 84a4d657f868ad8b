"""``load_samples``: one entry point that turns a data source into validated model feeds.

Source kinds, decided from the text and the file system:

- ``random`` / ``random:...`` -> seeded random data (``synthetic.parse_random``);
- an image file, a folder of images, or a glob (``imgs/*.png``) -> one sample per image
  (a ``preprocess`` spec is required: preprocessing is never guessed);
- a ``.npy`` / ``.npz`` file, or a folder of them -> arrays (``arrays.load_array_file``);
- a ``.json`` file or a folder of them -> Polygraphy ``--save-inputs`` data;
- ``trtexec:x:in0.bin[;x:in1.bin]`` -> the raw files given to ``trtexec --loadInputs``
  (``inputs.trtexec``).

Folders are read non-recursively; files are taken in sorted name order; hidden files and
files of other types (README, labels) are ignored; a folder that mixes kinds is refused.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path

from precision_doctor.errors import DataFormatError, InputError
from precision_doctor.inputs.arrays import ARRAY_SUFFIXES, load_array_file
from precision_doctor.inputs.feeds import Sample
from precision_doctor.inputs.images import IMAGE_SUFFIXES, load_images
from precision_doctor.inputs.polygraphy import load_polygraphy_inputs
from precision_doctor.inputs.preprocess import PRESETS, PreprocessSpec, parse_preprocess
from precision_doctor.inputs.subsets import LazySamples
from precision_doctor.inputs.synthetic import is_random_source, random_samples
from precision_doctor.inputs.trtexec import PREFIX as TRTEXEC_PREFIX
from precision_doctor.inputs.trtexec import load_trtexec_inputs
from precision_doctor.runners.base import TensorMeta

_GLOB_CHARS = set("*?[")


def _kind(path: Path) -> str | None:
    suffix = path.suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        return "image"
    if suffix in ARRAY_SUFFIXES:
        return "array"
    if suffix == ".json":
        return "json"
    return None


def _list_files(source: str | os.PathLike[str]) -> tuple[list[Path], str]:
    """Files of one kind the source names, sorted by name, and that kind."""
    text = os.fspath(source)
    path = Path(text)
    if path.is_file():
        kind = _kind(path)
        if kind is None:
            raise DataFormatError(
                f"{path}: unsupported file type {path.suffix!r}; use images "
                f"({', '.join(IMAGE_SUFFIXES)}), .npy/.npz, or Polygraphy .json", file=text)
        return [path], kind
    if path.is_dir():
        files = [p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")]
        where = f"folder {path}"
    elif _GLOB_CHARS & set(text):
        files = [Path(p) for p in glob.glob(text) if Path(p).is_file()]
        where = f"pattern {text!r}"
    else:
        raise InputError(f"input data not found: {text} (expected a file, folder, glob, or "
                         "random:...)", file=text)
    by_kind: dict[str, list[Path]] = {}
    for f in files:
        kind = _kind(f)
        if kind is not None:
            by_kind.setdefault(kind, []).append(f)
    if not by_kind:
        raise DataFormatError(
            f"{where} has no images ({', '.join(IMAGE_SUFFIXES)}), .npy/.npz or .json files",
            file=text)
    if len(by_kind) > 1:
        counts = ", ".join(f"{len(v)} {k}" for k, v in sorted(by_kind.items()))
        raise DataFormatError(f"{where} mixes data kinds ({counts}); keep one kind per folder",
                              file=text)
    kind, paths = next(iter(by_kind.items()))
    return sorted(paths, key=lambda p: p.name), kind


def load_samples(source: str | os.PathLike[str], inputs: Sequence[TensorMeta],
                 preprocess: PreprocessSpec | str | None = None,
                 max_samples: int | None = None, *, split_batch: bool = False,
                 skip_bad: bool = False) -> list[Sample]:
    """Load validated feeds from a data source (see the module docstring for source kinds).

    Args:
        source: Path, folder, glob, or ``random:...`` spec.
        inputs: Model inputs (``runner.input_metadata()``); feeds are checked and cast to them.
        preprocess: Required for images (a ``PreprocessSpec``, preset name or ``key=value``
            text); must be None for other sources.
        max_samples: Keep at most this many samples (the first in sorted order).
        split_batch: Arrays (.npy/.npz): one sample per leading-dim entry.
        skip_bad: Images: skip files that do not decode, warning with ``SkippedImageWarning``.

    Returns:
        Samples in a deterministic order, feeds in model input order with the model's dtypes.

    Raises:
        InputError: Source not found, preprocessing missing for images or given for arrays.
        DataFormatError: A file does not decode, unsupported or mixed file types.
        InputNameError / InputShapeError: The data does not fit the model's inputs.
    """
    if max_samples is not None and max_samples < 1:
        raise InputError(f"max_samples must be >= 1, got {max_samples}")
    limit = slice(None, max_samples)
    if is_random_source(source):
        _no_preprocess(preprocess, str(source))
        return random_samples(str(source), inputs)[limit]
    if str(source).startswith(TRTEXEC_PREFIX):
        _no_preprocess(preprocess, str(source))
        return load_trtexec_inputs(str(source), inputs)[limit]
    paths, kind = _list_files(source)
    if kind == "image":
        spec = _image_spec(preprocess, os.fspath(source))
        wanted = paths if skip_bad else paths[limit]
        samples, _ = load_images(wanted, inputs, spec, skip_bad=skip_bad)
        return samples[limit]
    _no_preprocess(preprocess, os.fspath(source))
    samples = []
    for path in paths:
        if kind == "array":
            samples.extend(load_array_file(path, inputs, split_batch=split_batch))
        else:
            samples.extend(load_polygraphy_inputs(path, inputs))
        if max_samples is not None and len(samples) >= max_samples:
            break
    return samples[limit]


def open_samples(source: str | os.PathLike[str], inputs: Sequence[TensorMeta],
                 preprocess: PreprocessSpec | str | None = None,
                 max_samples: int | None = None) -> Sequence[Sample]:
    """``load_samples``, with images streamed: for an image source, a ``LazySamples`` that
    decodes and preprocesses each image when it is read (one in memory at a time); other
    sources (arrays, Polygraphy JSON, ``random:``, ``trtexec:``) are loaded as
    ``load_samples`` loads them.

    Raises:
        As ``load_samples``; for images, ``DataFormatError``/``InputShapeError`` when the
        failing image is read.
    """
    if max_samples is not None and max_samples < 1:
        raise InputError(f"max_samples must be >= 1, got {max_samples}")
    text = os.fspath(source)
    if is_random_source(text) or text.startswith(TRTEXEC_PREFIX):
        return load_samples(source, inputs, preprocess, max_samples)
    paths, kind = _list_files(source)
    if kind != "image":
        return load_samples(source, inputs, preprocess, max_samples)
    spec = _image_spec(preprocess, text)
    load_images(paths[:1], inputs, spec)  # fail now on a wrong spec or shape
    wanted = paths[:max_samples]
    return LazySamples(len(wanted), lambda i: load_images([wanted[i]], inputs, spec)[0][0])


def _image_spec(preprocess: PreprocessSpec | str | None, source: str) -> PreprocessSpec:
    if preprocess is None:
        raise InputError(
            f"{source}: images need an explicit preprocessing spec: a preset "
            f"({', '.join(PRESETS)}) or key=value pairs such as size=224x224,scale=1/255,"
            "mean=0.485/0.456/0.406,std=0.229/0.224/0.225,order=rgb,layout=nchw", file=source)
    return parse_preprocess(preprocess)


def _no_preprocess(preprocess: PreprocessSpec | str | None, source: str) -> None:
    if preprocess is not None:
        raise InputError(f"{source}: a preprocessing spec applies to images only; this source "
                         "holds ready tensors. Drop the preprocessing option.", file=source)
