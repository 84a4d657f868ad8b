"""Search by regions first, then inside the regions kept: hierarchical delta debugging.

The node search (``search.bisection``) costs O(k log N) evaluations for k needed nodes. Where
range, not rounding, is the problem, k is in the hundreds: a residual stream above FP16's
65504 in every block of a diffusion UNet needs each of its producers and readers in FP32, and
complement-only ddmin over hundreds of needed nodes spends its whole budget (measured on a
one-step diffusion UNet of 1326 nodes: 150 of 150 evaluations, 369 FP32 nodes, 4.5 min on 2
cores). Here the same grow and ddmin run over *regions* (Misherghi & Su 2006, "HDD:
hierarchical delta debugging"), coarse to fine:

1. Regions are a tree: the exporter's module paths (``graph.source.node_modules``:
   ``pkg.torch.onnx.name_scopes`` metadata, or TorchScript names ``/output_blocks.3/...``),
   one level per path component, chains of one child collapsed. Its leaves are *atoms*:
   single nodes, or an overflow region (``diagnosis.causes.cures.overflow_regions``: an
   out-of-range tensor's producer and readers, which only cure together), placed at the
   innermost module holding all of its nodes. The first level opens the largest region while
   it holds more than 1/8 of the candidates (``LARGEST_SHARE``, up to ``MAX_TOP`` regions).
2. Grow: bisect for the shortest passing prefix of the top regions, ordered by their best
   ranked node (log2 R evaluations). Every candidate in FP32 is checked only when no shorter
   prefix passes, exactly as the node search does.
3. Shrink, level by level: ddmin over the regions kept, then over the children of those kept,
   down to the atoms. Each level but the atoms' gets half the budget left (the atoms' level
   all of it, minus one for the final evaluation): coarse levels remove the most nodes per
   evaluation. A level out of its share stops the search there with the passing set it has,
   its regions kept whole (``RegionSearch.stopped``): a finer level, with more units, would
   not finish either. So the search ends inside its budget, often well before it, where the
   needed set is hundreds of nodes.

Deterministic: the tree, the orders and the budget shares depend only on the model, the
ranking and the evaluation outcomes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, Sequence

from precision_doctor.search.objective import Score

# The first level: no region above 1/8 of the candidates (so the grow's bisection halves real
# work, and a model whose modules all sit under one `network` starts inside it), at most 64
# regions (ddmin over k needed of R regions costs O(k log R) evaluations).
LARGEST_SHARE = 8
MAX_TOP = 64


@dataclass(frozen=True)
class Region:
    """A group of candidate nodes moved to FP32 together.

    Attributes:
        name: Module path (``output_blocks.3.0``), or ``node:NAME`` / ``overflow:NAME`` for an
            atom (NAME: its first ranked node).
        nodes: Its candidate nodes, in ranking order.
        children: Sub-regions (empty for an atom).
    """

    name: str
    nodes: tuple[str, ...]
    children: tuple[Region, ...] = ()

    @property
    def depth(self) -> int:
        """Levels below this region (0 for an atom)."""
        return 1 + max((c.depth for c in self.children), default=-1)


@dataclass(frozen=True)
class RegionSearch:
    """What the region search did.

    Attributes:
        regions: Top-level regions searched.
        kept: Names of the regions (or atoms) of the final set, coarsest level reached.
        levels: Levels shrunk (1 = the top regions only).
        stopped: Regions kept whole because their level ran out of its budget share.
    """

    regions: int
    kept: tuple[str, ...]
    levels: int
    stopped: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"regions": self.regions, "kept": list(self.kept), "levels": self.levels,
                "stopped": list(self.stopped)}


class Evaluate(Protocol):
    """The search's evaluator (``search.bisection._Evaluator``)."""

    trials: list
    max_evals: int

    def __call__(self, nodes: Sequence[str], stage: str, complete: bool = False,
                 then: Sequence[str] | None = None) -> Score: ...

    @property
    def budget_left(self) -> bool: ...


def region_tree(ranking: Sequence[str], modules: Mapping[str, str | None],
                atoms: Mapping[str, tuple[str, ...]] | None = None) -> list[Region]:
    """The top-level regions of the ranked candidates.

    Args:
        ranking: Candidate nodes, most sensitive first (every node searched).
        modules: Node name -> module path (``graph.source.node_modules``; None: unknown).
        atoms: Node -> the nodes it must move with (overflow regions); nodes outside
            ``ranking`` are dropped from an atom.

    Returns:
        The first level: the root's children, the largest opened while it holds more than
        1/``LARGEST_SHARE`` of the nodes and there are fewer than ``MAX_TOP`` regions, ordered
        by their first ranked node; a node without a module path is an atom at the root.
    """
    rank = {n: i for i, n in enumerate(ranking)}
    groups: dict[str, tuple[str, ...]] = {}
    placed: set[str] = set()
    for name in ranking:  # the atoms, keyed by their first ranked node
        if name in placed:
            continue
        group = tuple(sorted({name, *(n for n in (atoms or {}).get(name, ())
                                      if n in rank and n not in placed)},
                             key=rank.__getitem__))
        placed.update(group)
        groups[group[0]] = group
    tree: dict = {}
    for first, group in groups.items():
        path = _common_path([modules.get(n) for n in group])
        branch = tree
        for part in path:
            branch = branch.setdefault(part, {})
        kind = "overflow" if len(group) > 1 else "node"
        branch.setdefault(None, []).append(Region(f"{kind}:{first}", group))
    top = _build(tree, "", rank)
    # a balanced first level: open the largest region while it holds more than 1/8 of the
    # nodes (a model wrapped in one module, `network.*`, starts inside it)
    while len(top) < MAX_TOP:
        big = max((r for r in top if r.children), key=lambda r: len(r.nodes), default=None)
        if big is None or len(big.nodes) * LARGEST_SHARE <= len(rank):
            break
        i = top.index(big)
        top[i:i + 1] = big.children
    return sorted(top, key=lambda r: rank[r.nodes[0]])


def _common_path(paths: Sequence[str | None]) -> tuple[str, ...]:
    """The components shared by every path (``()`` when one is unknown or top-level)."""
    if not paths or any(p is None for p in paths):
        return ()
    split = [str(p).split(".") if p else [] for p in paths]
    common: list[str] = []
    for parts in zip(*split):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return tuple(common)


def _build(tree: dict, prefix: str, rank: Mapping[str, int]) -> list[Region]:
    out: list[Region] = list(tree.get(None, ()))
    for part, sub in tree.items():
        if part is None:
            continue
        path = f"{prefix}.{part}" if prefix else part
        children = _build(sub, path, rank)
        if len(children) == 1:  # a chain of one child: one region, the outer name
            only = children[0]
            out.append(Region(path, only.nodes, only.children) if only.children else only)
        elif children:
            nodes = tuple(sorted((n for c in children for n in c.nodes), key=rank.__getitem__))
            out.append(Region(path, nodes, tuple(children)))
    return sorted(out, key=lambda r: rank[r.nodes[0]])


def _flat(units: Sequence[Region], rank: Mapping[str, int]) -> list[str]:
    return sorted((n for u in units for n in u.nodes), key=rank.__getitem__)


def search_regions(ev: Evaluate, top: Sequence[Region], ranking: Sequence[str],
                   all_fp32: Callable[[list[str]], None]) -> tuple[list[str], RegionSearch]:
    """Grow over the top regions, then shrink level by level (module docstring).

    Args:
        ev: The evaluator (cached, budgeted).
        top: ``region_tree``'s regions.
        ranking: The ranked candidates (orders the nodes of a set).
        all_fp32: Called with every candidate when no shorter prefix passes: evaluates it and
            raises ``TargetNotMetError`` when even that fails.

    Returns:
        The nodes kept (ranking order) and what the search did.

    Raises:
        TargetNotMetError: From ``all_fp32``.
    """
    rank = {n: i for i, n in enumerate(ranking)}
    units = list(top)
    lo, hi = 0, len(units)  # lo fails (the start plan); hi passes
    while hi - lo > 1 and ev.budget_left:
        mid = (lo + hi) // 2
        if ev(_flat(units[:mid], rank), "grow-regions",
              then=_flat(units[:(mid + hi) // 2], rank)).passed:
            hi = mid
        else:
            lo = mid
    if hi == len(units):
        all_fp32(_flat(units, rank))
    kept, levels = units[:hi], 0
    stopped: tuple[str, ...] = ()
    while ev.budget_left:
        levels += 1
        last = all(not u.children for u in kept)
        left = ev.max_evals - len(ev.trials) - 1  # one for the final evaluation
        cap = len(ev.trials) + max(1, left if last else left // 2)
        kept, done = _ddmin(kept, ev, rank, cap, f"shrink-regions-{levels}")
        if not done:  # a finer level has more units: it would not finish either
            stopped = tuple(u.name for u in kept if u.children or len(u.nodes) > 1)
            break
        if last:
            break
        kept = sorted((c for u in kept for c in (u.children or (u,))),
                      key=lambda r: rank[r.nodes[0]])
    return _flat(kept, rank), RegionSearch(len(top), tuple(u.name for u in kept), levels,
                                           stopped)


def _complements(units: list[Region], n: int) -> list[list[Region]]:
    size = math.ceil(len(units) / n)
    return [units[:i] + units[i + size:] for i in range(0, len(units), size)]


def _ddmin(units: list[Region], ev: Evaluate, rank: Mapping[str, int], cap: int,
           stage: str) -> tuple[list[Region], bool]:
    """Complement-only ddmin over ``units`` (as ``bisection._ddmin`` over nodes) until ``cap``
    trials; returns the passing units left and whether it finished."""
    def left() -> bool:
        return ev.budget_left and len(ev.trials) < cap

    n = 2
    while len(units) >= 2:
        if not left():
            return units, False
        rests = _complements(units, n)
        for j, rest in enumerate(rests):
            if not left():
                return units, False
            after = rests[j + 1] if j + 1 < len(rests) else None
            if ev(_flat(rest, rank), stage,
                  then=_flat(after, rank) if after is not None else None).passed:
                units, n = rest, max(n - 1, 2)
                break
        else:
            if n >= len(units):
                break
            n = min(len(units), 2 * n)
    return units, True


__all__ = ["LARGEST_SHARE", "MAX_TOP", "Region", "RegionSearch", "region_tree",
           "search_regions"]
