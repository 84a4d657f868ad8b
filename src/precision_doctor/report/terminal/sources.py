"""Terminal lines that point a diagnosis at the user's Python: where a node was exported from
(``graph.source``), kept short.

A node's source is one suffix (``at net.py:6 (stats)``) or one line with the code, cut to the
console's width, so that a report of a PyTorch export keeps the 80-column, 120-line budget of
``report.terminal.diagnosis``. Causes are also named by the modules that hold them
(``graph.source.group_by_module``), which is how a PyTorch user reads a model.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from precision_doctor.diagnosis.causes.groups import FindingGroup, entries
from precision_doctor.diagnosis.report import DiagnosisReport
from precision_doctor.graph.source import (
    Source,
    group_by_module,
    in_module,
    node_modules,
    sources,
)
from precision_doctor.numbers import fmt3
from precision_doctor.repair.result import FixResult

SHOWN_MODULES = 4  # module groups named on one line (the rest counted)


def known_sources(report: DiagnosisReport) -> dict[str, Source]:
    """Node -> ``Source`` of every node the report names: its ``sources`` and its findings'."""
    found = dict(report.sources)
    found.update({f.node: f.source for f in report.findings if f.source is not None})
    return found


def suffix_at(report: DiagnosisReport, node: str | None) -> str:
    """`` at net.py:6 (stats)`` for ``node`` (leading space), or ``""`` when unknown."""
    source = known_sources(report).get(node or "")
    text = source.at() if source is not None else ""
    return f" {text}" if text else ""


def code_line(report: DiagnosisReport, node: str | None, label: str, width: int) -> str | None:
    """``  <label> at net.py:6 (stats): v = (h * h).mean(-1)`` cut to ``width`` characters
    (``...`` at the end), or None when the node's file is unknown."""
    source = known_sources(report).get(node or "")
    if source is None or source.file is None:
        return None
    line = f"  {label} {source.at()}" + (f": {source.code}" if source.code else "")
    return line if len(line) <= width else line[:max(width - 3, 0)] + "..."


def module_names(nodes: Iterable[str], modules: Mapping[str, str | None],
                 shown: int = SHOWN_MODULES) -> str:
    """``stats, encoder.layer.*.output.LayerNorm and 2 more`` for ``nodes``
    (``group_by_module``, a module inside another named one left out; ``(top level)`` for the
    top-level module's own nodes), or ``""`` when none of them has a module."""
    groups = [g or "(top level)" for g in _outermost(group_by_module(nodes, modules))]
    if not groups:
        return ""
    text = ", ".join(groups[:shown])
    return text + (f" and {len(groups) - shown} more" if len(groups) > shown else "")


def _outermost(groups: Iterable[str]) -> list[str]:
    """The groups not inside another one (``var.proj`` is said by ``var``; ``""``, the
    top-level module's own nodes, holds none)."""
    found = list(groups)
    return [g for g in found if not any(h and h != g and in_module(g, h) for h in found)]


def causes_by_module(report: DiagnosisReport) -> str | None:
    """``Causes by module: stats (1), encoder.layer.*.output.LayerNorm (6)``: the main
    findings' nodes grouped by module path, each with its count of nodes; None without
    module paths or with fewer than two main entries."""
    modules = {n: s.module for n, s in known_sources(report).items()}
    main = [e for e in entries(report.findings, report.finding_groups) if e.group == "main"]
    nodes = [m for e in main for m in (e.members if isinstance(e, FindingGroup) else [e.node])]
    groups = group_by_module(nodes, modules)
    if len(main) < 2 or not groups:  # one cause already shows its source
        return None
    parts = [f"{g or '(top level)'} ({len(names)})" for g, names in groups.items()]
    more = f" and {len(parts) - SHOWN_MODULES} more" if len(parts) > SHOWN_MODULES else ""
    return "Causes by module: " + ", ".join(parts[:SHOWN_MODULES]) + more


def fix_lines(result: FixResult, torch: Mapping[str, Any] | None = None,
              width: int = 80) -> list[str]:
    """What a fix keeps in FP32 said by module, and the PyTorch recipe of a fixed module.

    Args:
        result: The fix.
        torch: ``report["torch"]`` of ``fix(module, samples)`` (``api.pytorch_recipe``), or
            None for an ONNX model.
        width: The console's width: a code line is cut to it.

    Returns:
        ``Keep in FP32, by module: stats, encoder.layer.*.attention``, then the Python line of
        each module shown (at most ``SHOWN_MODULES``), then the recipe's modules and its
        errors under autocast beside the ONNX plan's; ``[]`` when no FP32 node has a module.
    """
    fp32 = result.plan.fp32_nodes()
    modules = node_modules(result.rewritten)
    groups = group_by_module(fp32, modules)
    lines = []
    if groups:
        lines.append("Keep in FP32, by module: " + module_names(fp32, modules))
        known = sources(result.rewritten)
        for group in _outermost(groups)[:SHOWN_MODULES]:
            names = [n for g, inside in groups.items() for n in inside
                     if g == group or (group and in_module(g, group))]
            source = next((known[n] for n in names if n in known and known[n].file), None)
            if source is not None:
                line = (f"  {group or '(top level)'} at {source.location()}: "
                        f"{source.code or ''}")
                lines.append(line if len(line) <= width else line[:max(width - 3, 0)] + "...")
    if torch:
        lines.extend(torch_lines(torch))
    return lines


def torch_lines(torch: Mapping[str, Any]) -> list[str]:
    """``report["torch"]`` in a few lines: the modules the recipe keeps in float32, the module's
    error under autocast with and without them beside the ONNX plan's emulated error, and the
    recipe's note."""
    kept = ", ".join(torch.get("fp32_modules") or ()) or "(none)"
    dtype, device = str(torch.get("autocast_dtype", "")).upper(), torch.get("device", "")
    lines = [f"PyTorch recipe (*.torch.py): keep {kept} in float32 under autocast {dtype} "
             f"({device})"]
    with_it = torch.get("autocast_rel_l2") or {}
    alone, plan = torch.get("autocast_alone_rel_l2"), torch.get("plan_rel_l2") or {}
    for name in with_it:
        lines.append(f"  {name}: rel L2 {fmt3(_f(with_it[name]))} with it, "
                     f"{fmt3(_f((alone or {}).get(name)))} without (ONNX plan "
                     f"{fmt3(_f(plan.get(name)))}, emulated)")
    if torch.get("note"):
        lines.append(f"  note: {torch['note']}")
    return lines


def autocast_lines(comparison: Mapping[str, Any] | None) -> list[str]:
    """Which of the diagnosis' causes ``torch.autocast`` already avoids and which not, by
    module (``api.autocast.AutocastComparison.to_dict``, in ``recording["autocast"]``); one
    line each, ``[]`` without a comparison."""
    if not comparison:
        return []
    by: dict[bool, dict[str, list[str]]] = {True: {}, False: {}}
    for c in comparison.get("causes", ()):
        kinds = by[bool(c.get("avoided"))].setdefault(c.get("module") or "(top level)", [])
        if c.get("kind") not in kinds:
            kinds.append(str(c.get("kind")))
    lines = []
    for avoided, label in ((False, "does not avoid"), (True, "already avoids")):
        groups = list(by[avoided].items())
        if groups:
            shown = "; ".join(f"{m} ({', '.join(k)})" for m, k in groups[:SHOWN_MODULES])
            more = f" and {len(groups) - SHOWN_MODULES} more" \
                if len(groups) > SHOWN_MODULES else ""
            lines.append(f"  autocast {label}: {shown}{more}")
    if by[False]:
        lines.append("  (not avoided: its module in float32 removes half of autocast's error)")
    return lines


def _f(value: Any) -> float | None:
    """A JSON number (``"inf"`` too) as a float; None stays None."""
    return None if value is None else float(value)


__all__ = ["autocast_lines", "causes_by_module", "code_line", "fix_lines", "known_sources",
           "module_names", "suffix_at", "torch_lines"]
