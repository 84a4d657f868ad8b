"""Inputs given to ``trtexec --loadInputs`` (raw binary files), as samples.

``trtexec --loadInputs=name:file.bin[,name2:file2.bin]`` reads each file as the raw bytes of
the input binding (no header: dtype and shape come from the engine; TensorRT
``samples/common/sampleUtils``/``sampleInference.cpp``). The matching data source here is

    trtexec:x:in0.bin[,mask:m0.bin][;x:in1.bin...][;shapes=x:1x3x640x640]

one ``--loadInputs`` spec per sample, separated by ``;``. dtypes are the model's; a dynamic dim
is solved from the file size when it is the only unknown dim of that input, else the shape must
be given with ``shapes=`` in trtexec's ``--shapes`` syntax.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np

from precision_doctor.errors import DataFormatError, InputError
from precision_doctor.inputs.feeds import Sample, check_sample
from precision_doctor.runners.base import TensorMeta

PREFIX = "trtexec:"


def _pairs(spec: str) -> list[tuple[str, str]]:
    """``a:x.bin,b:y.bin`` -> [(a, x.bin), (b, y.bin)]; names may hold ':' (last one splits)."""
    out = []
    for item in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, path = item.rpartition(":")
        if not sep or not name:
            raise InputError(f"trtexec input {item!r}: expected NAME:FILE as in --loadInputs")
        out.append((name, path))
    return out


def _shape(meta: TensorMeta, given: tuple[int, ...] | None, nbytes: int, path: str
           ) -> tuple[int, ...]:
    if given is not None:
        return given
    known = [d for d in meta.shape if isinstance(d, int) and d > 0]
    unknown = len(meta.shape) - len(known)
    items, rest = divmod(nbytes, np.dtype(meta.dtype).itemsize)
    if unknown == 0:
        return tuple(int(d) for d in meta.shape if d is not None)
    if unknown == 1 and not rest and known and items % math.prod(known) == 0:
        solved = items // math.prod(known)
        return tuple(int(d) if isinstance(d, int) and d > 0 else solved for d in meta.shape)
    raise InputError(f"{path}: input {meta.name!r} has dynamic dims {list(meta.shape)}; give "
                     f"its shape: ;shapes={meta.name}:1x3x640x640 (trtexec --shapes syntax)",
                     file=path, input=meta.name)


def load_trtexec_inputs(source: str, inputs: Sequence[TensorMeta]) -> list[Sample]:
    """Samples from a ``trtexec:...`` source (see the module docstring).

    Raises:
        InputError: Bad spec, unknown input name, unsolvable dynamic shape.
        DataFormatError: A file is missing or its size does not match the shape and dtype.
    """
    parts = [p.strip() for p in source[len(PREFIX):].split(";") if p.strip()]
    shapes: dict[str, tuple[int, ...]] = {}
    for p in [p for p in parts if p.startswith("shapes=")]:
        for name, dims in _pairs(p[len("shapes="):]):
            shapes[name] = tuple(int(d) for d in dims.split("x"))
    metas = {m.name: m for m in inputs}
    samples = []
    for spec in (p for p in parts if not p.startswith("shapes=")):
        feeds = {}
        for name, path in _pairs(spec):
            if name not in metas:
                raise InputError(f"trtexec input {name!r} is not an input of the model "
                                 f"({', '.join(metas)})", input=name)
            file = Path(path)
            if not file.is_file():
                raise DataFormatError(f"trtexec input file not found: {path}", file=path)
            meta = metas[name]
            raw = file.read_bytes()
            shape = _shape(meta, shapes.get(name), len(raw), path)
            need = math.prod(shape) * np.dtype(meta.dtype).itemsize
            if len(raw) != need:
                raise DataFormatError(f"{path}: {len(raw)} bytes, but {name!r} as {meta.dtype} "
                                      f"{list(shape)} needs {need}", file=path, input=name)
            feeds[name] = np.frombuffer(raw, dtype=meta.dtype).reshape(shape).copy()
        first = Path(_pairs(spec)[0][1]).name
        samples.append(check_sample(first, feeds, inputs, file=source))
    if not samples:
        raise InputError(f"{source!r}: no input files (expected trtexec:NAME:FILE.bin[;...])")
    return samples
