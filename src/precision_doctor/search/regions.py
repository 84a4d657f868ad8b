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

0. Range floor (before the grow, when ``rungs`` are given): where values leave FP16's range,
   the search first climbs a ladder of magnitude thresholds T (``RangeRung``: the overflow
   regions of every tensor whose FP32 magnitude on any sample exceeds T, graph regions as in
   1.), from the format's max down, one evaluation of every sample per rung. The climb stops
   at the first rung that passes, or at the first finite one no better than the best above
   it (the error left is rounding, not range; a rung still at inf or NaN goes on down). A
   passing rung is the answer, not shrunk: its nodes hold values within 2^k of the format's
   max on these samples, which an input 2^k times larger takes past it (the margin of
   ModelOpt AutoCast's ``data_max`` rule, here measured), and shrinking it would spend the
   evaluations the floor saves. Else the best failing rung is the *floor*: it stays in
   FP32, and the grow and shrink search the other candidates on top of it, ranked again with
   the floor in FP32 (the first ranking saw NaN past the first overflow). On the zoo's
   diffusion UNet (values up to 3e10; ``benchmarks/zoo_unet.py``, BENCHMARKS.md), all 7
   samples: the values over 65504 on any sample (503 nodes) pass in 2 evaluations.

Deterministic: the tree, the orders and the budget shares depend only on the model, the
ranking and the evaluation outcomes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Protocol, Sequence, TypeVar

from precision_doctor.search.objective import Score

# The first level: no region above 1/8 of the candidates (so the grow's bisection halves real
# work, and a model whose modules all sit under one `network` starts inside it), at most 64
# regions (ddmin over k needed of R regions costs O(k log R) evaluations).
LARGEST_SHARE = 8
MAX_TOP = 64
T = TypeVar("T")


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
        floor: Nodes of the range floor (step 0), kept in FP32 under every evaluated set.
        floor_threshold: The floor rung's magnitude threshold (None: no floor).
    """

    regions: int
    kept: tuple[str, ...]
    levels: int
    stopped: tuple[str, ...] = ()
    floor: int = 0
    floor_threshold: float | None = None

    def to_dict(self) -> dict:
        return {"regions": self.regions, "kept": list(self.kept), "levels": self.levels,
                "stopped": list(self.stopped), "floor": self.floor,
                "floor_threshold": self.floor_threshold}


@dataclass(frozen=True)
class RangeRung:
    """One rung of the range floor's ladder (module docstring, step 0).

    Attributes:
        threshold: |x| above which a tensor's producer and readers are in the rung (units of
            the tensor; the target format's max / 2^k).
        nodes: The candidate nodes of those overflow regions, in ranking order.
    """

    threshold: float
    nodes: tuple[str, ...]


# the range floor's nodes -> the candidates ranked again with them in FP32, and the top regions
Rerank = Callable[[Sequence[str]], tuple[Sequence[str], Sequence[Region]]]


@dataclass(frozen=True)
class RegionStart:
    """What the region search starts from: the top regions, the range ladder, and the ranking
    again on top of the floor (the first ranking measured NaN past the first overflow)."""

    top: tuple[Region, ...]
    rungs: tuple[RangeRung, ...] = ()
    rerank: Rerank | None = field(default=None, compare=False)


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
                   all_fp32: Callable[[list[str]], None], rungs: Sequence[RangeRung] = (),
                   better: Callable[[Score, Score], bool] | None = None,
                   rerank: Rerank | None = None) -> tuple[list[str], RegionSearch]:
    """Climb the range floor, grow over the top regions, then shrink level by level (module
    docstring).

    Args:
        ev: The evaluator (cached, budgeted).
        top: ``region_tree``'s regions.
        ranking: The ranked candidates (orders the nodes of a set).
        all_fp32: Called with every candidate when no shorter prefix passes: evaluates it and
            raises ``TargetNotMetError`` when even that fails.
        rungs: The range ladder, thresholds descending (empty: no floor).
        better: ``Objective.better`` (needed with ``rungs``).
        rerank: Ranks the candidates again with the floor in FP32 (None: keep the ranking).

    Returns:
        The nodes kept (ranking order) and what the search did.

    Raises:
        TargetNotMetError: From ``all_fp32``.
    """
    rank = {n: i for i, n in enumerate(ranking)}
    searched = len(top)
    floor: list[str] = []
    threshold: float | None = None
    if rungs and better is not None:
        floor, threshold, passed = climb_range(ev, rungs, rank, better)
        if passed:  # the rung is the answer (module docstring, step 0)
            return floor, RegionSearch(searched, (), 0, (), len(floor), threshold)
    if floor and rerank is not None:
        again, top = rerank(floor)  # the new order first, then any node it lacks
        rank = {n: i for i, n in enumerate(dict.fromkeys([*again, *ranking]))}
    if floor:
        ev = _Floored(ev, floor, rank)
        top = without(top, set(floor))
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
        all_fp32(sorted([*floor, *_flat(units, rank)], key=rank.__getitem__))
    kept, levels = units[:hi], 0
    stopped: tuple[str, ...] = ()
    while ev.budget_left:
        levels += 1
        last = all(not u.children for u in kept)
        left = ev.max_evals - len(ev.trials) - 1  # one for the final evaluation
        cap = len(ev.trials) + max(1, left if last else left // 2)
        kept, done = _shrink(kept, ev, rank, cap, f"shrink-regions-{levels}")
        if not done:  # a finer level has more units: it would not finish either
            stopped = tuple(u.name for u in kept if u.children or len(u.nodes) > 1)
            break
        if last:
            break
        kept = sorted((c for u in kept for c in (u.children or (u,))),
                      key=lambda r: rank[r.nodes[0]])
    nodes = sorted([*floor, *_flat(kept, rank)], key=rank.__getitem__)
    return nodes, RegionSearch(searched, tuple(u.name for u in kept), levels, stopped,
                               len(floor), threshold)


def climb_range(ev: Evaluate, rungs: Sequence[RangeRung], rank: Mapping[str, int],
                better: Callable[[Score, Score], bool]
                ) -> tuple[list[str], float | None, bool]:
    """Step 0 of the module docstring: the range floor.

    Returns:
        The floor's nodes (ranking order; empty when no rung was evaluated), its threshold, and
        whether it passes (the first rung that passed; else the best failing rung).
    """
    best: tuple[list[str], float, Score] | None = None
    for rung in rungs:
        if not ev.budget_left:
            break
        nodes = sorted(rung.nodes, key=rank.__getitem__)
        score = ev(nodes, "range-floor", complete=True)
        if score.passed:
            return nodes, rung.threshold, True
        if best is None or better(_finite(score), _finite(best[2])):
            best = (nodes, rung.threshold, score)
        elif math.isfinite(score.value):
            break  # finite and no better: the error left is not range (inf: go on down)
    return (best[0], best[1], False) if best is not None else ([], None, False)


def _finite(score: Score) -> Score:
    """NaN scores as the worst (inf), so that any finite score improves on them."""
    return replace(score, value=math.inf) if math.isnan(score.value) else score


def without(regions: Sequence[Region], drop: set[str]) -> list[Region]:
    """``regions`` with the nodes ``drop`` removed (empty regions removed with them)."""
    out = []
    for r in regions:
        nodes = tuple(n for n in r.nodes if n not in drop)
        if nodes:
            out.append(Region(r.name, nodes, tuple(without(r.children, drop))))
    return out


class _Floored:
    """An evaluator that keeps the floor's nodes in FP32 under every set it is given."""

    def __init__(self, ev: Evaluate, floor: Sequence[str], rank: Mapping[str, int]) -> None:
        self.ev, self.floor, self.rank = ev, list(floor), rank
        self.trials, self.max_evals = ev.trials, ev.max_evals  # the same list: one budget

    def _with(self, nodes: Sequence[str]) -> list[str]:
        return sorted({*self.floor, *nodes}, key=self.rank.__getitem__)

    def __call__(self, nodes: Sequence[str], stage: str, complete: bool = False,
                 then: Sequence[str] | None = None) -> Score:
        return self.ev(self._with(nodes), stage, complete,
                       self._with(then) if then is not None else None)

    @property
    def budget_left(self) -> bool:
        return self.ev.budget_left


def _shrink(units: list[Region], ev: Evaluate, rank: Mapping[str, int], cap: int,
            stage: str) -> tuple[list[Region], bool]:
    """``ddmin`` over regions until ``cap`` trials."""
    return ddmin(units, lambda rest, after: ev(
        _flat(rest, rank), stage, then=_flat(after, rank) if after is not None else None).passed,
        lambda: ev.budget_left and len(ev.trials) < cap)


def complements(units: list[T], n: int) -> list[list[T]]:
    """``units`` without each of its ``n`` consecutive chunks, in chunk order."""
    size = math.ceil(len(units) / n)
    return [units[:i] + units[i + size:] for i in range(0, len(units), size)]


def ddmin(units: list[T], passes: Callable[[list[T], list[T] | None], bool],
          left: Callable[[], bool]) -> tuple[list[T], bool]:
    """Complement-only delta debugging (Zeller & Hildebrandt 2002): drop chunks of the
    passing ``units`` while the rest passes. ``passes(rest, next)``: whether ``rest`` passes,
    ``next`` the set tried after it if it fails (most do: its runner opens meanwhile);
    ``left()``: whether another evaluation may start. Returns the units left and whether
    ddmin finished (False: out of budget)."""
    n = 2
    while len(units) >= 2:
        if not left():
            return units, False
        rests = complements(units, n)
        for j, rest in enumerate(rests):
            if not left():
                return units, False
            after = (rests[j + 1] if j + 1 < len(rests) else
                     complements(units, min(len(units), 2 * n))[0] if n < len(units) else None)
            if passes(rest, after):
                units, n = rest, max(n - 1, 2)
                break
        else:
            if n >= len(units):
                break
            n = min(len(units), 2 * n)
    return units, True


__all__ = ["LARGEST_SHARE", "MAX_TOP", "RangeRung", "Region", "RegionSearch", "RegionStart",
           "climb_range", "complements", "ddmin", "region_tree", "search_regions", "without"]
