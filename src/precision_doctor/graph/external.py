"""Models with external data (weights in files next to the ``.onnx``): read, run, write.

Protobuf cannot serialize a message of 2 GiB or more, so a large model never has its weights
inside a ``ModelProto`` here. ``load_model`` keeps every tensor of at least ``INLINE_BELOW``
bytes that the file stores externally as a reference (ONNX's ``external_data`` fields) whose
``location`` is made **absolute**, so the proto can be copied, edited, output-marked and split
into segments (onnx, onnx-ir) anywhere without knowing the model's folder. Such a proto is an
in-memory form only: onnx and ONNX Runtime reject absolute locations on disk, so

* tools that open a path (ONNX Runtime, onnx.checker, TensorRT's parser) get ``link_model``: a
  temporary folder whose data files are hard links to the originals. ONNX Runtime then
  memory-maps the weights itself (4 blocks of ``benchmarks/bigmodel.py``, 0.5 GiB: 678 MiB peak
  RSS for a session from the path, 1191 MiB when the same weights are handed over as
  ``OrtValue``s with ``SessionOptions.add_external_initializers``, which ONNX Runtime copies;
  that is only the fallback when a link is impossible, across file systems);
* files for the user are written with ``save_model`` (one ``<name>.data`` next to the model,
  relative locations, atomic);
* tensors computed from external weights (the emulator's rounded copies, the writer's FP16
  copies) go to a per-process ``WeightStore`` file and are referenced the same way.

Offsets in written data files are aligned to 4096 bytes (``onnx.save_model``'s own alignment for
tensors above 1 MiB), so ONNX Runtime can memory-map them.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import numpy_helper
from onnx.external_data_helper import _get_all_tensors

from precision_doctor.errors import ModelLoadError

# Tensors smaller than this are read into the proto at load time (onnx.save_model's default
# ``size_threshold`` is 1024 bytes: shape tensors and scalars stay usable by shape inference).
INLINE_BELOW = 1024
ALIGN = 4096
_COPY_CHUNK = 64 << 20


def is_external(tensor: onnx.TensorProto) -> bool:
    """True when ``tensor``'s data lives in a file (``data_location == EXTERNAL``)."""
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def external_info(tensor: onnx.TensorProto) -> tuple[str, int, int | None]:
    """``(location, offset, length)`` of an external tensor (length None: to end of file)."""
    info = {e.key: e.value for e in tensor.external_data}
    length = info.get("length")
    return info.get("location", ""), int(info.get("offset", 0) or 0), \
        int(length) if length else None


def _set_info(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.ClearField("raw_data")


def _nbytes(tensor: onnx.TensorProto) -> int | None:
    """Bytes of the raw data for fixed-size element types (None for strings/sub-byte types)."""
    if tensor.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return None
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except Exception:  # noqa: BLE001 - exotic types: no size check
        return None
    if tensor.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        return None
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize


def resolve_external_data(model: onnx.ModelProto, model_path: Path) -> int:
    """Check every external tensor of ``model`` (loaded without its data) and prepare it.

    Tensors under ``INLINE_BELOW`` bytes and tensors outside the main graph's initializers are
    read into the proto; the others keep an absolute ``location``.

    Args:
        model: Loaded with ``onnx.load(..., load_external_data=False)``; edited in place.
        model_path: The ``.onnx`` file (locations are relative to its folder).

    Returns:
        Total bytes left external.

    Raises:
        ModelLoadError: A data file is missing, unreadable or shorter than the model says.
    """
    base = model_path.resolve().parent
    left = 0
    # Main-graph initializers first (they may stay external), then every other tensor
    # (Constant attributes, subgraph initializers), which is read into the proto.
    for tensor in model.graph.initializer:
        if is_external(tensor):
            left += _resolve(tensor, base, model_path, inline=False)
    for tensor in _get_all_tensors(model):
        if is_external(tensor) and not os.path.isabs(external_info(tensor)[0]):
            _resolve(tensor, base, model_path, inline=True)
    for tensor in _get_all_tensors(model):  # absolute in the file: rejected by _resolve
        if is_external(tensor) and not external_info(tensor)[0].startswith(str(base)):
            _resolve(tensor, base, model_path, inline=True)
    return left


def _resolve(tensor: onnx.TensorProto, base: Path, model_path: Path, inline: bool) -> int:
    """Check one external tensor; read it in (``inline`` or small) or make its location
    absolute. Returns the bytes left external."""
    location, offset, length = external_info(tensor)
    path = base / location
    what = f"external data file {path} (tensor {tensor.name!r}, recorded as {location!r})"
    if Path(location).is_absolute() or ".." in Path(location).parts:
        # The ONNX external-data rule (onnx.checker, ONNX Runtime): data stays in the folder.
        raise ModelLoadError(
            f"{model_path}: {what} is outside the model's folder: ONNX requires a relative "
            "location inside it. Move the data file next to the model and re-save it with "
            "onnx.save_model(..., save_as_external_data=True).", file=str(model_path))
    if not location or not path.is_file():
        raise ModelLoadError(
            f"{model_path}: {what} is missing. Keep the data files next to the model under "
            "the names it records (re-export with onnx.save_model(..., "
            "save_as_external_data=True) if they were lost).", file=str(path))
    size = path.stat().st_size
    expected = _nbytes(tensor)
    if length is None:
        length = expected if expected is not None else size - offset
    if offset + length > size or (expected is not None and length != expected):
        raise ModelLoadError(
            f"{model_path}: {what} is truncated or does not match the model: the tensor "
            f"needs {expected if expected is not None else length} bytes at offset {offset}, "
            f"the file has {size} bytes. Copy the complete data file again.", file=str(path))
    if inline or length < INLINE_BELOW:
        with open(path, "rb") as f:
            f.seek(offset)
            tensor.raw_data = f.read(length)
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT
        return 0
    _set_info(tensor, str(path), offset, length)
    return length


def has_external_data(model: onnx.ModelProto) -> bool:
    """True when some tensor of ``model`` references a data file."""
    return any(is_external(t) for t in _get_all_tensors(model))


def external_bytes(model: onnx.ModelProto) -> int:
    """Total bytes referenced by external tensors of ``model``."""
    return sum(external_info(t)[2] or 0 for t in _get_all_tensors(model) if is_external(t))


def tensor_array(tensor: onnx.TensorProto) -> np.ndarray:
    """The value of ``tensor`` (read-only memory map when external; the proto is not changed,
    unlike ``onnx.numpy_helper.to_array``, which loads the data into the proto)."""
    if not is_external(tensor):
        return numpy_helper.to_array(tensor)
    location, offset, length = external_info(tensor)
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
    shape = tuple(int(d) for d in tensor.dims)
    if dtype.kind in "fiub" and tensor.data_type != onnx.TensorProto.BFLOAT16 \
            and _nbytes(tensor) == length:
        if length == 0:
            return np.zeros(shape, dtype)
        return np.memmap(location, dtype=dtype, mode="r", offset=offset, shape=shape)
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    with open(location, "rb") as f:
        f.seek(offset)
        copy.raw_data = f.read(length if length is not None else -1)
    del copy.external_data[:]
    copy.data_location = onnx.TensorProto.DEFAULT
    return numpy_helper.to_array(copy)


def external_initializers(model: onnx.ModelProto) -> tuple[list[str], list[np.ndarray]]:
    """Names and memory-mapped values of the main graph's external initializers (for
    ``onnxruntime.SessionOptions.add_external_initializers``)."""
    names, values = [], []
    for t in model.graph.initializer:
        if is_external(t):
            names.append(t.name)
            values.append(tensor_array(t))
    return names, values


def _read_names(graph: onnx.GraphProto, into: set[str]) -> set[str]:
    """Names read by the nodes of ``graph`` and its subgraphs, plus its outputs."""
    into.update(o.name for o in graph.output)
    for node in graph.node:
        into.update(node.input)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _read_names(attr.g, into)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    _read_names(g, into)
    return into


def drop_unused_external(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or a copy without the external initializers nothing reads (the emulator's
    rounded copies replace the originals; ONNX Runtime removes unread initializers before it
    accepts external ones, and would then reject them)."""
    read = _read_names(model.graph, set())
    if all(t.name in read for t in model.graph.initializer if is_external(t)):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    kept = [t for t in copy.graph.initializer if not is_external(t) or t.name in read]
    dropped = {t.name for t in copy.graph.initializer} - {t.name for t in kept}
    inputs = [i for i in copy.graph.input if i.name not in dropped]
    del copy.graph.initializer[:]
    copy.graph.initializer.extend(kept)
    del copy.graph.input[:]
    copy.graph.input.extend(inputs)
    return copy


# -- writing -------------------------------------------------------------------------------
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


def _pad(out) -> int:
    pos = out.tell()
    if pos % ALIGN:
        out.write(b"\0" * (ALIGN - pos % ALIGN))
    return out.tell()


def _externalize_into(model: onnx.ModelProto, out, location: str,
                      reuse: dict[tuple[str, int], int] | None = None) -> None:
    """Move every tensor of ``model`` with data of at least ``INLINE_BELOW`` bytes (external or
    raw) into the open binary file ``out``, recorded under ``location``."""
    reuse = {} if reuse is None else reuse
    for tensor in _get_all_tensors(model):
        if is_external(tensor):
            src, offset, length = external_info(tensor)
            length = length if length is not None else os.path.getsize(src) - offset
            key = (src, offset)
            if key not in reuse:
                reuse[key] = _pad(out)
                _copy_range(src, offset, length, out)
            _set_info(tensor, location, reuse[key], length)
        elif tensor.HasField("raw_data") and len(tensor.raw_data) >= INLINE_BELOW:
            start = _pad(out)
            out.write(tensor.raw_data)
            _set_info(tensor, location, start, len(tensor.raw_data))


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
    data_name = path.name + ".data"
    data_path = path.with_name(data_name)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    fd, tmp_data = tempfile.mkstemp(prefix=f".{data_name}.", dir=path.parent)
    tmp_model = None
    try:
        with os.fdopen(fd, "wb") as out:
            _externalize_into(copy, out, data_name)
        fd2, tmp_model = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd2, "wb") as out:
            out.write(copy.SerializeToString())
        os.replace(tmp_data, data_path)
        os.replace(tmp_model, path)
    except BaseException:
        for tmp in (tmp_data, tmp_model):
            if tmp and os.path.exists(tmp):
                os.unlink(tmp)
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
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    names: dict[str, str] = {}
    for tensor in _get_all_tensors(copy):
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
        _set_info(tensor, names[src], offset,
                  length if length is not None else os.path.getsize(src) - offset)
    if copy.ByteSize() >= 2**31 - 1:  # large in-memory tensors: into a data file of their own
        with open(folder / f"{name}.data", "wb") as out:
            _externalize_into(copy, out, f"{name}.data")
    target = folder / name
    target.write_bytes(copy.SerializeToString())
    return target


# -- tensors computed from external weights --------------------------------------------------
class WeightStore:
    """Append-only file of derived tensors (rounded or converted weights), one per process.

    Entries are cached by a key (e.g. source file, offset, format), so a search that builds
    dozens of emulation models rounds each weight once. The folder is removed at exit.
    """

    def __init__(self) -> None:
        self._folder: str | None = None
        self._file: str | None = None
        self._cache: dict[tuple, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def _path(self) -> str:
        if self._file is None:
            self._folder = tempfile.mkdtemp(prefix="precision-doctor-weights-")
            atexit.register(shutil.rmtree, self._folder, True)
            self._file = os.path.join(self._folder, "weights.bin")
            Path(self._file).touch()
        return self._file

    def put(self, array: np.ndarray, key: tuple | None = None) -> tuple[str, int, int]:
        """Store ``array``'s bytes (C order); returns ``(absolute file, offset, length)``."""
        with self._lock:
            path = self._path()
            if key is not None and key in self._cache:
                return (path, *self._cache[key])
            data = np.ascontiguousarray(array)
            with open(path, "ab") as out:
                start = _pad(out)
                data.tofile(out)
            self._cache[key if key is not None else ("anon", start)] = (start, data.nbytes)
            return path, start, data.nbytes

    def get(self, key: tuple) -> tuple[str, int, int] | None:
        """The stored entry for ``key`` or None."""
        with self._lock:
            entry = self._cache.get(key)
            return None if entry is None else (self._path(), *entry)


STORE = WeightStore()


def stored_ir_tensor(array: np.ndarray, name: str, key: tuple | None = None
                     ) -> ir.ExternalTensor:
    """``array`` as an onnx-ir tensor backed by the process's ``WeightStore``."""
    location, offset, length = STORE.put(array, key)
    return ir.ExternalTensor(location, offset, length, ir.DataType.from_numpy(array.dtype),
                             shape=ir.Shape(array.shape), name=name)


def stored_tensor_proto(array: np.ndarray, name: str) -> onnx.TensorProto:
    """``array`` as a ``TensorProto`` referencing the process's ``WeightStore``."""
    location, offset, length = STORE.put(array)
    tensor = onnx.TensorProto(name=name, dims=list(array.shape),
                              data_type=onnx.helper.np_dtype_to_tensor_dtype(array.dtype))
    _set_info(tensor, location, offset, length)
    return tensor


def ir_external_key(tensor: object, tag: str) -> tuple | None:
    """A cache key for a tensor derived (``tag``) from an external onnx-ir tensor, else None."""
    if isinstance(tensor, ir.ExternalTensor):
        return (os.fspath(tensor.path), tensor.offset, tensor.length, tag)
    return None


def iter_external(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every external tensor of ``model`` (all graphs)."""
    return (t for t in _get_all_tensors(model) if is_external(t))
