"""Models with external data (weights in files next to the ``.onnx``): reading them.

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

Reading is here; ``graph.external_files`` writes (``save_model``, ``link_model``) and
``graph.weight_store`` holds the derived tensors.

Offsets in written data files are aligned to 4096 bytes (``onnx.save_model``'s own alignment for
tensors above 1 MiB), so ONNX Runtime can memory-map them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.external_data_helper import _get_all_tensors

from precision_doctor.errors import ModelLoadError

# Tensors smaller than this are read into the proto at load time (onnx.save_model's default
# ``size_threshold`` is 1024 bytes: shape tensors and scalars stay usable by shape inference).
INLINE_BELOW = 1024
ALIGN = 4096


def is_external(tensor: onnx.TensorProto) -> bool:
    """True when ``tensor``'s data lives in a file (``data_location == EXTERNAL``)."""
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def external_info(tensor: onnx.TensorProto) -> tuple[str, int, int | None]:
    """``(location, offset, length)`` of an external tensor (length None: to end of file)."""
    info = {e.key: e.value for e in tensor.external_data}
    length = info.get("length")
    return info.get("location", ""), int(info.get("offset", 0) or 0), \
        int(length) if length else None


def set_external_info(tensor: onnx.TensorProto, location: str, offset: int, length: int
                      ) -> None:
    """Make ``tensor`` reference ``length`` bytes at ``offset`` of the file ``location``."""
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
    set_external_info(tensor, str(path), offset, length)
    return length


def has_external_data(model: onnx.ModelProto) -> bool:
    """True when some tensor of ``model`` references a data file."""
    return any(is_external(t) for t in _get_all_tensors(model))


def external_bytes(model: onnx.ModelProto) -> int:
    """Total bytes referenced by external tensors of ``model``."""
    return sum(external_info(t)[2] or 0 for t in _get_all_tensors(model) if is_external(t))


# Largest model held twice in memory on purpose (a search's next runner opened ahead, a kept
# emulation model with its rounded weights): weights in the proto, none external.
SMALL_MODEL_BYTES = 256 << 20


def small_in_memory(model: onnx.ModelProto) -> bool:
    """Whether every weight of ``model`` is in the proto and the proto is under
    ``SMALL_MODEL_BYTES``: a second copy of it costs little."""
    return not has_external_data(model) and model.ByteSize() < SMALL_MODEL_BYTES


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


def read_names(graph: onnx.GraphProto, into: set[str]) -> set[str]:
    """Names read by the nodes of ``graph`` and its subgraphs, plus its outputs."""
    into.update(o.name for o in graph.output)
    for node in graph.node:
        into.update(node.input)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                read_names(attr.g, into)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    read_names(g, into)
    return into


def drop_unused_external(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or a copy without the external initializers nothing reads (the emulator's
    rounded copies replace the originals; ONNX Runtime removes unread initializers before it
    accepts external ones, and would then reject them)."""
    read = read_names(model.graph, set())
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



def iter_external(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every external tensor of ``model`` (all graphs)."""
    return (t for t in _get_all_tensors(model) if is_external(t))


def pad_to_alignment(out) -> int:
    """Pad the open binary file ``out`` with zeros to a multiple of ``ALIGN``; the new end."""
    pos = out.tell()
    if pos % ALIGN:
        out.write(b"\0" * (ALIGN - pos % ALIGN))
    return out.tell()
