"""Where an ONNX node came from in the PyTorch source: file, line, code and module path.

PyTorch's dynamo exporter (``torch.onnx.export(..., dynamo=True)``) writes, on every node it
makes, ``metadata_props``:

- ``pkg.torch.onnx.stack_trace``: the Python stack of the call, outermost frame first
  (``File "/x/model.py", line 12, in forward\\n    return self.stats(h)``); the innermost
  frame outside torch's own files is the line a user wrote (or a library such as transformers);
- ``pkg.torch.onnx.name_scopes``: the module path, one entry per module, ending with the op's
  own name: ``['', 'stats', 'mul']`` is module ``stats``; newer exporters write each entry as
  the full path (``['', 'encoder', 'encoder.layer.0', ..., 'linear']``);
- ``pkg.torch.onnx.class_hierarchy``: the module classes along that path, then the op.

The TorchScript exporter (``dynamo=False``) keeps only the module path, in node names:
``/encoder/layer.3/attention/self/MatMul_1`` is module ``encoder.layer.3.attention.self``.

Everything here is a pure function of the model's nodes; nothing imports torch.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Iterable, Mapping

import onnx

STACK_TRACE = "pkg.torch.onnx.stack_trace"
NAME_SCOPES = "pkg.torch.onnx.name_scopes"
CLASS_HIERARCHY = "pkg.torch.onnx.class_hierarchy"

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>.*))?$')
_CARETS = re.compile(r"^[\s^~]+$")


@dataclass(frozen=True)
class Source:
    """The Python line and module an ONNX node was exported from.

    Attributes:
        file: The source file of the innermost frame outside torch (absolute path as the
            exporter recorded it), or None when only the module path is known (TorchScript).
        line: Its 1-based line number, or None.
        code: That line's code, stripped (its first line only for a call spanning several),
            or None.
        module: The module path in the exported module (``encoder.layer.3.attention.self``;
            ``""`` for the top-level module itself), or None when unknown.
    """

    file: str | None = None
    line: int | None = None
    code: str | None = None
    module: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """``{"file", "line", "code", "module"}`` (None where unknown)."""
        return {"file": self.file, "line": self.line, "code": self.code, "module": self.module}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Source:
        """The ``Source`` of ``to_dict``'s JSON.

        Raises:
            ValueError: ``line`` is neither None nor an integer.
        """
        line = data.get("line")
        if line is not None and (isinstance(line, bool) or int(line) != line):
            raise ValueError(f"source line must be an integer, got {line!r}")
        return cls(data.get("file"), None if line is None else int(line), data.get("code"),
                   data.get("module"))

    def location(self) -> str:
        """``model.py:12`` (the file's name and line), or ``""`` without a file."""
        if self.file is None:
            return ""
        name = PurePath(self.file).name
        return f"{name}:{self.line}" if self.line is not None else name

    def at(self) -> str:
        """A suffix for a line that names a node: ``at model.py:12 (stats)``, ``(module
        encoder.layer.3)`` without a file, ``""`` when nothing is known."""
        module = self.module or ("top level" if self.module == "" else "")
        if self.file is None:
            return f"(module {module})" if module else ""
        return f"at {self.location()}" + (f" ({module})" if module else "")

    def describe(self) -> str:
        """One line for a report: ``model.py:12 stats: return (h * h).mean(-1)``."""
        parts = [self.location(), self.module or ("(top-level module)" if self.module == ""
                                                  else "")]
        head = " ".join(p for p in parts if p)
        return f"{head}: {self.code}" if self.code else head


def parse_stack_trace(text: str) -> list[tuple[str, int, str | None]]:
    """The frames of a ``pkg.torch.onnx.stack_trace``, outermost first.

    Args:
        text: The exporter's text: ``File "PATH", line N, in FUNC`` lines, each followed by
            its code line (Python's traceback format).

    Returns:
        ``[(file, line, code or None)]``.
    """
    frames: list[tuple[str, int, str | None]] = []
    for row in text.splitlines():
        match = _FRAME.match(row)
        if match:
            frames.append((match["file"], int(match["line"]), None))
        elif frames and frames[-1][2] is None and row.strip() and not _CARETS.match(row):
            file, line, _ = frames[-1]
            frames[-1] = (file, line, row.strip())
    return frames


def is_torch_file(path: str) -> bool:
    """Whether ``path`` is one of torch's own files (the installed ``torch`` package).

    A file counts when a ``torch`` folder directly inside ``site-packages``/``dist-packages``
    holds it, or when it lies under the folder of the ``torch`` module this process loaded.
    Pseudo-files (``<string>``, ``<eval_with_key>.0``) count too: no user wrote them.
    """
    if path.startswith("<"):
        return True
    parts = PurePath(path).parts
    if any(parts[i] == "torch" and parts[i - 1] in ("site-packages", "dist-packages")
           for i in range(1, len(parts))):
        return True
    torch = sys.modules.get("torch")
    root = getattr(torch, "__file__", None)
    if root:
        folder = os.path.dirname(os.path.abspath(root))
        return os.path.abspath(path).startswith(folder + os.sep)
    return False


def user_frame(text: str) -> tuple[str, int, str | None] | None:
    """The innermost frame of a stack trace outside torch's files: ``(file, line, code)``."""
    return next((f for f in reversed(parse_stack_trace(text)) if not is_torch_file(f[0])), None)


def parse_list(text: str) -> list[str]:
    """A metadata value that is a Python list of strings (``"['', 'stats', 'mul']"``)."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return []
    if not isinstance(value, (list, tuple)):
        return []
    return [str(v) for v in value]


def module_from_scopes(scopes: Iterable[str]) -> str | None:
    """The module path of ``pkg.torch.onnx.name_scopes``: the entries between the root's ``''``
    and the op's own name, each either a full path or one attribute name.

    ``['', 'stats', 'mul']`` -> ``stats``; ``['', 'encoder', 'encoder.layer.0', 'linear']``
    -> ``encoder.layer.0``; ``['', 'mul']`` -> ``""`` (the top-level module); ``[]`` -> None.
    """
    entries = list(scopes)
    if not entries:
        return None
    if entries[0] == "":
        entries = entries[1:]
    path = ""
    for entry in entries[:-1]:
        if not entry:
            continue
        path = entry if not path or entry.startswith(path + ".") else f"{path}.{entry}"
    return path


def module_from_name(name: str) -> str | None:
    """The module path in a TorchScript exporter's node name.

    ``/encoder/layer.3/attention/self/MatMul_1`` -> ``encoder.layer.3.attention.self``;
    ``/Mul_1`` -> ``""`` (the top-level module); a name not of that form -> None.
    """
    if not name.startswith("/") or len(name) < 2:
        return None
    parts = name[1:].split("/")
    if any(not p for p in parts):
        return None
    return ".".join(parts[:-1])


def module_classes(node: onnx.NodeProto) -> list[str]:
    """The classes of the modules along the node's path, outermost first, without the op's own
    entry (``['__main__.Net', '__main__.Stats']``); ``[]`` without dynamo metadata."""
    props = {p.key: p.value for p in node.metadata_props}
    classes = parse_list(props.get(CLASS_HIERARCHY, ""))
    return classes[:-1]


def source_of(node: onnx.NodeProto) -> Source | None:
    """Where ``node`` came from: the dynamo exporter's metadata, else the module path in a
    TorchScript node name; None when neither says anything.

    Returns:
        A :class:`Source`; ``file``/``line``/``code`` from the innermost stack frame outside
        torch, ``module`` from the name scopes (or the node name).
    """
    props = {p.key: p.value for p in node.metadata_props}
    frame = user_frame(props[STACK_TRACE]) if STACK_TRACE in props else None
    module = module_from_scopes(parse_list(props[NAME_SCOPES])) if NAME_SCOPES in props \
        else None
    if module is None:
        module = module_from_name(node.name)
    if frame is None and module is None:
        return None
    if frame is None:
        return Source(module=module)
    return Source(frame[0], frame[1], frame[2], module)


def sources(model: onnx.ModelProto) -> dict[str, Source]:
    """Node name -> :class:`Source` for every node of the main graph that has one."""
    found = {}
    for node in model.graph.node:
        source = source_of(node)
        if source is not None:
            found[node.name] = source
    return found


def node_modules(model: onnx.ModelProto) -> dict[str, str | None]:
    """Node name -> module path (None when unknown), in graph order."""
    result: dict[str, str | None] = {}
    for node in model.graph.node:
        source = source_of(node)
        result[node.name] = source.module if source is not None else None
    return result


def inherit_metadata(model: onnx.ModelProto, origins: Mapping[str, Iterable[str]],
                     original: onnx.ModelProto) -> int:
    """Give nodes a rewrite made the exporter's metadata of the nodes they replace, in place.

    A rewrite (a fused ``LayerNormalization`` replacing ``ReduceMean ... Div``) makes nodes
    without ``metadata_props``; each new node takes those of its first origin node that has
    any, so that it still leads to the Python line and module (the first replaced node's).

    Args:
        model: The rewritten model (changed in place).
        origins: New node name -> the names of the nodes it replaced, in ``original``
            (a ``RewriteRecord``'s ``new_nodes`` and ``nodes``).
        original: The model before the rewrite.

    Returns:
        How many nodes received metadata (a node that has some already keeps its own).
    """
    before = {n.name: n for n in original.graph.node}
    given = 0
    for node in model.graph.node:
        if node.metadata_props or node.name not in origins:
            continue
        donor = next((before[o] for o in origins[node.name]
                      if o in before and before[o].metadata_props), None)
        if donor is not None:
            node.metadata_props.extend(donor.metadata_props)
            given += 1
    return given


def _pattern(path: str) -> str:
    return ".".join("*" if p.isdigit() else p for p in path.split(".")) if path else path


def in_module(module: str, pattern: str) -> bool:
    """Whether ``module`` is ``pattern`` or inside it; a ``*`` component matches any one
    component (``encoder.layer.3.output`` is in ``encoder.layer.*``; everything is in ``""``)."""
    if not pattern:
        return True
    want, have = pattern.split("."), module.split(".") if module else []
    return len(have) >= len(want) and all(w in ("*", h) for w, h in zip(want, have))


def group_by_module(selected: Iterable[str], modules: Mapping[str, str | None]
                    ) -> dict[str, list[str]]:
    """Name a set of nodes by the modules that hold them, as a person would say it: "keep
    ``time_embed`` and ``output_blocks.*.norm`` in FP32".

    Nodes are grouped by module path. Numeric components become ``*`` where several sibling
    paths share that pattern and every module of the model of that pattern holds selected
    nodes (``encoder.layer.0.output.LayerNorm`` ... ``encoder.layer.5.output.LayerNorm`` ->
    ``encoder.layer.*.output.LayerNorm``; only layers 1 and 4: both named). A group then
    rises to the outermost enclosing module all of whose nodes are selected (every node of
    ``time_embed.0``, ``time_embed.1`` and ``time_embed.2`` -> ``time_embed``).

    Args:
        selected: Node names (e.g. the nodes a plan keeps in FP32).
        modules: Node name -> module path for every node of the model (``node_modules``);
            nodes without a module path (None, or missing) are left out of the groups.

    Returns:
        Pattern -> the selected node names it holds, in the order the nodes are given; the
        groups ordered by their first node. ``""`` is the top-level module.
    """
    chosen = [n for n in dict.fromkeys(selected) if modules.get(n) is not None]
    by_path: dict[str, list[str]] = {}
    for name in chosen:
        by_path.setdefault(str(modules[name]), []).append(name)
    paths_of: dict[str, set[str]] = {}
    for path in by_path:
        paths_of.setdefault(_pattern(path), set()).add(path)
    in_model: dict[str, set[str]] = {}
    for path in {m for m in modules.values() if m is not None}:
        in_model.setdefault(_pattern(path), set()).add(path)
    picked = set(chosen)
    groups: dict[str, list[str]] = {}
    for path, names in by_path.items():
        pattern = _pattern(path)
        # `*` only where it is true: every module of the model of that pattern has such nodes
        key = pattern if 1 < len(paths_of[pattern]) == len(in_model[pattern]) else path
        groups.setdefault(_lift(key, modules, picked), []).extend(names)
    order = {name: i for i, name in enumerate(chosen)}
    ranked = sorted(groups.items(), key=lambda kv: min(order[n] for n in kv[1]))
    return {key: sorted(names, key=order.__getitem__) for key, names in ranked}


def _lift(key: str, modules: Mapping[str, str | None], picked: set[str]) -> str:
    """The outermost prefix of ``key`` whose nodes (in ``modules``) are all in ``picked``."""
    if not key:
        return key
    parts = key.split(".")
    for k in range(1, len(parts)):
        prefix = ".".join(parts[:k])
        inside = [n for n, m in modules.items() if m is not None and in_module(m, prefix)]
        if inside and all(n in picked for n in inside):
            return prefix
    return key


def select_by_module(patterns: Iterable[str], modules: Mapping[str, str | None]) -> list[str]:
    """The nodes inside any of ``patterns`` (as ``group_by_module`` writes them), in the order
    of ``modules``: the inverse of ``group_by_module``."""
    wanted = list(patterns)
    return [n for n, m in modules.items()
            if m is not None and any(in_module(m, p) for p in wanted)]
