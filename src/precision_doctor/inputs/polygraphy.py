"""Read (and write) Polygraphy's JSON data files without importing Polygraphy.

Format, from Polygraphy's own source (NVIDIA/TensorRT tools/Polygraphy: ``polygraphy/json/
serde.py``, ``polygraphy/comparator/struct.py``) and real files (``shared/data/polygraphy``):

- an array is ``{"array": base64(np.save bytes), "polygraphy_class": "ndarray"}``; older files
  mark it with ``"__polygraphy_encoded_ndarray": "polygraphy_serialized_json_type"`` instead, and
  the oldest stored the bytes as a latin-1 string (both decoded here, as Polygraphy does);
- ``--save-inputs`` writes a list with one ``{input name: array}`` dict per iteration;
- ``--save-outputs`` writes ``RunResults``: ``{"lst": [[runner name, [IterationResult, ...]],
  ...], "polygraphy_class": "RunResults"}``, each ``IterationResult`` being ``{"outputs": {name:
  LazyNumpyArray}, "runtime": s, "runner_name": ...}`` and each ``LazyNumpyArray``
  ``{"values": array, "polygraphy_class": "LazyNumpyArray"}``.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from precision_doctor.errors import DataFormatError, OutputExistsError
from precision_doctor.inputs.feeds import Sample, check_sample
from precision_doctor.runners.base import TensorMeta

_TYPE_MARKER = "polygraphy_class"  # polygraphy.constants.TYPE_MARKER
_LEGACY_MARKER = "polygraphy_serialized_json_type"  # polygraphy.constants.LEGACY_TYPE_MARKER
_LEGACY_NDARRAY_KEY = "__polygraphy_encoded_ndarray"


def decode_array(obj: Mapping[str, Any], where: str = "JSON") -> np.ndarray:
    """Decode one Polygraphy-encoded array (``ndarray`` or a ``LazyNumpyArray`` wrapper).

    Args:
        obj: The JSON object.
        where: Location for error messages (file and key).

    Returns:
        The array, with the dtype and shape stored in its .npy header.

    Raises:
        DataFormatError: Not an encoded array, bad base64, or unreadable .npy bytes.
    """
    if "values" in obj and "array" not in obj:  # LazyNumpyArray (any version)
        inner = obj["values"]
        if not isinstance(inner, Mapping):
            raise DataFormatError(f"{where}: 'values' is not an encoded array")
        return decode_array(inner, where)
    text = obj.get("array")
    if not isinstance(text, str):
        kind = obj.get(_TYPE_MARKER, "a plain object")
        raise DataFormatError(f"{where}: expected a Polygraphy-encoded array, found {kind}")
    try:
        data = base64.b64decode(text.encode(), validate=True)
    except (binascii.Error, ValueError):
        data = text.encode("latin-1", errors="replace")  # Polygraphy's backwards-compatible mode
    try:
        loaded = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise DataFormatError(f"{where}: the encoded array is not readable .npy data ({exc})"
                              ) from exc
    if isinstance(loaded, np.ndarray):
        return loaded
    with loaded:  # a legacy .npz payload: Polygraphy takes its first array
        return loaded[loaded.files[0]]


def _is_encoded(obj: Any) -> bool:
    return isinstance(obj, Mapping) and (
        "array" in obj or _LEGACY_NDARRAY_KEY in obj
        or obj.get(_TYPE_MARKER) in ("ndarray", "LazyNumpyArray", "LazyArray"))


def _read_json(path: str | Path) -> Any:
    p = Path(path)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise DataFormatError(f"JSON file not found: {p}", file=str(p)) from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataFormatError(f"{p}: not valid JSON ({exc})", file=str(p)) from exc


def _decode_feed_dict(obj: Any, where: str) -> dict[str, np.ndarray]:
    if not isinstance(obj, Mapping):
        raise DataFormatError(f"{where}: expected {{input name: array}}, found "
                              f"{type(obj).__name__}")
    out = {}
    for name, value in obj.items():
        if name == _TYPE_MARKER:
            continue
        if not _is_encoded(value):
            raise DataFormatError(f"{where}[{name!r}]: not a Polygraphy-encoded array")
        out[name] = decode_array(value, f"{where}[{name!r}]")
    return out


def read_polygraphy_inputs(path: str | Path) -> list[dict[str, np.ndarray]]:
    """Decode a ``polygraphy run --save-inputs`` file: one feed dict per iteration.

    Raises:
        DataFormatError: Not JSON, not in this format (e.g. an outputs file), or bad arrays.
    """
    p = Path(path)
    data = _read_json(p)
    if isinstance(data, Mapping) and "lst" in data:
        raise DataFormatError(
            f"{p} holds Polygraphy *outputs* (RunResults from --save-outputs), not inputs; "
            "use load_polygraphy_outputs for it", file=str(p))
    iterations = [data] if isinstance(data, Mapping) else data
    if not isinstance(iterations, list):
        raise DataFormatError(f"{p}: expected a list of feed dicts (polygraphy --save-inputs)",
                              file=str(p))
    return [_decode_feed_dict(it, f"{p.name}[{i}]") for i, it in enumerate(iterations)]


def load_polygraphy_inputs(path: str | Path, inputs: Sequence[TensorMeta]) -> list[Sample]:
    """Samples from a ``--save-inputs`` JSON file, one per iteration (``input.json[i]``).

    Raises:
        DataFormatError: Unreadable file.
        InputNameError / InputShapeError: Feeds do not fit the model inputs.
    """
    p = Path(path)
    return [check_sample(f"{p.name}[{i}]", feeds, inputs, file=str(p))
            for i, feeds in enumerate(read_polygraphy_inputs(p))]


def load_polygraphy_outputs(path: str | Path) -> dict[str, list[dict[str, np.ndarray]]]:
    """Decode a ``polygraphy run --save-outputs`` file (``RunResults``).

    Args:
        path: The JSON file.

    Returns:
        Runner name -> one ``{output name: array}`` dict per iteration, in file order. A runner
        name that repeats (RunResults allows it) gets a ``#2``, ``#3``... suffix.

    Raises:
        DataFormatError: Not JSON or not a RunResults file.
    """
    p = Path(path)
    data = _read_json(p)
    if not isinstance(data, Mapping) or not isinstance(data.get("lst"), list):
        raise DataFormatError(
            f"{p}: not a Polygraphy outputs file (expected {{\"lst\": [[runner, [iteration, "
            "...]], ...]}} as written by --save-outputs)", file=str(p))
    results: dict[str, list[dict[str, np.ndarray]]] = {}
    for index, entry in enumerate(data["lst"]):
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], list)):
            raise DataFormatError(f"{p}: lst[{index}] is not [runner name, [iterations]]",
                                  file=str(p))
        runner = str(entry[0])
        key, n = runner, 2
        while key in results:
            key, n = f"{runner}#{n}", n + 1
        iterations = []
        for it_index, iteration in enumerate(entry[1]):
            where = f"{p.name}: runner {runner!r} iteration {it_index}"
            if not isinstance(iteration, Mapping) or "outputs" not in iteration:
                raise DataFormatError(f"{where}: not an IterationResult", file=str(p))
            iterations.append(_decode_feed_dict(iteration["outputs"], where))
        results[key] = iterations
    return results


def encode_array(arr: np.ndarray) -> dict[str, str]:
    """Polygraphy's encoding of one array (``np.save`` bytes, base64)."""
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(arr), allow_pickle=False)
    return {"array": base64.b64encode(buffer.getvalue()).decode(), _TYPE_MARKER: "ndarray"}


def save_polygraphy_inputs(samples: Sequence[Sample], path: str | Path,
                           overwrite: bool = False) -> Path:
    """Write samples as a ``--save-inputs`` file, for ``polygraphy run --load-inputs``.

    Args:
        samples: One iteration per sample.
        path: Output JSON path.
        overwrite: Replace an existing file.

    Returns:
        The path written.

    Raises:
        OutputExistsError: The file exists and ``overwrite`` is False.
    """
    p = Path(path)
    if p.exists() and not overwrite:
        raise OutputExistsError(f"{p} exists; pass overwrite=True (--force) to replace it",
                                file=str(p))
    data = [{name: encode_array(arr) for name, arr in s.feeds.items()} for s in samples]
    p.write_text(json.dumps(data, indent=4), encoding="utf-8")
    return p
