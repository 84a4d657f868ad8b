"""Safe file output: never overwrite silently, always write atomically.

A file is written to a temporary name in the same directory and renamed over the target
(``os.replace`` is atomic on POSIX and Windows), so a crash never leaves a half-written report
or model, and an existing file is replaced only with ``force=True``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterable

import onnx

from precision_doctor.errors import OutputExistsError
from precision_doctor.graph.external import has_external_data
from precision_doctor.graph.external_files import save_model
from precision_doctor.graph.load import PROTOBUF_LIMIT
from precision_doctor.jsonable import dumps


def check_writable(paths: Iterable[str | os.PathLike[str] | None], force: bool) -> None:
    """Raise before any work starts if an output exists and ``force`` is False.

    Raises:
        OutputExistsError: Names the first existing file.
    """
    for p in paths:
        if p is not None and Path(p).exists() and not force:
            raise OutputExistsError(f"{p} exists; pass --force to overwrite it", file=str(p))


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, force: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically.

    Raises:
        OutputExistsError: ``path`` exists and ``force`` is False.
    """
    target = Path(path)
    check_writable([target], force)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the usual permissions
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def write_text_atomic(path: str | os.PathLike[str], text: str, force: bool = False) -> Path:
    """UTF-8 text version of ``write_bytes_atomic``."""
    return write_bytes_atomic(path, text.encode("utf-8"), force)


def write_json(path: str | os.PathLike[str], data: object, force: bool = False) -> Path:
    """Write ``data`` as stable, indented JSON (sorted keys) atomically."""
    return write_text_atomic(path, dumps(data), force)


def model_files(path: str | os.PathLike[str], model: onnx.ModelProto) -> list[Path]:
    """The files ``write_model`` writes for ``model``: ``path``, and ``<path>.data`` when the
    model has external data or is >= 2 GiB."""
    target = Path(path)
    if has_external_data(model) or model.ByteSize() >= PROTOBUF_LIMIT:
        return [target, target.with_name(target.name + ".data")]
    return [target]


def write_model(path: str | os.PathLike[str], model: onnx.ModelProto, force: bool = False
                ) -> list[Path]:
    """Write ``model`` atomically; with its weights in ``<path>.data`` next to it when they
    are in external data files or the model is >= 2 GiB, so no protobuf above 2 GiB is built
    (``graph.external_files.save_model``).

    Returns:
        The files written.

    Raises:
        OutputExistsError: A target exists and ``force`` is False.
    """
    files = model_files(path, model)
    check_writable(files, force)
    if len(files) == 2:
        return save_model(model, files[0])
    return [write_bytes_atomic(files[0], model.SerializeToString(), force)]
