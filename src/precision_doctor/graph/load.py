"""Load ONNX models with clear errors, and hand them to ONNX Runtime safely.

Models are never modified on disk. In memory, nodes without a name (or with a duplicate name) get
a deterministic one, ``<op_type>_<index>``, because precision plans and reports address nodes by
name.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError, EncodeError
from onnx import helper

from precision_doctor.errors import ModelLoadError
from precision_doctor.graph.external import has_external_data, resolve_external_data
from precision_doctor.graph.external_files import link_model


@dataclass(frozen=True)
class TensorMeta:
    """Name, dtype and shape of a model input or output.

    Attributes:
        name: Tensor name in the ONNX graph.
        dtype: numpy dtype (e.g. ``float32``).
        shape: Dims; ``int`` for fixed, ``str`` for symbolic/dynamic (e.g. ``"batch"`` or ``"?"``).
    """

    name: str
    dtype: np.dtype
    shape: tuple[int | str, ...]

    def is_dynamic(self) -> bool:
        """True when at least one dim is symbolic."""
        return any(not isinstance(d, int) for d in self.shape)


# Protobuf cannot serialize a message of 2 GiB or more (hard limit of the format).
PROTOBUF_LIMIT = 2**31 - 1


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Read an ONNX model and name every node uniquely; external data stays in its files.

    External tensors of at least ``graph.external.INLINE_BELOW`` bytes are kept as references
    with absolute locations (see ``graph.external``), so a model of any size fits in a proto
    below protobuf's 2 GiB limit and its weights are read (memory-mapped) only where needed.

    Args:
        path: ``.onnx`` file; external data files are looked up next to it.

    Returns:
        The model proto (in memory only; the file is untouched).

    Raises:
        ModelLoadError: File missing, not ONNX/corrupt/truncated, or an external data file
            missing or truncated (the message names the file).
    """
    p = Path(path)
    if not p.is_file():
        raise ModelLoadError(f"model file not found: {p}", file=str(p))
    if p.stat().st_size == 0:
        raise ModelLoadError(f"model file is empty: {p}", file=str(p))
    try:
        model = onnx.load(str(p), load_external_data=False)
    except DecodeError as exc:
        raise ModelLoadError(
            f"{p} is not a readable ONNX model (corrupt or truncated protobuf: {exc}). "
            "Re-export it or check the download.", file=str(p)) from exc
    except (FileNotFoundError, OSError) as exc:
        raise ModelLoadError(
            f"{p} refers to external data that cannot be read ({exc}). Keep the external data "
            "files next to the model, with the names the model records.", file=str(p)) from exc
    except Exception as exc:  # onnx raises ValueError/RuntimeError variants on bad files
        raise ModelLoadError(f"cannot load {p}: {exc}", file=str(p)) from exc
    if not model.graph.node:
        raise ModelLoadError(f"{p} has no nodes: is it an ONNX model?", file=str(p))
    try:
        resolve_external_data(model, p)
    except OSError as exc:
        raise ModelLoadError(
            f"{p} refers to external data that cannot be read ({exc}). Keep the external data "
            "files next to the model, with the names the model records.", file=str(p)) from exc
    name_nodes(model)
    return model


def name_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Give every unnamed or duplicate-named node of the main graph a unique name, in place.

    Returns:
        The same model, for chaining.
    """
    seen: set[str] = set()
    for node in model.graph.node:
        if node.name and node.name not in seen:
            seen.add(node.name)
    used: set[str] = set()
    for index, node in enumerate(model.graph.node):
        if node.name and node.name not in used:
            used.add(node.name)
            continue
        base = f"{node.op_type}_{index}"
        name, k = base, 1
        while name in seen or name in used:
            name, k = f"{base}_{k}", k + 1
        node.name = name
        used.add(name)
    return model


def ort_model_source(model: onnx.ModelProto, workdir: str | None = None,
                     external: bool | None = None) -> bytes | str:
    """Bytes for a parser that takes a buffer, or a path when the model has external data or
    is >= 2 GiB.

    Such models are written into ``workdir`` (a fresh temporary directory when None) with
    ``graph.external.link_model``: data files hard-linked (copied across file systems), large
    in-memory tensors saved as external data. The caller keeps that directory alive while the
    path is in use.

    Args:
        model: The model to run.
        workdir: Directory for the path form.
        external: ``has_external_data(model)`` when the caller knows it already.

    Returns:
        Serialized bytes, or the path of the saved ``.onnx`` file.
    """
    if not (has_external_data(model) if external is None else external):
        data = serialized_under_limit(model)
        if data is not None:
            return data
    folder = Path(workdir or tempfile.mkdtemp(prefix="precision-doctor-"))
    return str(link_model(model, folder))


def serialized_under_limit(model: onnx.ModelProto) -> bytes | None:
    """``model.SerializeToString()`` when it is under ``PROTOBUF_LIMIT``, else None.

    Serializing first costs less than asking the size first: on a proto built in Python (an
    emulation, a written model) ``ByteSize`` takes 1.5x ``SerializeToString`` (PP-OCRv4 rec
    emulation, 21 MB: 65-80 ms against 40-50 ms, measured 2026-11-28), and the second pass
    is not needed. A proto whose initializers alone reach the limit is not serialized at all.
    """
    if sum(t.ByteSize() for t in model.graph.initializer) >= PROTOBUF_LIMIT:
        return None
    try:
        data = model.SerializeToString()
    except (EncodeError, ValueError):
        if model.ByteSize() < PROTOBUF_LIMIT:
            raise  # not the size: the error a caller got before
        return None  # over what protobuf serializes (2 GiB)
    return data if len(data) < PROTOBUF_LIMIT else None


def opset_of(model: onnx.ModelProto) -> int:
    """The default-domain (``ai.onnx``) opset version of ``model``."""
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 1


def input_metadata(model: onnx.ModelProto) -> list[TensorMeta]:
    """Graph inputs that are not initializers, as ``TensorMeta`` (dims: int or symbol name).

    Returns:
        ``list[TensorMeta]`` in model order; unknown dims are ``"?"``.
    """
    inits = {t.name for t in model.graph.initializer}
    metas = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type) if tt.elem_type else np.float32
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                     for d in tt.shape.dim)
        metas.append(TensorMeta(vi.name, np.dtype(dtype), dims))
    return metas
