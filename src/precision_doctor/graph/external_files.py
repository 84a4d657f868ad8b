"""Write models whose tensors reference external data (``graph.external``) as files.

``save_model`` writes what the user gets: ``<name>.onnx`` + ``<name>.onnx.data`` with relative
locations, atomically. ``link_model`` writes a temporary view for tools that open a path (ONNX
Runtime, onnx.checker, TensorRT's parser) whose data files are hard links to the originals.
Offsets in written data files are aligned to 4096 bytes (``onnx.save_model``'s own alignment for
tensors above 1 MiB), so ONNX Runtime can memory-map them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import onnx
from onnx.external_data_helper import _get_all_tensors

from precision_doctor.errors import ModelLoadError
from precision_doctor.graph.external import (
    INLINE_BELOW,
    external_info,
    is_external,
    pad_to_alignment,
    set_external_info,
)

_COPY_CHUNK = 64 << 20


def _copy_range(src: str, offset: int, length: int, out) -> None:
    with open(src, "rb") as f:
        f.seek(offset)
        left = length
        while left > 0:
            block = f.read(min(_COPY_CHUNK, left))
            if not block:
                raise ModelLoadError(f"external data file {src} ended early", file=src)
            out.write(block)
            left -= len(block)


def _externalize_into(model: onnx.ModelProto, out, location: str,
                      raw_only: bool = False) -> None:
    """Move every tensor of ``model`` with data of at least ``INLINE_BELOW`` bytes (external or
    raw; with ``raw_only``, raw only: external ones stay where they are) into the open binary
    file ``out``, recorded under ``location``."""
    reuse: dict[tuple[str, int], int] = {}
    for tensor in _get_all_tensors(model):
        if is_external(tensor):
            if raw_only:
                continue
            src, offset, length = external_info(tensor)
            length = length if length is not None else os.path.getsize(src) - offset
            key = (src, offset)
            if key not in reuse:
                reuse[key] = pad_to_alignment(out)
                _copy_range(src, offset, length, out)
            set_external_info(tensor, location, reuse[key], length)
        elif tensor.HasField("raw_data") and len(tensor.raw_data) >= INLINE_BELOW:
            start = pad_to_alignment(out)
            out.write(tensor.raw_data)
            set_external_info(tensor, location, start, len(tensor.raw_data))


def save_model(model: onnx.ModelProto, path: Path) -> list[Path]:
    """Write ``model`` as ``path`` + ``<path name>.data`` (self-contained, relative locations).

    Both files are written under temporary names in the target folder and renamed into place
    (the data file first), so a reader never sees a half-written pair. The caller checks
    overwriting (``report.files.check_writable``).

    Args:
        model: The model (not modified); its external tensors are copied in chunks of 64 MiB.
        path: The ``.onnx`` file to write.

    Returns:
        The files written: ``[path, data file]``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data_name = path.name + ".data"
    data_path = path.with_name(data_name)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    umask = os.umask(0)
    os.umask(umask)
    temps: list[str] = []
    try:
        for name, fill in ((data_name, lambda out: _externalize_into(copy, out, data_name)),
                           (path.name, lambda out: out.write(copy.SerializeToString()))):
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=path.parent)
            temps.append(tmp)
            with os.fdopen(fd, "wb") as out:
                fill(out)  # the data file first: it fixes the proto's offsets
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the usual permissions
        os.replace(temps[0], data_path)
        os.replace(temps[1], path)
    except BaseException:
        for tmp in temps:
            Path(tmp).unlink(missing_ok=True)
        raise
    return [path, data_path]


def link_model(model: onnx.ModelProto, folder: Path, name: str = "model.onnx",
               copy: bool = True) -> Path:
    """Write ``model`` into ``folder`` for tools that open a path (ONNX Runtime, onnx.checker,
    TensorRT's parser): every data file it references is hard-linked into ``folder`` and
    referenced by a relative name. (Symbolic links do not do: ONNX Runtime rejects data files
    that resolve outside the model's folder.)

    Args:
        model: The model (not modified).
        folder: An existing folder; it must outlive the use of the path.
        name: File name of the model.
        copy: Copy a data file when it cannot be linked (another file system); when False,
            raise ``OSError`` instead.

    Returns:
        The ``.onnx`` path.
    """
    folder = Path(folder)
    view = onnx.ModelProto()
    view.CopyFrom(model)
    names: dict[str, str] = {}
    for tensor in _get_all_tensors(view):
        if not is_external(tensor):
            continue
        src, offset, length = external_info(tensor)
        if src not in names:
            names[src] = f"{name}.data{len(names)}"
            target = folder / names[src]
            try:
                os.link(src, target)
            except OSError:
                if not copy:
                    raise
                shutil.copyfile(src, target)
        set_external_info(tensor, names[src], offset,
                  length if length is not None else os.path.getsize(src) - offset)
    if view.ByteSize() >= 2**31 - 1:  # large in-memory tensors: into a data file of their own
        # (the linked ones above already point at their files)
        with open(folder / f"{name}.data", "wb") as out:
            _externalize_into(view, out, f"{name}.data", raw_only=True)
    target = folder / name
    target.write_bytes(view.SerializeToString())
    return target

