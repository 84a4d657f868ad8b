"""Per-layer times from ``trtexec --exportProfile`` and attaching them to engine layers.

The profile is a JSON list: ``[{"count": N}, {"name", "timeMs", "averageMs", "medianMs",
"percentage"}, ...]``. ``timeMs`` is the total over the ``N`` profiled inferences, ``averageMs``
the time per inference, ``percentage`` the share of the summed layer times (trtexec's own
definitions, TensorRT ``samples/common/sampleReporting.cpp``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from precision_doctor.audit.layers import load_json
from precision_doctor.audit.records import EngineLayer
from precision_doctor.errors import DataFormatError


@dataclass(frozen=True)
class LayerTime:
    """Time of one layer in the profile.

    Attributes:
        name: Layer name (as in the layer information).
        average_ms: Milliseconds per inference.
        median_ms: Median milliseconds per inference, or None.
        share: Fraction (0..1) of the summed average times of all layers.
    """

    name: str
    average_ms: float
    median_ms: float | None
    share: float


@dataclass(frozen=True)
class Profile:
    """A parsed profile.

    Attributes:
        source: File path or ``<object>``.
        count: Number of profiled inferences (``count`` record), or None.
        times: One entry per profiled layer, in file order.
        warnings: Records that could not be read.
    """

    source: str
    count: int | None
    times: tuple[LayerTime, ...]
    warnings: tuple[str, ...] = ()

    @property
    def total_ms(self) -> float:
        """Sum of the layers' average times (ms per inference)."""
        return sum(t.average_ms for t in self.times)


def _num(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def read_profile(path_or_obj: str | os.PathLike | Sequence[Any]) -> Profile:
    """Parse a ``trtexec --exportProfile`` JSON file (or its parsed list).

    Args:
        path_or_obj: Path, or the list itself.

    Returns:
        The profile. ``average_ms`` falls back to ``timeMs / count`` and ``share`` to
        ``average_ms / total`` when the file lacks them.

    Raises:
        DataFormatError: Not a list of records (e.g. a layer-information file was passed).
    """
    if isinstance(path_or_obj, (str, os.PathLike)):
        source, data = str(path_or_obj), load_json(path_or_obj, "profile")
    else:
        source, data = "<object>", path_or_obj
    if isinstance(data, Mapping) and "Layers" in data:
        raise DataFormatError(f"{source} is layer information (--exportLayerInfo), not a profile "
                              "(--exportProfile).", file=source)
    if not isinstance(data, list):
        raise DataFormatError(f"{source} is not a trtexec profile: expected a JSON list "
                              '[{"count": N}, {"name": ..., "averageMs": ...}, ...].', file=source)
    # A list of lists: one profile per optimization profile / run; use the first.
    if data and all(isinstance(d, list) for d in data):
        data = data[0]
    warnings: list[str] = []
    count = None
    rows: list[tuple[str, float, float | None, float | None]] = []
    for i, rec in enumerate(data):
        if not isinstance(rec, Mapping):
            warnings.append(f"profile record #{i} is not an object; ignored")
            continue
        if "name" not in rec:
            if "count" in rec:
                count = int(_num(rec["count"]) or 0) or None
            else:
                warnings.append(f"profile record #{i} has no name; ignored")
            continue
        avg = _num(rec.get("averageMs"))
        if avg is None and _num(rec.get("timeMs")) is not None and count:
            avg = float(rec["timeMs"]) / count
        if avg is None:
            warnings.append(f"profile record {rec['name']!r} has no time; ignored")
            continue
        pct = _num(rec.get("percentage"))
        rows.append((str(rec["name"]), avg, _num(rec.get("medianMs")),
                     None if pct is None else pct / 100.0))
    total = sum(r[1] for r in rows)
    times = tuple(LayerTime(n, a, m, s if s is not None else (a / total if total else 0.0))
                  for n, a, m, s in rows)
    return Profile(source, count, times, tuple(warnings))


def _normal(name: str) -> str:
    return " ".join(name.replace("\x1e", "+").replace("\x1f", "+").split())


def attach_profile(layers: Sequence[EngineLayer], profile: Profile | str | os.PathLike |
                   Sequence[Any]) -> tuple[tuple[EngineLayer, ...], tuple[str, ...]]:
    """Set ``time_ms``/``time_share`` of every layer named in the profile.

    Names are matched exactly (then with whitespace and ``\\x1e``/``\\x1f`` normalised);
    repeated names are matched in order.

    Args:
        layers: Layers from ``parse_layer_info``.
        profile: A ``Profile``, a profile file, or its parsed list.

    Returns:
        ``(layers, warnings)``: new layer records, and what did not match.
    """
    prof = profile if isinstance(profile, Profile) else read_profile(profile)
    queues: dict[str, list[LayerTime]] = {}
    for t in prof.times:
        queues.setdefault(t.name, []).append(t)
        if _normal(t.name) != t.name:
            queues.setdefault(_normal(t.name), []).append(t)
    used: set[int] = set()
    out: list[EngineLayer] = []
    for layer in layers:
        hit = None
        for key in (layer.name, _normal(layer.name)):
            queue = [t for t in queues.get(key, ()) if id(t) not in used]
            if queue:
                hit = queue[0]
                break
        if hit is None:
            out.append(layer)
            continue
        used.add(id(hit))
        out.append(replace(layer, time_ms=hit.average_ms, time_share=hit.share))
    warnings = list(prof.warnings)
    unmatched = [t for t in prof.times if id(t) not in used]
    missing = sum(1 for layer in out if layer.time_ms is None)
    if unmatched:
        share = sum(t.share for t in unmatched)
        warnings.append(
            f"{len(unmatched)} profile entries ({share:.1%} of the time) name no layer of the "
            f"layer information, e.g. {unmatched[0].name!r}")
    if layers and missing > len(layers) / 2:
        warnings.append(f"{missing} of {len(layers)} layers have no time: the profile may come "
                        "from a different build than the layer information")
    return tuple(out), tuple(warnings)
