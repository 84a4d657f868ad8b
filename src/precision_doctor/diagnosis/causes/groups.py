"""Findings grouped by mechanism and pattern: one entry for a cause repeated in every block.

An encoder of N blocks that overflows at the same op of every block yields N findings of one
kind whose node names differ only by the block index (``/encoder/layers.3/self_attn/Pow``,
``/encoder/layers.4/self_attn/Pow``). A reader wants that once: "Pow ``layers.*/self_attn/Pow``
overflows in blocks 2-7, up to 9.0e8; together 99% of the error".

Rule (pure, deterministic): two findings belong to one group when they have the same ``kind``
and ``op_type`` and their node names have the same pattern, where a name's pattern is the name
with the digit runs of every path component but the last replaced (components are separated by
``/`` or ``.``). The last component must match exactly: in ``p2o.Conv.30`` or ``Conv_123`` the
trailing number is the exporter's op counter, not a block index, so such names never group.
Only the digit runs that differ between members become ``*`` in the group's ``pattern``; the
values of the first differing run are its ``blocks``. A pattern shared by one finding only is no
group (the finding stays as it is).

Findings of one kind (and mechanism) whose name patterns differ but which sit in the blocks of
one *region* form one group too: "activation-overflow in output_blocks.* in blocks 0-15 (16
nodes), 7.1e+04 to 6.2e+06" for residual branches that overflow at an Add in some blocks and
at a Conv in others. A node's region is its module path (``graph.source.node_modules``: the
exporter's ``pkg.torch.onnx.name_scopes`` metadata when present, else the path in a
TorchScript node name such as ``/output_blocks.3/output_blocks.3.0/Add``) up to its first
numeric component, that component as ``*`` (``output_blocks.*``), and the block is that
number. A region group needs members in at least two blocks and two name patterns (one
pattern is the pattern group above); names without a numeric module component (``p2o.Conv.30``)
have no region.

A joint cause (``diagnosis.causes.joint``: findings cured only together) is one group as well,
even when its members follow several patterns (shown by region where they have one); its
impact is the joint share.

Impact: the share of the worst output's error removed when every member's nodes run in FP32
together (one measurement through the caller's ``measure``, ``trials.ImpactTrials``, which
remembers node sets already measured), only for a group in the main list (some member
measured at ``MINOR_IMPACT`` or more, or unmeasured and an error) where some member's own impact
was measured, and for at most ``MAX_MEASURED`` groups.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

from precision_doctor.diagnosis.assessment import share_removed
from precision_doctor.diagnosis.causes.findings import Finding
from precision_doctor.diagnosis.causes.joint import JointCause
from precision_doctor.graph.source import module_from_name
from precision_doctor.numbers import fmt3, fmt_share

MAX_MEASURED = 8  # group measurements per diagnosis (one emulated evaluation each at most)
MAGNITUDE_KEYS = ("ref_max_abs", "value", "max_abs", "dev_max")  # first present is the size
_SPLIT = re.compile(r"([/.])")
_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True)
class FindingGroup:
    """Findings of one kind and op type whose nodes differ only by block indices.

    Attributes:
        kind: The members' finding kind (a joint cause of several kinds: ``joint-cause``).
        op_type: The members' op type ("" when they differ).
        pattern: The node name with the varying block indices as ``*``
            (``/encoder/layers.*/self_attn/Pow``; a joint cause of several patterns joins them
            with `` + ``).
        blocks: The block indices, ascending (empty when no index varies).
        members: The members' node names, in the findings' order.
        magnitude: ``(min, max)`` of the members' FP32 magnitudes (evidence ``ref_max_abs`` or
            the first of ``MAGNITUDE_KEYS``), or None when none carries one.
        impact: Share (0..1) of the worst output's error removed by all members' nodes in FP32
            together, or None when not measured.
        remedy: The first member's remedy.
        severity: The most severe member's severity.
        group: ``main`` when any member is in the main group, else ``minor``.
        joint: Whether the group is a joint cause (its members cure the error only together).
        not_measured: Why ``impact`` is None, else "".
    """

    kind: str
    op_type: str
    pattern: str
    blocks: tuple[int, ...]
    members: tuple[str, ...]
    magnitude: tuple[float, float] | None
    impact: float | None
    remedy: str
    severity: str = "warning"
    group: str = "main"
    joint: bool = False
    not_measured: str = ""

    def blocks_text(self) -> str:
        """The blocks as ranges: ``(0, 1, 2, 5)`` -> ``"0-2, 5"``."""
        return block_ranges(self.blocks)

    def describe(self, pattern: str | None = None) -> str:
        """"Pow b*/pow in blocks 3-7 (5 nodes), 1.09e+05 to 4.35e+05; together 99% of the
        error" (``pattern``: the name pattern as shown, e.g. shortened; default ``pattern``)."""
        where = " ".join(x for x in (self.op_type, pattern or self.pattern) if x)
        blocks = f" in blocks {self.blocks_text()}" if self.blocks else ""
        size = ""
        if self.magnitude is not None:
            lo, hi = self.magnitude
            size = (f", up to {fmt3(hi)}" if fmt3(lo) == fmt3(hi) or lo <= 0
                    else f", {fmt3(lo)} to {fmt3(hi)}")
        impact = ("" if self.impact is None
                  else f"; together {fmt_share(self.impact)} of the error"
                  + (" (a joint cause: each alone leaves the output destroyed)"
                     if self.joint else ""))
        return f"{where}{blocks} ({len(self.members)} nodes){size}{impact}"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "op_type": self.op_type, "pattern": self.pattern,
                "blocks": list(self.blocks), "members": list(self.members),
                "magnitude": list(self.magnitude) if self.magnitude is not None else None,
                "impact": self.impact, "remedy": self.remedy, "severity": self.severity,
                "group": self.group, "joint": self.joint,
                **({"not_measured": self.not_measured} if self.not_measured else {})}

    @classmethod
    def from_dict(cls, d: Mapping) -> FindingGroup:
        mag = d.get("magnitude")
        return cls(d["kind"], d.get("op_type", ""), d["pattern"],
                   tuple(int(b) for b in d.get("blocks", ())), tuple(d.get("members", ())),
                   (float(mag[0]), float(mag[1])) if mag else None, d.get("impact"),
                   d.get("remedy", ""), d.get("severity", "warning"), d.get("group", "main"),
                   bool(d.get("joint", False)), d.get("not_measured", ""))


def block_ranges(blocks: Sequence[int]) -> str:
    """Ascending integers as ranges: ``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"``."""
    out: list[str] = []
    values = sorted(set(blocks))
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ", ".join(out)


def name_pattern(name: str) -> tuple[str, tuple[int, ...]]:
    """``name`` with the digit runs of every component but the last as ``*``, and their
    values: ``/encoder/layers.3/self_attn/Pow`` -> (``/encoder/layers.*/self_attn/Pow``,
    ``(3,)``); ``p2o.Conv.30`` -> (``p*o.Conv.30``, ``(2,)``)."""
    parts = _SPLIT.split(name)
    values: list[int] = []
    for i in range(0, len(parts) - 1, 2):  # even indices are components; the last is kept
        values += [int(m) for m in _DIGITS.findall(parts[i])]
        parts[i] = _DIGITS.sub("*", parts[i])
    return "".join(parts), tuple(values)


def _concrete(pattern: str, runs: Sequence[tuple[int, ...]]) -> tuple[str, tuple[int, ...]]:
    """The pattern with the runs equal in every member written back, and the values of the
    first run that varies (the blocks)."""
    varying = [len({r[k] for r in runs}) > 1 for k in range(len(runs[0]))]
    pieces = pattern.split("*")
    text = pieces[0]
    for k, piece in enumerate(pieces[1:]):
        text += ("*" if varying[k] else str(runs[0][k])) + piece
    first = next((k for k, v in enumerate(varying) if v), None)
    blocks = tuple(sorted({r[first] for r in runs})) if first is not None else ()
    return text, blocks


def _magnitude(findings: Sequence[Finding]) -> tuple[float, float] | None:
    sizes = []
    for f in findings:
        v = next((f.evidence[k] for k in MAGNITUDE_KEYS if k in f.evidence), None)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            sizes.append(abs(float(v)))
    return (min(sizes), max(sizes)) if sizes else None


def region_of(module: str | None) -> tuple[str, int] | None:
    """A module path's region and block: ``output_blocks.3.output_blocks.3.0`` ->
    (``output_blocks.*``, 3); ``encoder.layers.3.self_attn`` -> (``encoder.layers.*``, 3);
    None without a numeric component (or without a module)."""
    parts = (module or "").split(".")
    k = next((i for i, part in enumerate(parts) if part.isdigit()), None)
    if k is None or k == 0:
        return None
    return ".".join(parts[:k]) + ".*", int(parts[k])


def _regions(findings: Sequence[Finding], modules: Mapping[str, str | None] | None
             ) -> dict[str, tuple[str, int] | None]:
    """Node -> its region and block (module docstring); names alone when ``modules`` lacks
    the node."""
    out = {}
    for f in findings:
        module = modules.get(f.node) if modules is not None else None
        out[f.node] = region_of(module if module is not None else module_from_name(f.node))
    return out


def _label(place: str, blocks: Sequence[int | None]) -> str:
    """A place of a group's members as shown: a region with its blocks (``input_blocks.*
    (0-7)``, ``middle_block.0`` for one), or a module or node name with its count."""
    numeric = sorted({b for b in blocks if b is not None})
    if len(numeric) > 1:
        return f"{place} ({block_ranges(numeric)})"
    if numeric:
        return place[:-1] + str(numeric[0])
    return f"{place} ({len(blocks)})" if len(blocks) > 1 else place


def _make(members: Sequence[Finding], joint_share: float | None = None,
          regions: Mapping[str, tuple[str, int] | None] | None = None,
          by_region: bool = False, modules: Mapping[str, str] | None = None
          ) -> FindingGroup:
    """The group of ``members``: by name pattern, or (``by_region``, and for a joint cause
    where some members have one) by region; a joint cause's members without a region by
    their module path (``modules``), else their name."""
    regions, modules = regions or {}, modules or {}
    patterns: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
    for f in members:
        p, runs = name_pattern(f.node)
        patterns.setdefault(p, []).append((f.node, runs))
    texts: list[str] = []
    blocks: set[int] = set()
    if (by_region or joint_share is not None) and len(patterns) > 1 \
            and any(regions.get(f.node) for f in members):
        named: dict[str, list[int | None]] = {}
        for f in members:
            where = regions.get(f.node)
            place, block = where if where else (modules.get(f.node) or f.node, None)
            named.setdefault(place, []).append(block)
        only = next(iter(named.items())) if len(named) == 1 else None
        if only is not None and None not in only[1]:  # one region: its blocks are the group's
            texts, blocks = [only[0]], {b for b in only[1] if b is not None}
        else:  # several: each with its own blocks ("input_blocks.* (0-7)")
            texts = [_label(p, b) for p, b in named.items()]
    else:
        for p, pairs in patterns.items():
            if len(pairs) == 1:  # one member of this pattern: its own name
                texts.append(pairs[0][0])
                continue
            text, b = _concrete(p, [runs for _, runs in pairs])
            texts.append(text)
            blocks.update(b)
    kinds = {f.kind for f in members}
    ops = {f.op_type for f in members}
    severity = min((f.severity for f in members),
                   key=lambda s: {"error": 0, "warning": 1}.get(s, 2))
    remedy = members[0].remedy
    if joint_share is not None:
        cure = len(dict.fromkeys(n for f in members for n in f.nodes))
        remedy = (f"keep the cures of all {len(members)} together in FP32 ({cure} nodes; each "
                  "alone leaves the output destroyed), or rescale where the values grow; "
                  "`precision-doctor fix` writes the cured model")
    return FindingGroup(
        kind=members[0].kind if len(kinds) == 1 else "joint-cause",
        op_type=members[0].op_type if len(ops) == 1 else "", pattern=" + ".join(texts),
        blocks=tuple(sorted(blocks)), members=tuple(f.node for f in members),
        magnitude=_magnitude(members), impact=joint_share, remedy=remedy,
        severity=severity, group="main" if any(f.group == "main" for f in members) else "minor",
        joint=joint_share is not None)


def _buckets(findings: Sequence[Finding], regions: Mapping[str, tuple[str, int] | None]
             ) -> list[tuple[list[Finding], bool]]:
    """The findings of no joint cause in groups of at least two: ``(members, by_region)``; a
    region bucket whose members share one pattern or one block splits into pattern buckets."""
    by_key: dict[tuple, list[Finding]] = {}
    for f in findings:
        where = regions.get(f.node)
        mechanism = str(f.evidence.get("mechanism", f.kind))
        key = (f.kind, mechanism, "region", where[0]) if where else \
            (f.kind, f.op_type, "pattern", name_pattern(f.node)[0])
        by_key.setdefault(key, []).append(f)
    out: list[tuple[list[Finding], bool]] = []
    for key, members in by_key.items():
        spread = key[2] == "region" and len({_block(regions, f.node) for f in members}) > 1
        patterns = {name_pattern(f.node)[0] for f in members}
        if key[2] == "region" and spread and len(patterns) > 1:
            out.append((members, True))
            continue
        split: dict[tuple[str, str], list[Finding]] = {}
        for f in members:
            split.setdefault((f.op_type, name_pattern(f.node)[0]), []).append(f)
        out += [(m, False) for m in split.values() if len(m) >= 2]
    return [(m, r) for m, r in out if len(m) >= 2]


def _block(regions: Mapping[str, tuple[str, int] | None], node: str) -> int | None:
    where = regions.get(node)
    return where[1] if where else None


def pattern_groups(findings: Sequence[Finding],
                   measure: Callable[[Sequence[str]], float] | None = None,
                   baseline: float = 0.0, joint: JointCause | None = None,
                   modules: Mapping[str, str | None] | None = None
                   ) -> tuple[FindingGroup, ...]:
    """The groups of ``findings`` (see the module docstring), in the order of their first
    member.

    Args:
        findings: Ranked findings.
        measure: Output error (rel L2) with the given nodes in FP32 (``trials.ImpactTrials``);
            None: impacts are not measured (a joint cause keeps its measured share).
        baseline: The candidate's output error as is (rel L2; may be inf).
        joint: The joint cause among ``findings`` (``diagnosis.causes.joint``), or None.
        modules: Node -> module path (``graph.source.node_modules``); None: from the names.

    Returns:
        The groups; empty when no two findings share a pattern or a region and there is no
        joint cause.
    """
    in_joint = set(joint.members) if joint is not None else set()
    regions = _regions(findings, modules)
    rest: list[Finding] = []
    joint_members: list[Finding] = []
    for f in findings:
        if joint is not None and ((f.kind, f.node) in in_joint or "joint_cause" in f.evidence):
            joint_members.append(f)
        else:
            rest.append(f)
    made: list[tuple[int, FindingGroup]] = []
    order = {id(f): i for i, f in enumerate(findings)}
    if joint is not None and len(joint_members) > 1:
        paths = {f.node: (modules.get(f.node) if modules is not None else None)
                 or module_from_name(f.node) or "" for f in joint_members}
        made.append((order[id(joint_members[0])],
                     _make(joint_members, joint.share, regions, modules=paths)))
    budget = MAX_MEASURED
    for members, by_region in _buckets(rest, regions):
        group = _make(members, None, regions, by_region)
        nodes = list(dict.fromkeys(n for f in members for n in f.nodes))
        timely = measure is None or getattr(measure, "affordable", lambda _: True)(nodes)
        if (measure is not None and baseline > 0 and budget > 0 and group.group == "main"
                and any(f.impact is not None for f in members) and timely):
            budget -= 1
            group = replace(group, impact=share_removed(baseline, measure(nodes)))
        else:
            group = replace(group, not_measured=_why(group, members, measure is not None
                                                     and baseline > 0, budget, timely))
        made.append((order[id(members[0])], group))
    return tuple(g for _, g in sorted(made, key=lambda x: x[0]))


def _why(group: FindingGroup, members: Sequence[Finding], measuring: bool, budget: int,
         timely: bool = True) -> str:
    """Why a group's joint impact was not measured."""
    reason = next((f.not_measured for f in members if f.not_measured), "")
    if not measuring:
        return reason or "impacts are not measured in this diagnosis"
    if group.group != "main":
        measured = sum(f.impact is not None for f in members)
        if measured == len(members):
            return "a minor group: every member's own cure measured below 1%"
        if measured:
            return (f"a minor group: {measured} of {len(members)} members measured below 1% "
                    f"alone, the others not ({reason or 'unmeasured warnings'})")
        return reason or "a minor group of unmeasured warnings"
    if budget <= 0:
        return f"beyond the first {MAX_MEASURED} groups measured jointly"
    if not timely and group.group == "main":
        return "the findings' wall-time budget ran out before this group"
    return reason or "no member's own cure was measured"


def entries(findings: Sequence[Finding], groups: Sequence[FindingGroup]
            ) -> list[Finding | FindingGroup]:
    """What a report lists, in the findings' order: each group once, at its first member among
    ``findings``, in place of its members; the findings of no group as they are. A group with
    fewer than two members left in ``findings`` (a review removed the others) is not used.
    Without ``groups`` (a report written before groups existed), they are formed from the
    findings' names, without impacts."""
    groups = groups or pattern_groups(findings)
    present = {f.node for f in findings}
    by_node: dict[str, FindingGroup] = {}
    for g in groups:
        if sum(m in present for m in g.members) >= 2:
            for m in g.members:
                by_node.setdefault(m, g)
    out: list[Finding | FindingGroup] = []
    shown: set[int] = set()
    for f in findings:
        group = by_node.get(f.node)
        if group is None or (not group.joint and group.kind != f.kind):
            out.append(f)
        elif id(group) not in shown:
            shown.add(id(group))
            out.append(group)
    return out


__all__ = ["FindingGroup", "block_ranges", "entries", "name_pattern", "pattern_groups",
           "region_of"]
