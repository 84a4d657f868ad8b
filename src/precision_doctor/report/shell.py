"""Shell commands and Markdown fences for the engine recipes (``report.recipes``,
``report.collect``): every model-derived word goes through ``shlex.quote``."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from typing import Any

WRAP = 100  # characters; a longer command is written one group per line


def trt_dims(shape: Sequence[int]) -> str:
    """trtexec dims ``1x3x224x224``; a 0-D input is ``scalar``."""
    return "x".join(map(str, shape)) if shape else "scalar"


def poly_dims(shape: Sequence[int]) -> str:
    """Polygraphy dims ``[1,3,224,224]``."""
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
