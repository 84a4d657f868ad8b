"""The FP32-set search on a fake engine: minimal sets, budget, fail-fast over samples."""

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from precision_doctor.compare.tasks.registry import get_metric
from precision_doctor.errors import TargetNotMetError
from precision_doctor.formats import Precision
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners.base import TensorMeta
from precision_doctor.runners.fake import FakeRunner
from precision_doctor.search.bisection import search_fp32_set
from precision_doctor.search.objective import Objective

NODES = [f"n{i}" for i in range(40)]
NEEDED = {"n7", "n23"}  # sample 2 flips unless both are FP32


def _setup(needed=NEEDED, passes=None):
    """Four samples; sample 2 flips unless ``passes(fp32 nodes)`` (default: ``needed`` are
    all FP32)."""
    passes = passes or (lambda fp32: needed <= fp32)
    samples = [SimpleNamespace(feeds={"x": np.full((1, 4), float(i), np.float32)})
               for i in range(4)]
    runs: list[int] = []

    def open_plan(plan: PrecisionPlan) -> FakeRunner:
        fp32 = set(plan.fp32_nodes())

        def fn(feeds):
            i = int(feeds["x"][0, 0])
            runs.append(i)
            logits = np.zeros((1, 3), np.float32)
            flips = i == 2 and not passes(fp32)
            logits[0, 1 if flips else 0] = 1.0
            return {"y": logits}
        return FakeRunner([TensorMeta("x", np.dtype(np.float32), (1, 4))], ["y"], fn)

    reference = {"y": [np.array([[1.0, 0.0, 0.0]], np.float32) for _ in samples]}
    return samples, open_plan, reference, runs


def test_finds_exactly_the_needed_nodes_and_failing_evaluations_stop_early():
    samples, open_plan, reference, runs = _setup()
    objective = Objective(metric=get_metric("top1"), threshold=1.0)
    result = search_fp32_set(open_plan, samples, reference, objective,
                             PrecisionPlan(Precision.FP16), NODES, max_evals=100)
    assert set(result.kept) == NEEDED and result.score.passed
    assert result.evaluations <= 2 * 2 * 6 + 10  # O(k log N), N = 40
    failed = [t for t in result.trials if not t.passed and t.stage in ("grow", "shrink")]
    # after the start evaluation, sample 2 (the failing one) runs first: a failing
    # evaluation costs one sample, a passing one all four
    passed = [t for t in result.trials if t.passed and t.stage in ("grow", "shrink")]
    complete = {"start", "all-fp32", "final"}
    expected = (len(failed) + 4 * len(passed)
                + 4 * sum(t.stage in complete for t in result.trials))
    assert len(runs) == expected and failed


def test_budget_and_unreachable_target():
    samples, open_plan, reference, _ = _setup(needed={"not-a-candidate"})
    objective = Objective(metric=get_metric("top1"), threshold=1.0)
    with pytest.raises(TargetNotMetError, match="not met even with all 40"):
        search_fp32_set(open_plan, samples, reference, objective,
                        PrecisionPlan(Precision.FP16), NODES)
    samples, open_plan, reference, _ = _setup()
    result = search_fp32_set(open_plan, samples, reference, objective,
                             PrecisionPlan(Precision.FP16), NODES, max_evals=5)
    assert result.evaluations <= 6 and result.score.passed  # a passing superset
    assert NEEDED <= set(result.kept)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(st.lists(st.integers(0, 39), min_size=1, max_size=5), min_size=1, max_size=3),
       st.randoms(use_true_random=False))
def test_the_set_found_passes_and_no_single_node_can_go(alternatives, rnd):
    """Any monotone target (passes when one of several node sets is all FP32), any ranking:
    the answer passes, and dropping any one of its nodes fails (1-minimal)."""
    sets = [{f"n{i}" for i in alt} for alt in alternatives]

    def passes(fp32):
        return any(s <= set(fp32) for s in sets)

    samples, open_plan, reference, _ = _setup(passes=passes)
    ranking = list(NODES)
    rnd.shuffle(ranking)
    objective = Objective(metric=get_metric("top1"), threshold=1.0)
    result = search_fp32_set(open_plan, samples, reference, objective,
                             PrecisionPlan(Precision.FP16), ranking, max_evals=1000)
    kept = list(result.kept)
    assert result.score.passed and passes(kept)
    assert all(not passes([n for n in kept if n != node]) for node in kept)
    assert kept == sorted(kept, key=ranking.index)  # in ranking order


def test_a_plan_whose_run_fails_is_a_failed_evaluation_once_a_plan_ran():
    """A plan that breaks the graph at run time (rounded durations that leave a Reshape an
    empty tensor) fails its evaluation instead of ending the search; a runner that fails on
    the first plan is broken and raises."""
    from precision_doctor.errors import BackendError

    samples, open_plan, reference, _ = _setup()

    def breaking(plan: PrecisionPlan) -> FakeRunner:
        fp32 = set(plan.fp32_nodes())
        if fp32 and "n7" in fp32 and "n23" not in fp32:  # such plans break the graph
            def fail(feeds):
                raise BackendError("emulate-fp16: run failed: Reshape", runner="fake")
            return FakeRunner([TensorMeta("x", np.dtype(np.float32), (1, 4))], ["y"], fail)
        return open_plan(plan)

    objective = Objective(metric=get_metric("top1"), threshold=1.0)
    result = search_fp32_set(breaking, samples, reference, objective,
                             PrecisionPlan(Precision.FP16), NODES, max_evals=100)
    assert set(result.kept) == NEEDED and result.score.passed
    assert any(t.value == float("inf") and not t.passed for t in result.trials)

    def broken(plan: PrecisionPlan) -> FakeRunner:
        def fail(feeds):
            raise BackendError("no session", runner="fake")
        return FakeRunner([TensorMeta("x", np.dtype(np.float32), (1, 4))], ["y"], fail)

    with pytest.raises(BackendError, match="no session"):
        search_fp32_set(broken, samples, reference, objective, PrecisionPlan(Precision.FP16),
                        NODES)
