"""Read a trtexec / Polygraphy ``--verbose`` build log: the precision-relevant lines.

What is extracted (message texts from real logs: TensorRT 8.6.1 via Polygraphy 0.47.1 in
``shared/data/polygraphy``, and those quoted in NVIDIA/TensorRT issues #3748, #4493, #3162, #1262
and NVIDIA/TensorRT-LLM#1544):

- TensorRT version (Polygraphy ``Loaded Module: tensorrt | Version: 8.6.1``, trtexec
  ``TensorRT version: 10.10.0`` or ``[TensorRT v8601]``), GPU (trtexec ``Selected Device``,
  ``Compute Capability``), the command line;
- builder settings: Polygraphy's ``Flags | [FP16, ...]``, trtexec's ``Precision: FP32+FP16``,
  ``--fp16/--bf16/--int8/--best``, TF32 (on by default in TensorRT and trtexec unless
  ``--noTF32``; off by default in Polygraphy unless ``--tf32``), strongly typed
  (``--stronglyTyped`` / ``--strongly-typed``), per-layer precision requests
  (``--layerPrecisions`` / ``--layer-precisions``, trtexec's ``LayerPrecisions:``);
- warnings: ``Detected layernorm nodes in FP16`` (with the node list on the same or the next
  line), ``Running layernorm after self-attention in FP16 may cause overflow``, weights
  converted to FP16 (subnormal, overflow, below the smallest subnormal; ``List of affected
  weights``), requested layers not found, precision requests not obeyed;
- Myelin regions (``{ForeignNode[FIRST...LAST]}``), and per-layer precisions from the
  ``Engine Layer Information`` lines (``Layer(Type): name, Tactic: t, in[Half(..)] ->
  out[Float(..)]``, or ``in (Half[..]) -> out (Float[..])``) and the graph I/O dtypes.

Names in these lines are tied to ONNX nodes when the model is given (``audit.onnx_map``).
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import onnx

from precision_doctor.audit.names import parse_foreign_node, split_layer_name
from precision_doctor.audit.onnx_map import OnnxIndex, range_region
from precision_doctor.audit.precision import parse_format
from precision_doctor.errors import DataFormatError, InputError

_PREFIX = re.compile(r"^\s*(?:&&&&\s*)?(?:\[(?:[0-9/:.,\- ]+|[IWVEF]|TRT|TensorRT)\]\s*)*")
_SEVERITY = re.compile(r"\[([IWVEF])\]")
# (kind, pattern); the first match of a line wins. Kinds flagged for the user are in FLAGGED.
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple((k, re.compile(p, re.I)) for k, p in (
    ("layernorm-fp16", r"Detected layernorm nodes in FP16[.:]?\s*(?P<names>.*)$"),
    ("layernorm-overflow", r"Running layernorm after self-attention.*overflow"),
    ("weights-fp16", r"(weights are affected by this issue|subnormal FP16 values|would "
                     r"overflow in FP16|smallest positive FP16 subnormal|converting weights "
                     r"between types)"),
    ("weights-list", r"List of affected weights:\s*(?P<names>.+)$"),
    ("precision-unmatched", r"following layers were not found in the network:\s*(?P<names>.+)"),
    ("precision-not-obeyed", r"precision.*(ignor|not (be )?obey|could not|cannot be honou?r)"),
    ("precision-request", r"^LayerPrecisions:\s*(?P<names>\S.*)$"),
    ("layer-precision", r"Layer\((?P<type>\w+)\):\s*(?P<name>.+?),\s*Tactic:\s*[^,]+,"
                        r"\s*(?P<ins>.*?)\s*->\s*(?P<outs>.*)$"),
    ("myelin-region", r"\{ForeignNode\[|\bMyelin\b"),
    ("io-dtype", r"(Input tensor:\s*(?P<in>\S+)\s*\(dtype=DataType\.(?P<indt>\w+)|^\{?\s*"
                 r"(?P<out>[^\s\[{]+) \[dtype=(?P<outdt>\w+), shape=)"),
    ("fp32-forced", r"\b(forc\w*|fall\w* back|keep\w*)\b.*\b(fp32|float32|DataType\.FLOAT)\b"),
    ("tf32", r"\bTF32\b"),
))
FLAGGED = frozenset({"layernorm-fp16", "layernorm-overflow", "weights-fp16",
                     "precision-unmatched", "precision-not-obeyed"})
_DTYPE_WORD = re.compile(r"\b(Float|Half|BFloat16|Int8|Int32|Int64|FP8|Bool|UInt8)\b")


@dataclass(frozen=True)
class LogEntry:
    """One precision-relevant line.

    Attributes:
        line: 1-based line number.
        kind: What it says (``layernorm-fp16``, ``layer-precision``, ``myelin-region``...).
        severity: ``I``/``W``/``V``/``E`` from the line's tag, or None.
        text: The line without its timestamp/severity prefix.
        names: Layer, tensor or weight names the line mentions.
        precision: The precision it states (``fp16``, ``fp32``...) or None.
        nodes: ONNX nodes these names resolve to (with a model), in graph order.
    """

    line: int
    kind: str
    severity: str | None
    text: str
    names: tuple[str, ...] = ()
    precision: str | None = None
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class BuildLog:
    """The precision-relevant content of one build/run log. See the module docstring.

    Attributes:
        fp16 / bf16 / int8 / tf32 / strongly_typed: Builder settings (None: not stated).
        tf32_evidence: Why ``tf32`` has its value.
        layer_precisions: Engine layer name -> precision, from the layer-information lines.
    """

    source: str
    tool: str
    tensorrt_version: str | None
    gpu: str | None
    compute_capability: str | None
    command: str | None
    flags: tuple[str, ...]
    fp16: bool | None
    bf16: bool | None
    int8: bool | None
    tf32: bool | None
    tf32_evidence: str
    strongly_typed: bool | None
    entries: tuple[LogEntry, ...]
    layer_precisions: dict[str, str] = field(default_factory=dict)

    def flagged(self) -> list[LogEntry]:
        """Entries a user should act on (LayerNorm in FP16, weights changed, requests lost)."""
        return [e for e in self.entries if e.kind in FLAGGED]

    def to_dict(self) -> dict:
        return {**asdict(self), "entries": [asdict(e) for e in self.entries]}

    @classmethod
    def from_dict(cls, d: dict) -> BuildLog:
        data = dict(d)
        data["entries"] = tuple(LogEntry(**{**e, "names": tuple(e["names"]),
                                            "nodes": tuple(e["nodes"])}) for e in d["entries"])
        data["flags"] = tuple(d["flags"])
        return cls(**data)


def is_build_log(path: str | os.PathLike) -> bool:
    """True when ``path`` is a text log rather than JSON (first non-blank char not ``{``/``[``
    or ``[`` starting a log tag such as ``[I]`` or ``[11/24/2023-...]``)."""
    with open(path, "rb") as f:
        head = f.read(4096).decode("utf-8", "replace").lstrip()
    return not head.startswith("{") and not (head.startswith("[") and not re.match(
        r"\[(?:[IWVEF]|[0-9/:.,\- ]+)\]", head))


def _version(text: str) -> str | None:
    m = re.search(r"Loaded Module: tensorrt \| Version: ([\d.]+)|TensorRT version:\s*([\d.]+)",
                  text, re.I)
    if m:
        return m.group(1) or m.group(2)
    m = re.search(r"\[TensorRT v(\d{4,})\]", text)
    if not m:
        return None
    v = m.group(1)  # 8601 -> 8.6.1, 100300 -> 10.3.0 (MAJOR*1000 + MINOR*100 + PATCH)
    return f"{int(v[:-3])}.{int(v[-3])}.{int(v[-2:])}" if len(v) == 4 else \
        f"{int(v[:-4])}.{int(v[-4:-2])}.{int(v[-2:])}"


def _command_args(command: str | None) -> list[str]:
    try:
        return shlex.split(command) if command else []
    except ValueError:
        return command.split() if command else []


def read_build_log(path: str | os.PathLike, onnx_model: onnx.ModelProto | str | os.PathLike
                   | None = None) -> BuildLog:
    """Extract the precision-relevant lines of a trtexec / Polygraphy ``--verbose`` log.

    Args:
        path: The log file (text).
        onnx_model: The ONNX model the engine was built from; ties names to ONNX nodes.

    Returns:
        ``BuildLog``.

    Raises:
        InputError: The file does not exist.
        DataFormatError: It is not a TensorRT/Polygraphy log (no line of any known kind).
        ModelLoadError: ``onnx_model`` cannot be read.
    """
    p = Path(path)
    if not p.is_file():
        raise InputError(f"build log not found: {p}", file=str(p))
    raw = p.read_text(encoding="utf-8", errors="replace").splitlines()
    index = OnnxIndex.build(onnx_model) if onnx_model is not None else None
    text = "\n".join(raw)
    command = None
    m = re.search(r"RUNNING \| Command: (.+)$|RUNNING TensorRT\.trtexec[^#]*# (.+)$", text,
                  re.M)
    if m:
        command = (m.group(1) or m.group(2)).strip()
    tool = ("polygraphy" if "polygraphy" in (command or "") or "Loaded Module: polygraphy" in
            text else "trtexec" if "trtexec" in text else "unknown")
    args = _command_args(command)
    entries: list[LogEntry] = []
    layer_precisions: dict[str, str] = {}
    seen_regions: set[str] = set()
    flags: tuple[str, ...] = ()
    for number, line in enumerate(raw, 1):
        sev = _SEVERITY.search(line[:40])
        body = _PREFIX.sub("", line).strip()
        fm = re.match(r"Flags\s*\|\s*\[(.*)\]", body) or re.match(r"Precision:\s*([\w+]+)$",
                                                                   body)
        if fm:
            flags = tuple(f.strip() for f in re.split(r"[,+]", fm.group(1)) if f.strip())
        for kind, rule in _RULES:
            hit = rule.search(body)
            if not hit:
                continue
            entry = _entry(kind, hit, number, sev.group(1) if sev else None, body, raw, index)
            if entry is None:
                break
            if kind == "myelin-region":
                if entry.text in seen_regions:
                    break
                seen_regions.add(entry.text)
            if kind == "layer-precision" and entry.precision:
                layer_precisions[entry.names[0] if entry.names else body] = entry.precision
            entries.append(entry)
            break
    if not entries and not command and _version(text) is None:
        raise DataFormatError(f"{p}: no TensorRT/Polygraphy log line found (expected a "
                              "trtexec or polygraphy run --verbose log)", file=str(p))
    upper = {f.upper() for f in flags}
    has = lambda *opts: any(a.split("=")[0] in opts for a in args)  # noqa: E731
    fp16 = True if "FP16" in upper or has("--fp16", "--best") else (False if flags else None)
    tf32, why = _tf32(tool, args, upper, text)
    strongly = True if has("--stronglyTyped", "--strongly-typed") or re.search(
        r"strongly typed\s*:\s*enabled", text, re.I) else (False if command else None)
    gpu = re.search(r"Selected Device:\s*(.+)$", text, re.M)
    cc = re.search(r"Compute Capability:\s*([\d.]+)", text)
    return BuildLog(str(p), tool, _version(text), gpu.group(1).strip() if gpu else None,
                    cc.group(1) if cc else None, command, flags, fp16,
                    True if "BF16" in upper or has("--bf16") else (False if flags else None),
                    True if "INT8" in upper or has("--int8", "--best") else (
                        False if flags else None),
                    tf32, why, strongly, tuple(entries), layer_precisions)


def _tf32(tool: str, args: Sequence[str], flags: set[str], text: str) -> tuple[bool | None, str]:
    """TF32 state: TensorRT's BuilderFlag.TF32 is on by default (trtexec disables it with
    ``--noTF32``); Polygraphy's CreateConfig defaults ``tf32=False`` (its ``--tf32`` enables)."""
    if "TF32" in flags:
        return True, "TF32 in the builder flags"
    if any(a == "--noTF32" for a in args):
        return False, "--noTF32 on the command line"
    if tool == "polygraphy":
        if any(a == "--tf32" for a in args):
            return True, "--tf32 on the command line"
        return False, "Polygraphy builds with TF32 off unless --tf32 is given"
    if tool == "trtexec" and args:
        return True, "trtexec leaves TensorRT's default TF32 on unless --noTF32 is given"
    return None, "not stated in the log"


def _entry(kind: str, hit: re.Match[str], number: int, sev: str | None, body: str,
           raw: Sequence[str], index: OnnxIndex | None) -> LogEntry | None:
    names: tuple[str, ...] = ()
    precision = None
    groups = hit.groupdict()
    if kind in ("layernorm-fp16", "weights-list", "precision-unmatched", "precision-request"):
        listed = (groups.get("names") or "").strip()
        if kind == "layernorm-fp16" and not listed and number < len(raw):
            listed = _PREFIX.sub("", raw[number]).strip()  # TRT >= 9: nodes on the next line
            listed = listed if "," in listed or "/" in listed else ""
        names = tuple(n for n in (part.strip().rstrip(".").strip(" '{}[]\"")
                                  for part in re.split(r",\s*", listed)) if n)
        if kind == "precision-request":
            names = tuple(n.rsplit(":", 1)[0] for n in names)
        precision = "fp16" if kind == "layernorm-fp16" else None
    elif kind == "layer-precision":
        names = (groups["name"].strip(),)
        out = _DTYPE_WORD.search(groups["outs"] or "")
        precision = parse_format(out.group(1)) if out else None
    elif kind == "myelin-region":
        region = re.search(r"\{ForeignNode\[[^\]]*\]\}", body)
        if region is None:
            # only warnings about Myelin: verbose logs name it in many routine lines
            return LogEntry(number, kind, sev, body) if sev == "W" else None
        parsed = parse_foreign_node(region.group(0))
        names = tuple(dict.fromkeys((*parsed[0], *parsed[1]))) if parsed else ()
        body = region.group(0)
    elif kind == "io-dtype":
        names = (groups.get("in") or groups.get("out") or "",)
        precision = parse_format(groups.get("indt") or groups.get("outdt") or "")
    elif kind == "fp32-forced":
        precision = "fp32"
    nodes = _nodes(kind, names, index) if index is not None else ()
    return LogEntry(number, kind, sev, body, names, precision, nodes)


def _nodes(kind: str, names: Sequence[str], index: OnnxIndex) -> tuple[str, ...]:
    """ONNX nodes named (or producing/consuming the tensors/weights named) in a line."""
    if kind == "myelin-region" and names:
        inside = range_region(names[:1], names[-1:], index, {})
        if inside:
            return inside
    found: set[int] = set()
    for name in names:
        for part in (name, *split_layer_name(name)):
            i = index.positions.get(part)
            if i is None:
                i = index.producer.get(part)
            if i is None and part in index.consumers:
                i = min(index.consumers[part])
            if i is not None:
                found.add(i)
                break
    return tuple(index.names[i] for i in sorted(found))


def link_to_audit(log: BuildLog, audit: Any) -> list[dict]:
    """The engine layers (from the layer-information audit) covering the nodes of flagged log
    lines, with the precision each ran in: does the engine confirm the warning?

    Args:
        log: From ``read_build_log`` with an ONNX model (entries carry nodes).
        audit: An ``AuditReport`` of the same engine.

    Returns:
        ``[{"line", "kind", "node", "layer", "precision"}]``, one per (flagged entry, node).
    """
    by_node: dict[str, Any] = {}
    for layer in audit.layers:
        for node in layer.onnx_nodes:
            by_node.setdefault(node, layer)
    for region in audit.regions:
        for node in region.onnx_nodes:
            by_node.setdefault(node, region)
    rows = []
    for entry in log.flagged():
        for node in entry.nodes:
            hit = by_node.get(node)
            rows.append({"line": entry.line, "kind": entry.kind, "node": node,
                         "layer": getattr(hit, "name", None),
                         "precision": getattr(hit, "precision", None)})
    return rows
