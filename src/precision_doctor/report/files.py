"""Safe file output: checked before the work, never overwritten silently, written atomically.

Every output path is checked before any model is loaded (``check_writable``): the folder it goes
in exists, or its nearest existing ancestor is a folder this process can create entries in (the
missing folders are made when the file is written); it is not a folder, not one of the inputs
(the model is never overwritten), and it does not exist unless ``force``. A failed check names
the path in one line (``OutputPathError``, ``OutputExistsError``), and nothing has been written.
A file is then written to a temporary name in its folder and renamed over the target
(``os.replace`` is atomic on POSIX and Windows), so a crash never leaves a half-written report or
model.
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
            one of them (at any depth) is not checked again.

    Raises:
        OutputPathError: An output is an input, a folder, or its folder (or, when missing, its
            nearest existing ancestor) is not a folder or not writable (the message names the
            path).
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
    """Raise unless ``path`` is a writable folder, or is missing and its nearest existing
    ancestor is a writable folder (the caller creates the missing folders).

    Raises:
        OutputPathError: Names the path and what is wrong with it.
    """
    folder = Path(path)
    if folder.exists():
        if not folder.is_dir():
            raise OutputPathError(f"cannot write into {folder}: it is a file, not a folder",
                                  file=str(folder))
        _check_folder_writable(folder, folder)
        return
    _check_parent(folder)


def _check_parent(target: Path) -> None:
    """Raise unless the folder of ``target`` is writable or can be created: its nearest existing
    ancestor must be a folder this process can create entries in."""
    ancestor = next(a for a in (*target.parents, Path(".")) if os.path.lexists(a))
    if not ancestor.is_dir():
        raise OutputPathError(f"cannot write {target}: {ancestor} is a file, not a folder",
                              file=str(target))
    _check_folder_writable(ancestor, target)


def _check_folder_writable(folder: Path, target: Path) -> None:
    """Raise unless an entry can be created in ``folder``: ``os.access`` first, then a probe
    file made and removed, since ``os.access`` says yes to root everywhere (``/proc``, read-only
    mounts)."""
    what = f"{target}: folder {folder}" if folder != target else f"into {folder}: the folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputPathError(f"cannot write {what} is not writable", file=str(target))
    try:
        fd, probe = tempfile.mkstemp(prefix=".precision-doctor-probe.", dir=folder)
    except OSError as exc:
        raise OutputPathError(f"cannot write {what} is not writable (creating a file there "
                              f"failed: {exc.strerror or exc})",
                              file=str(target)) from exc
    os.close(fd)
    Path(probe).unlink(missing_ok=True)


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file (through links too, when both exist)."""
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
        return a.resolve() == b.resolve()
    except OSError:
        return False


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, force: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically, creating its missing parent folders.

    Raises:
        OutputPathError: ``path`` cannot be written (see ``check_writable``), or its folder
            cannot be created.
        OutputExistsError: ``path`` exists and ``force`` is False.
    """
    target = Path(path)
    check_writable([target], force)
    make_parent(target)
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


def make_parent(target: Path) -> None:
    """Create the missing folders above ``target`` (``mkdir -p``).

    Raises:
        OutputPathError: A folder cannot be created (the message names the file and the error).
    """
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(f"cannot write {target}: cannot create folder {target.parent} "
                              f"({exc.strerror or exc})", file=str(target)) from exc


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
    """Write ``model`` atomically, creating its missing folders; with its weights in
    ``<path>.data`` next to it when they are in external data files or the model is >= 2 GiB,
    so no protobuf above 2 GiB is built (``graph.external_files.save_model``).

    Returns:
        The files written.

    Raises:
        OutputPathError: A target cannot be written (see ``check_writable``), or its folder
            cannot be created.
        OutputExistsError: A target exists and ``force`` is False.
    """
    files = model_files(path, model)
    check_writable(files, force)
    make_parent(files[0])
    if len(files) == 2:
        return save_model(model, files[0])
    return [write_bytes_atomic(files[0], model.SerializeToString(), force)]
