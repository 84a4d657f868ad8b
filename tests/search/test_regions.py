"""Region-first search (``search.regions``) on a fake engine shaped like a range-bound UNet:
16 blocks of 20 nodes, where 12 blocks each hold one overflow region of 8 nodes that only
cures whole (96 needed nodes)."""

from types import SimpleNamespace

import numpy as np

from precision_doctor.compare.tasks.registry import get_metric
from precision_doctor.compare.tolerance import Tolerance
from precision_doctor.formats import Precision
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners.base import TensorMeta
from precision_doctor.runners.fake import FakeRunner
from precision_doctor.search.bisection import search_fp32_set
from precision_doctor.search.objective import Objective
from precision_doctor.search.regions import RangeRung, Region, RegionStart, region_tree

BLOCKS, PER_BLOCK, HOT = 16, 20, range(0, 16, 4)  # 4 blocks not hot: 12 hot below
NODES = [f"/blocks.{b}/sub.{j // 5}/Op_{j}" for b in range(BLOCKS) for j in range(PER_BLOCK)]
MODULES = {n: n[1:].rsplit("/", 1)[0].replace("/", ".") for n in NODES}
HOT_BLOCKS = [b for b in range(BLOCKS) if b not in HOT]
ATOMS = {b: tuple(f"/blocks.{b}/sub.{j // 5}/Op_{j}" for j in range(4, 12))
         for b in HOT_BLOCKS}  # an overflow region across sub.0, sub.1 and sub.2
NEEDED = {n for atom in ATOMS.values() for n in atom}


def _setup():
    samples = [SimpleNamespace(feeds={"x": np.full((1, 4), float(i), np.float32)})
               for i in range(2)]

    def open_plan(plan: PrecisionPlan) -> FakeRunner:
        fp32 = set(plan.fp32_nodes())

        def fn(feeds):
            logits = np.zeros((1, 3), np.float32)
            logits[0, 0 if NEEDED <= fp32 else 1] = 1.0  # NaN everywhere unless all cured
            return {"y": logits}
        return FakeRunner([TensorMeta("x", np.dtype(np.float32), (1, 4))], ["y"], fn)

    reference = {"y": [np.array([[1.0, 0.0, 0.0]], np.float32) for _ in samples]}
    return samples, open_plan, reference


def _ranking() -> list[str]:
    """Overflow regions first (``repair.ranking`` expands them), then the rest in graph
    order, as the layerwise ranking puts +inf sensitivities first."""
    hot = [n for b in HOT_BLOCKS for n in ATOMS[b]]
    return hot + [n for n in NODES if n not in NEEDED]


def _overflow() -> dict[str, tuple[str, ...]]:
    return {n: atom for atom in ATOMS.values() for n in atom}


def test_region_tree_groups_by_module_and_keeps_overflow_regions_whole():
    top = region_tree(_ranking(), MODULES, _overflow())
    # the root module "blocks" has 16 children: the tree starts at the blocks
    assert [r.name for r in top[:3]] == ["blocks.1", "blocks.2", "blocks.3"]
    assert len(top) == BLOCKS and all(isinstance(r, Region) for r in top)
    block1 = top[0]
    assert len(block1.nodes) == PER_BLOCK and block1.depth == 2
    (atom,) = [c for c in block1.children if c.name.startswith("overflow:")]
    assert atom.nodes == ATOMS[1] and not atom.children  # at the innermost common module
    # nodes without a module path are atoms at the root
    bare = region_tree(["a", "b"], {}, {})
    assert [r.name for r in bare] == ["node:a", "node:b"]


def _search(regions):
    samples, open_plan, reference = _setup()
    objective = Objective(metric=get_metric("top1"), threshold=1.0)
    top = region_tree(_ranking(), MODULES, _overflow()) if regions else None
    return search_fp32_set(open_plan, samples, reference, objective,
                           PrecisionPlan(Precision.FP16), _ranking(), max_evals=150,
                           regions=(lambda _: top) if regions else None)


def test_regions_first_finds_the_exact_set_within_budget_where_nodes_exhaust_it():
    by_nodes = _search(regions=False)
    assert by_nodes.regions is None
    assert by_nodes.evaluations >= 150  # ddmin over 96 needed nodes spends the budget
    by_regions = _search(regions=True)
    assert set(by_regions.kept) == NEEDED and by_regions.score.passed
    assert by_regions.evaluations < 60, by_regions.evaluations
    done = by_regions.regions
    assert done is not None and done.regions == BLOCKS and not done.stopped
    assert set(done.kept) == {f"overflow:{ATOMS[b][0]}" for b in HOT_BLOCKS}
    stages = {t.stage for t in by_regions.trials}
    assert {"grow-regions", "shrink-regions-1"} <= stages


def test_region_search_is_deterministic():
    a, b = _search(regions=True), _search(regions=True)
    assert a.kept == b.kept
    assert [(t.stage, t.fp32_nodes, t.passed) for t in a.trials] == \
        [(t.stage, t.fp32_nodes, t.passed) for t in b.trials]


def test_a_level_out_of_its_share_keeps_its_regions_whole_and_passes():
    samples, open_plan, reference = _setup()
    objective = Objective(metric=get_metric("top1"), threshold=1.0)
    top = region_tree(_ranking(), MODULES, _overflow())
    result = search_fp32_set(open_plan, samples, reference, objective,
                             PrecisionPlan(Precision.FP16), _ranking(), max_evals=20,
                             regions=lambda _: top)
    assert result.score.passed and NEEDED <= set(result.kept)
    assert result.evaluations <= 20  # inside the budget, the final evaluation included
    assert result.regions is not None and result.regions.stopped


# The range floor (``search.regions`` step 0): the overflow regions (rung 0) leave NaN; the
# values near the format's max (rung 1, 8 more nodes) cure it but for a rounding error of 3%
# that one node elsewhere (ROUNDING) carries; rung 2 (40 more nodes) is no better.
NEAR = tuple(f"/blocks.0/sub.{j // 5}/Op_{j}" for j in range(8))
OTHER = tuple(f"/blocks.4/sub.{j // 5}/Op_{j}" for j in range(20)) + \
    tuple(f"/blocks.8/sub.{j // 5}/Op_{j}" for j in range(20))
ROUNDING = "/blocks.12/sub.3/Op_17"


def _floor_search(rounding: bool, max_evals: int = 150, split_near: bool = False):
    samples = [SimpleNamespace(feeds={"x": np.full((1, 4), float(i), np.float32)})
               for i in range(2)]

    def open_plan(plan: PrecisionPlan) -> FakeRunner:
        fp32 = set(plan.fp32_nodes())

        def fn(feeds):
            if not NEEDED <= fp32 or not set(NEAR) <= fp32:
                return {"y": np.full((1, 3), np.nan, np.float32)}
            error = 0.03 if rounding and ROUNDING not in fp32 else 0.0
            return {"y": np.array([[1.0 + error, 0.0, 0.0]], np.float32)}
        return FakeRunner([TensorMeta("x", np.dtype(np.float32), (1, 4))], ["y"], fn)

    reference = {"y": [np.array([[1.0, 0.0, 0.0]], np.float32) for _ in samples]}
    ranking = _ranking()
    rung0 = tuple(n for n in ranking if n in NEEDED)
    rungs = (RangeRung(65504.0, rung0), RangeRung(32752.0, rung0 + NEAR),
             RangeRung(8188.0, rung0 + NEAR + OTHER))
    if split_near:  # half of NEAR in a rung of its own: still NaN there
        rungs = (rungs[0], RangeRung(32752.0, rung0 + NEAR[:4]),
                 RangeRung(16376.0, rung0 + NEAR), rungs[2])
    start = RegionStart(tuple(region_tree(ranking, MODULES, _overflow())), rungs)
    return search_fp32_set(open_plan, samples, reference,
                           Objective(tolerances={"*": Tolerance(rel_l2=1e-2)}),
                           PrecisionPlan(Precision.FP16), ranking, max_evals=max_evals,
                           regions=lambda _: start)


def test_the_range_floor_is_the_best_failing_rung_and_the_search_goes_on_above_it():
    result = _floor_search(rounding=True)
    assert result.score.passed
    assert set(result.kept) == NEEDED | set(NEAR) | {ROUNDING}
    climb = [t for t in result.trials if t.stage == "range-floor"]
    # NaN, then 3e-2 (better), then 3e-2 again (no better): the climb stops at the third rung
    assert [t.passed for t in climb] == [False, False, False] and len(climb) == 3
    done = result.regions
    assert done is not None and done.floor == len(NEEDED) + len(NEAR)
    assert done.floor_threshold == 32752.0
    assert result.evaluations < 40, result.evaluations


def test_a_passing_rung_is_the_answer():
    result = _floor_search(rounding=False)
    assert result.score.passed and set(result.kept) == NEEDED | set(NEAR)
    done = result.regions
    assert done is not None and done.floor == len(NEEDED) + len(NEAR)
    assert done.floor_threshold == 32752.0 and not done.kept
    assert [t.passed for t in result.trials if t.stage == "range-floor"] == [False, True]
    # the final evaluation is the passing rung's, cached
    assert [t.stage for t in result.trials] == ["start", "range-floor", "range-floor"]


def test_a_rung_still_at_nan_does_not_stop_the_climb():
    result = _floor_search(rounding=False, split_near=True)
    assert result.score.passed and set(result.kept) == NEEDED | set(NEAR)
    assert [t.passed for t in result.trials if t.stage == "range-floor"] == [False, False, True]
    assert result.regions is not None and result.regions.floor_threshold == 16376.0


def test_the_terminal_says_where_the_range_floor_ended_the_search():
    from precision_doctor.report.terminal.fix import regions_line

    done = _floor_search(rounding=False).regions
    assert done is not None
    assert regions_line(done.to_dict()) == (
        f"range floor: the {len(NEEDED) + len(NEAR)} nodes of values over 32752 on any sample "
        "kept in FP32; the search ended there")
    floored = _floor_search(rounding=True).regions
    assert floored is not None and regions_line(floored.to_dict()).startswith(
        f"range floor: the {len(NEEDED) + len(NEAR)} nodes of values over 32752 on any sample "
        "kept in FP32, then searched by regions first")
