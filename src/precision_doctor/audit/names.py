"""ONNX node names hidden in TensorRT layer names and ``Metadata``.

Three sources, from most to least exact:

* ``Metadata`` (TensorRT >= 8.6): ``[ONNX Layer: NAME]`` entries separated by ``\\x1e`` (TensorRT
  8.6 and 10 classic layers) or ``\\x1f`` (TensorRT 10 Myelin kernels).
* ``{ForeignNode[FIRST...LAST]}``: a Myelin region names only the TensorRT layers at its two
  ends; each end may itself be a ``" + "``-joined list of fused layer names.
* The layer name: TensorRT joins the layers it fuses with ``" + "`` (vertical fusion) or
  ``" || "`` (horizontal fusion) and wraps point-wise fusions in ``PWN(...)``.
"""

from __future__ import annotations

import re

METADATA_SEPARATORS = ("\x1e", "\x1f")
_ONNX_LAYER = re.compile(r"^\[ONNX Layer: (.*)\]$", re.DOTALL)
_FOREIGN = re.compile(r"\{ForeignNode\[(.*)\]\}", re.DOTALL)
_UNNAMED = re.compile(r"^\(Unnamed Layer\* ?\d+\)( \[[^\]]*\])?$")
_PROFILE = re.compile(r" ?\[profile +\d+\]$")
_GENERATED = re.compile(r"^(Reformatting CopyNode for|Reformatted (Input|Output) Tensor|"
                        r"dummy_shape_call|__myl_|__mye)")
# TensorRT 10 Myelin kernel names end in _myl<graph>_<kernel>.
MYELIN_KERNEL = re.compile(r"_myl(\d+)_(\d+)$")


def split_metadata(metadata: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """ONNX node names from a layer's ``Metadata`` string.

    Args:
        metadata: E.g. ``"[ONNX Layer: /conv/Conv]\\x1e[ONNX Layer: /act/Relu]"``.

    Returns:
        ``(node_names, unrecognised_entries)``; empty entries (a trailing separator) are dropped.
    """
    text = metadata
    for sep in METADATA_SEPARATORS[1:]:
        text = text.replace(sep, METADATA_SEPARATORS[0])
    names: list[str] = []
    other: list[str] = []
    for entry in text.split(METADATA_SEPARATORS[0]):
        entry = entry.strip()
        if not entry:
            continue
        match = _ONNX_LAYER.match(entry)
        (names if match else other).append(match.group(1) if match else entry)
    return tuple(dict.fromkeys(names)), tuple(other)


def _unwrap_pwn(part: str) -> list[str]:
    """``PWN(PWN(a), b)`` -> ``[a, b]``; anything else -> ``[part]``."""
    part = part.strip()
    if not (part.startswith("PWN(") and part.endswith(")")):
        return [part]
    inner = part[4:-1]
    out: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(inner):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            out.extend(_unwrap_pwn(inner[start:i]))
            start = i + 1
    out.extend(_unwrap_pwn(inner[start:]))
    return out


def split_layer_name(name: str) -> tuple[str, ...]:
    """Names of the network layers a TensorRT layer name says it fused.

    ``"Conv_5 + Add_6 + Relu_7"`` -> ``("Conv_5", "Add_6", "Relu_7")``; ``PWN(...)`` is unwrapped,
    ``reshape_before_``/``reshape_after_`` prefixes and ``[profile N]`` suffixes removed, and
    names TensorRT made up (``(Unnamed Layer* 12) [Shuffle]``, reformat copies, Myelin kernel
    names) dropped. A ``{ForeignNode[...]}`` name yields its endpoint names.

    Returns:
        The names, in order, without duplicates (may be empty).
    """
    foreign = parse_foreign_node(name)
    if foreign is not None:
        return tuple(dict.fromkeys(n for n in (*foreign[0], *foreign[1]) if _is_named(n)))
    if _GENERATED.match(name.strip()):
        return ()
    base = _PROFILE.sub("", name.strip())
    parts: list[str] = []
    for chunk in re.split(r" \|\| | \+ ", base):
        for piece in _unwrap_pwn(chunk):
            piece = re.sub(r"^reshape_(before|after)_", "", piece.strip())
            piece = re.sub(r"_copy_(input|output)$", "", piece)
            if _is_named(piece):
                parts.append(piece)
    return tuple(dict.fromkeys(parts))


def _is_named(piece: str) -> bool:
    return bool(piece) and not _UNNAMED.match(piece) and not _GENERATED.match(piece)


def parse_foreign_node(name: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """Endpoints of a Myelin region named ``{ForeignNode[FIRST...LAST]}``.

    Args:
        name: A layer name; only a name that starts with ``{ForeignNode[`` is a region (a
            reformat named "... to {ForeignNode[...]}" is not). TensorRT 8.6 example:
            ``{ForeignNode[input_blocks.1.1.transformer_blocks.0.norm1.weight + (Unnamed
            Layer* 109) [Shuffle].../input_blocks.1/input_blocks.1.1/Reshape_3]}``.

    Returns:
        ``(first_names, last_names)`` (each split on ``" + "``, TensorRT-generated names kept so
        that nothing is hidden), or None when ``name`` is not a ForeignNode name. A region of a
        single layer has no ``...``; then ``last`` equals ``first``.
    """
    match = _FOREIGN.match(name.strip())
    if not match:
        return None
    body = match.group(1)
    first, sep, last = body.partition("...")
    split = lambda s: tuple(p.strip() for p in s.split(" + ") if p.strip())  # noqa: E731
    return (split(first), split(last)) if sep else (split(first), split(first))


def myelin_graph_id(name: str) -> str | None:
    """``"__myl_Add_myl16_0"`` -> ``"myl16"`` (TensorRT 10 Myelin graph of a kernel), else None."""
    match = MYELIN_KERNEL.search(name)
    return f"myl{match.group(1)}" if match else None


def has_profile_suffix(name: str) -> bool:
    """True for layers of a second or later optimization profile (``[profile N]`` suffix)."""
    return bool(_PROFILE.search(name))
