"""The weight store: tensors computed from external weights, in one file per process.

The emulator's rounded copies and the writer's FP16/BF16 copies of weights that live in external
data files are written here (4096-aligned) and referenced by absolute location, so the models
that use them stay small protos (``graph.external``) and repeated emulations reuse them.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import onnx_ir as ir

from precision_doctor.errors import BackendError
from precision_doctor.graph.external import (
    external_info,
    pad_to_alignment,
    set_external_info,
    tensor_array,
)


class WeightStore:
    """Append-only files of derived tensors (rounded or converted weights).

    Entries are cached by a key (e.g. source file, offset, format), so a search that builds
    dozens of emulation models rounds each weight once. Each process appends to its own file
    (``weights-<pid>.bin``) in one folder, so forked workers (a process pool) never interleave
    writes, and they still read the entries their parent made before the fork. The folder is
    removed when the process that created it exits.
    """

    def __init__(self) -> None:
        self._folder: str | None = None
        self._cache: dict[tuple, tuple[str, int, int]] = {}
        self._lock = threading.Lock()

    def _path(self) -> str:
        if self._folder is None:
            self._folder = tempfile.mkdtemp(prefix="precision-doctor-weights-")
            atexit.register(shutil.rmtree, self._folder, True)
        path = os.path.join(self._folder, f"weights-{os.getpid()}.bin")
        Path(path).touch()
        return path

    def put(self, array: np.ndarray, key: tuple | None = None) -> tuple[str, int, int]:
        """Store ``array``'s bytes (C order); returns ``(absolute file, offset, length)``.

        Raises:
            BackendError: The file cannot be written (e.g. the disk is full).
        """
        with self._lock:
            if key is not None and key in self._cache:
                return self._cache[key]
            path = self._path()
            data = np.ascontiguousarray(array)
            try:
                with open(path, "ab") as out:
                    start = pad_to_alignment(out)
                    data.tofile(out)
            except OSError as exc:
                raise BackendError(
                    f"cannot write derived weights to {path} ({exc}): free disk space there "
                    "or point TMPDIR to a larger disk") from exc
            entry = (path, start, data.nbytes)
            self._cache[key if key is not None else ("anon", path, start)] = entry
            return entry

    def get(self, key: tuple) -> tuple[str, int, int] | None:
        """The stored ``(file, offset, length)`` for ``key`` or None."""
        with self._lock:
            return self._cache.get(key)


STORE = WeightStore()


def stored_tensor_proto(array: np.ndarray, name: str) -> onnx.TensorProto:
    """``array`` as a ``TensorProto`` referencing the process's ``WeightStore``."""
    location, offset, length = STORE.put(array)
    tensor = onnx.TensorProto(name=name, dims=list(array.shape),
                              data_type=onnx.helper.np_dtype_to_tensor_dtype(array.dtype))
    set_external_info(tensor, location, offset, length)
    return tensor


def stored_copy(source: ir.ExternalTensor, key: tuple, dtype: ir.DataType, name: str,
                compute: Callable[[], np.ndarray]) -> tuple[ir.ExternalTensor, bool]:
    """A tensor derived from the external weight ``source`` (rounded, converted), kept in the
    weight store under ``key`` (``ir_external_key``): ``compute()`` runs only the first time in
    this process; later emulation or written models reuse the stored bytes.

    Returns:
        (the derived tensor, whether ``compute`` ran now).

    Raises:
        BackendError: The store cannot be written.
    """
    entry, computed = _stored(key, compute)
    return ir.ExternalTensor(*entry, dtype, shape=ir.Shape(source.shape), name=name), computed


def _stored(key: tuple, compute: Callable[[], np.ndarray]) -> tuple[tuple[str, int, int], bool]:
    """The store's ``(file, offset, length)`` under ``key``, ``compute()`` stored there first
    when absent; and whether it ran."""
    entry = STORE.get(key)
    if entry is not None:
        return entry, False
    derived = compute()
    entry = STORE.put(derived, key)
    del derived
    return entry, True


def stored_proto_copy(source: onnx.TensorProto, tag: str, name: str,
                      compute: Callable[[np.ndarray], np.ndarray]) -> onnx.TensorProto:
    """``stored_copy`` for an external weight given as a ``TensorProto``: ``compute(source
    values)`` (same shape and dtype) is stored once per (source bytes, ``tag``) in this process.

    Raises:
        BackendError: The store cannot be written.
    """
    location, offset, length = external_info(source)
    key = (location, offset, length, tag)  # ``ir_external_key`` of the same weight
    entry, _ = _stored(key, lambda: compute(tensor_array(source)))
    tensor = onnx.TensorProto(name=name, dims=list(source.dims), data_type=source.data_type)
    set_external_info(tensor, *entry)
    return tensor


def ir_external_key(tensor: object, tag: str) -> tuple | None:
    """A cache key for a tensor derived (``tag``) from an external onnx-ir tensor, else None."""
    if isinstance(tensor, ir.ExternalTensor):
        return (os.fspath(tensor.path), tensor.offset, tensor.length, tag)
    return None

