"""Shell commands for trtexec and Polygraphy: optimization-profile shapes, dims, quoting and
wrapping, Markdown fences. Shared by the engine recipes (``report.recipes``) and the collect
recipe (``report.collect``).

Every argument goes through ``shlex.quote``: paths, node and input names are model-derived,
untrusted strings.
"""

from __future__ import annotations

import collections
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from precision_doctor.errors import InputShapeError

WRAP = 100  # characters; a longer command is written one group per line


@dataclass(frozen=True)
class ShapeRange:
    """An optimization-profile range for one graph input: element-wise ``min``/``max`` of the
    shapes seen and, as ``opt``, the most frequent one (first seen wins ties)."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


def shape_ranges(input_shapes: Mapping[str, Sequence[Any]]) -> tuple[ShapeRange, ...]:
    """Profile ranges from ``input_shapes`` (name -> one shape, or the shapes seen in the
    calibration data). ``opt``, which TensorRT tunes kernels for, is the commonest shape seen:
    the best guess of the deployment shape.

    Raises:
        InputShapeError: A non-integer or negative dim, or shapes of different ranks.
    """
    ranges = []
    for name, value in input_shapes.items():
        seen = [value] if not value or not isinstance(value[0], (list, tuple)) else list(value)
        try:
            shapes = [tuple(int(d) for d in s) for s in seen]
            if any(isinstance(d, bool) or int(d) != d or d < 0 for s in seen for d in s):
                raise ValueError("dims must be integers >= 0")
        except (TypeError, ValueError) as exc:
            raise InputShapeError(f"input {name!r}: shapes must be lists of non-negative "
                                  f"integers, got {value!r} ({exc})", input=name) from exc
        if len(ranks := {len(s) for s in shapes}) != 1:
            raise InputShapeError(f"input {name!r}: the shapes seen have ranks {sorted(ranks)};"
                                  " one engine profile needs one rank", input=name)
        ranges.append(ShapeRange(str(name), tuple(map(min, zip(*shapes))),
                                 collections.Counter(shapes).most_common(1)[0][0],
                                 tuple(map(max, zip(*shapes)))))
    return tuple(ranges)


def with_suffix(path: str, suffix: str) -> str:
    """``path`` with ``.onnx`` replaced by ``suffix`` (appended when it is not ``.onnx``)."""
    p = Path(path)
    return str(p.with_name(p.stem + suffix)) if p.suffix == ".onnx" else path + suffix


def trtexec_shapes(ranges: Sequence[ShapeRange]) -> list[list[str]]:
    """trtexec ``--minShapes/--optShapes/--maxShapes`` argument groups (none without ranges)."""
    return [[f"--{k}Shapes=" + ",".join(f"{s.name}:{trt_dims(getattr(s, k))}" for s in ranges)]
            for k in ("min", "opt", "max")] if ranges else []


def polygraphy_shapes(ranges: Sequence[ShapeRange]) -> list[list[str]]:
    """Polygraphy ``--trt-{min,opt,max}-shapes`` argument groups (none without ranges)."""
    return [[f"--trt-{k}-shapes", *(f"{s.name}:{poly_dims(getattr(s, k))}" for s in ranges)]
            for k in ("min", "opt", "max")] if ranges else []


def trt_dims(shape: Sequence[int]) -> str:
    """trtexec dims (``1x3x224x224``); a 0-D input is ``scalar``."""
    return "x".join(map(str, shape)) if shape else "scalar"


def poly_dims(shape: Sequence[int]) -> str:
    """Polygraphy dims (``[1,3,224,224]``)."""
    return "[" + ",".join(map(str, shape)) + "]"


def shell(groups: Sequence[Sequence[Any]], comments: Sequence[str] = ()) -> str:
    """Render a command, one group of arguments per line, every piece ``shlex.quote``-d. A long
    ``(prefix, items)`` argument (one comma-joined word) continues on unindented lines
    (``'a b:fp32,'\\`` + newline): POSIX shells drop backslash-newline, joining the pieces."""
    rendered = []
    for group in groups:
        words = []
        for arg in group:
            if not isinstance(arg, tuple):
                words.append(shlex.quote(arg))
            elif len(joined := arg[0] + ",".join(arg[1])) <= WRAP:
                words.append(shlex.quote(joined))
            else:
                parts = [arg[0]] + [it + "," for it in arg[1][:-1]] + [arg[1][-1]]
                words.append("\\\n".join(shlex.quote(p) for p in parts))
        if words:
            rendered.append(" ".join(words))
    flat = " ".join(rendered)
    body = flat if len(flat) <= WRAP and "\n" not in flat else " \\\n  ".join(rendered)
    return "\n".join([*comments, body])


def fence(text: str, lang: str) -> str:
    """A Markdown code fence longer than any backtick run in ``text``."""
    ticks = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", text)), default=0))
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}"
