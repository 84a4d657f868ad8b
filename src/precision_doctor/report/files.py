"""Safe file output: checked before the work, never overwritten silently, written atomically.

Every output path is checked before any model is loaded (``check_writable``): its folder exists
and is writable, it is not a folder, not one of the inputs (the model is never overwritten), and
it does not exist unless ``force``; a failed check names the path in one line
(``OutputPathError``, ``OutputExistsError``), and nothing has been written. A file is then
written to a temporary name in the same directory and renamed over the target (``os.replace``
is atomic on POSIX and Windows), so a crash never leaves a half-written report or model.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterable

import onnx

from precision_doctor.errors import OutputExistsError, OutputPathError
from precision_doctor.graph.external import has_external_data
from precision_doctor.graph.external_files import save_model
from precision_doctor.graph.load import PROTOBUF_LIMIT
from precision_doctor.jsonable import dumps


def check_writable(paths: Iterable[str | os.PathLike[str] | None], force: bool, *,
                   inputs: Iterable[str | os.PathLike[str] | None] = (),
                   folders: Iterable[str | os.PathLike[str]] = ()) -> None:
    """Raise before any work starts if an output cannot be written.

    Args:
        paths: Output files (None entries are skipped).
        force: Whether existing files may be replaced.
        inputs: The command's input files: no output may be one of them.
        folders: Output folders the caller creates when missing (``check_folder``); a file in
            one of them (at any depth) needs no existing parent folder.

    Raises:
        OutputPathError: An output is an input, a folder, or its folder is missing, not a
            folder or not writable (the message names the path).
        OutputExistsError: An output exists and ``force`` is False.
    """
    made = [Path(f) for f in folders]
    for folder in made:
        check_folder(folder)
    sources = [Path(i) for i in inputs if i is not None]
    for p in paths:
        if p is None:
            continue
        target = Path(p)
        if any(_same_file(target, s) for s in sources):
            raise OutputPathError(f"cannot write {target}: it is an input of this command; "
                                  "write the output elsewhere", file=str(target))
        if target.is_dir():
            raise OutputPathError(f"cannot write {target}: it is a folder; give a file name",
                                  file=str(target))
        if not any(f == target.parent or f in target.parents for f in made):
            _check_parent(target)
        if target.exists() and not force:
            raise OutputExistsError(f"{p} exists; pass --force to overwrite it", file=str(p))


def check_folder(path: str | os.PathLike[str]) -> None:
    """Raise unless ``path`` is a writable folder, or is missing with a writable parent folder
    (the caller creates it, one level only).

    Raises:
        OutputPathError: Names the path and what is wrong with it.
    """
    folder = Path(path)
    if folder.exists():
        if not folder.is_dir():
            raise OutputPathError(f"cannot write into {folder}: it is a file, not a folder",
                                  file=str(folder))
        if not os.access(folder, os.W_OK | os.X_OK):
            raise OutputPathError(f"cannot write into {folder}: the folder is not writable",
                                  file=str(folder))
        return
    _check_parent(folder)


def _check_parent(target: Path) -> None:
    parent = target.parent
    if not parent.exists():
        raise OutputPathError(f"cannot write {target}: folder {parent} does not exist "
                              "(create it first)", file=str(target))
    if not parent.is_dir():
        raise OutputPathError(f"cannot write {target}: {parent} is a file, not a folder",
                              file=str(target))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputPathError(f"cannot write {target}: folder {parent} is not writable",
                              file=str(target))


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file (through links too, when both exist)."""
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
        return a.resolve() == b.resolve()
    except OSError:
        return False


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, force: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically (its folder must exist).

    Raises:
        OutputPathError: ``path`` cannot be written (see ``check_writable``).
        OutputExistsError: ``path`` exists and ``force`` is False.
    """
    target = Path(path)
    check_writable([target], force)
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
        OutputPathError: A target cannot be written (see ``check_writable``).
        OutputExistsError: A target exists and ``force`` is False.
    """
    files = model_files(path, model)
    check_writable(files, force)
    if len(files) == 2:
        return save_model(model, files[0])
    return [write_bytes_atomic(files[0], model.SerializeToString(), force)]
