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

from precision_doctor.errors import OutputExistsError
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
