"""The search spends evaluations where they pay.

Early stop for tolerance objectives (exact: a stop is always a real failure), margin-aware
ranking order for decision metrics, ``--jobs`` giving the same plan as one process, and the
cost fields of every fix report.
"""

from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from tiny_models import make_model, random_samples, tensor, transformer_block
from typer.testing import CliRunner

from precision_doctor.cli import app
from precision_doctor.compare.tasks.registry import get_metric
from precision_doctor.compare.tolerance import Tolerance
from precision_doctor.errors import InputError
from precision_doctor.formats import Precision
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.repair.pipeline import fix
from precision_doctor.runners.base import TensorMeta
from precision_doctor.runners.fake import FakeRunner
from precision_doctor.search.bisection import search_fp32_set
from precision_doctor.search.evalpool import resolve_jobs
from precision_doctor.search.objective import SAMPLE_LOAD, Objective
from precision_doctor.search.ranking import upstream_first

NODES = [f"n{i}" for i in range(32)]
NEEDED = {"n5", "n20"}
TOL = Objective(tolerances={"*": Tolerance(rel_l2=1e-2)})


def _tolerance_setup():
    """6 samples; sample 3 gets a large error unless NEEDED are FP32, the others a small one."""
    samples = [SimpleNamespace(feeds={"x": np.full((1, 8), float(i), np.float32)})
               for i in range(6)]
    rng = np.random.default_rng(0)
    refs = [rng.normal(size=(1, 8)).astype(np.float32) for _ in samples]
    runs: list[int] = []

    def open_plan(plan: PrecisionPlan, threads: int = 0) -> FakeRunner:
        fp32 = set(plan.fp32_nodes())

        def fn(feeds):
            i = int(feeds["x"][0, 0])
            runs.append(i)
            err = 0.2 if (i == 3 and not NEEDED <= fp32) else 1e-3
            return {"y": refs[i] * (1 + err)}
        return FakeRunner([TensorMeta("x", np.dtype(np.float32), (1, 8))], ["y"], fn)

    return samples, open_plan, {"y": refs}, runs


def test_score_stream_stops_only_on_real_failures():
    rng = np.random.default_rng(1)
    for trial in range(40):
        ref = {"y": [rng.normal(size=(3, 5)) for _ in range(5)]}
        scale = rng.uniform(0, 0.03, size=5)
        cand = {"y": [r + s * rng.normal(size=r.shape) for r, s in zip(ref["y"], scale)]}
        full = TOL.score(ref, cand)
        stream = TOL.stream(ref)
        stopped = False
        for i in rng.permutation(5):
            if stream.add(int(i), {"y": cand["y"][i]}):
                stopped = True
                break
        partial = stream.score()
        assert partial.passed == full.passed, trial
        if stopped:
            assert not full.passed and partial.value <= full.value + 1e-12
        else:
            assert partial == full
    # NaN stops at once; an elementwise bound stops once too many elements miss it
    stream = TOL.stream({"y": [np.ones(4), np.ones(4)]})
    assert stream.add(1, {"y": np.array([1.0, np.nan, 1.0, 1.0])})
    elementwise = Objective(tolerances={"*": Tolerance(rel_l2=None, atol=1e-3)})
    stream = elementwise.stream({"y": [np.zeros(4), np.zeros(4)]})
    assert stream.add(0, {"y": np.array([0.0, 0.1, 0.0, 0.0])})


def test_tolerance_search_stops_early_and_orders_samples_by_error_load():
    samples, open_plan, reference, runs = _tolerance_setup()
    result = search_fp32_set(open_plan, samples, reference, TOL, PrecisionPlan(Precision.FP16),
                             NODES, max_evals=60)
    assert set(result.kept) == NEEDED and result.score.passed
    failed = [t for t in result.trials if not t.passed and t.stage in ("grow", "shrink")]
    assert failed and all(t.samples == 1 for t in failed)  # sample 3 runs first and fails
    assert len(runs) == sum(t.samples for t in result.trials)
    assert result.final_outputs is not None  # the kept plan's outputs, for fix to reuse


def test_tolerance_score_says_which_samples_carry_the_error():
    samples, open_plan, reference, _ = _tolerance_setup()
    with open_plan(PrecisionPlan(Precision.FP16)) as runner:
        cand = {"y": [runner.run(s.feeds)["y"] for s in samples]}
    score = TOL.score(reference, cand)
    loads = score.detail[SAMPLE_LOAD]
    assert np.isclose(sum(loads), (score.value) ** 2)  # loads sum to (rel_l2 / bound)^2
    assert TOL.worst_samples(score, 2, len(samples))[0] == 3


def test_margin_aware_order_smallest_margin_first():
    from precision_doctor.search.near_ties import at_risk_samples

    metric = Objective(metric=get_metric("top1"), threshold=1.0, exclude=frozenset({4}))
    ref = [np.array([[0.6, 0.4]]), np.array([[0.9, 0.1]]), np.array([[0.6, 0.4], [0.9, 0.1]]),
           np.array([[0.7, 0.3]]), np.array([[0.5, 0.5]])]
    cand = [np.array([[0.58, 0.42]]),  # 10% of its margin used: safe
            np.array([[0.3, 0.7]]),  # flipped: all of it and more
            np.array([[0.6, 0.4], [0.6, 0.4]]),  # 62.5% at its second position
            np.array([[0.6, 0.4]]),  # 50%
            np.array([[0.4, 0.6]])]  # a near-tie left out of the objective
    # the decisions closest to flipping first, across positions; safe ones and near-ties out
    assert at_risk_samples({"p": ref}, {"p": cand}, metric) == [1, 2, 3]
    assert at_risk_samples({"p": ref}, {"p": cand}, TOL) is None  # not a decision metric
    # nodes the decision output does not read go after those it does, order kept otherwise
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="side"),
             helper.make_node("Neg", ["x"], ["b"], name="head1"),
             helper.make_node("Abs", ["b"], ["p"], name="head2")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                       [helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, 2]),
                        helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 2])])
    assert upstream_first(["side", "head2", "head1"], model, "p") == ["head2", "head1", "side"]


def test_jobs_2_gives_the_same_search_as_jobs_1():
    samples, open_plan, reference, _ = _tolerance_setup()
    one = search_fp32_set(open_plan, samples, reference, TOL, PrecisionPlan(Precision.FP16),
                          NODES, max_evals=60, jobs=1)
    two = search_fp32_set(open_plan, samples, reference, TOL, PrecisionPlan(Precision.FP16),
                          NODES, max_evals=60, jobs=2)
    assert one.plan == two.plan and one.kept == two.kept
    assert [(t.stage, t.fp32_nodes, t.passed, t.value) for t in one.trials] == \
        [(t.stage, t.fp32_nodes, t.passed, t.value) for t in two.trials]
    # a real model on the emulator, ONNX Runtime sessions in forked workers
    model = transformer_block(hot_value=1000.0, opset=13)
    data = random_samples((1, 8, 16), count=3)
    a = fix(model, data, Precision.FP16, TOL, rewrites=[], jobs=1)
    b = fix(model, data, Precision.FP16, TOL, rewrites=[], jobs=2)
    assert a.plan == b.plan and a.search.kept == b.search.kept and a.search.kept
    assert b.resources["jobs"] == 2 and b.resources["peak_rss_workers_mb"] > 0


def test_prefetch_gives_the_same_search_and_closes_every_runner():
    samples, base_open, reference, _ = _tolerance_setup()
    opened: list[frozenset] = []
    closed: list[frozenset] = []

    def open_plan(plan: PrecisionPlan, threads: int = 0) -> FakeRunner:
        runner = base_open(plan)
        key = frozenset(plan.fp32_nodes())
        enter, leave = runner.__enter__, runner.__exit__
        runner.__enter__ = lambda: (opened.append(key), enter())[1]  # type: ignore[method-assign]
        runner.__exit__ = lambda *a: (closed.append(key), leave(*a))[1]  # type: ignore
        return runner

    plain = search_fp32_set(open_plan, samples, reference, TOL, PrecisionPlan(Precision.FP16),
                            NODES, max_evals=60)
    del opened[:], closed[:]
    ahead = search_fp32_set(open_plan, samples, reference, TOL, PrecisionPlan(Precision.FP16),
                            NODES, max_evals=60, prefetch=True)
    assert ahead.kept == plain.kept and set(ahead.kept) == NEEDED
    assert [(t.stage, t.fp32_nodes, t.passed) for t in ahead.trials] == \
        [(t.stage, t.fp32_nodes, t.passed) for t in plain.trials]
    assert len(opened) > len(ahead.trials) - 1  # guesses that missed were opened too
    assert sorted(map(sorted, opened)) == sorted(map(sorted, closed))  # and all closed


def test_ranking_ignores_the_last_digits_of_the_scores():
    """Sensitivities equal to 1 significant digit (e.g. differing in the 4th, as float32
    summation order makes them) are ties: the ranking keeps topological order between them
    and does not move with the noise."""
    from precision_doctor.layerwise.compare import LayerRecord, LayerwiseResult
    from precision_doctor.search.ranking import rank_by_sensitivity

    def record(i: int, rel: float) -> LayerRecord:
        return LayerRecord(f"t{i}", f"n{i}", "Mul", i + 1, 10, 1.0, 1.0, rel, rel, rel, 0, 0,
                           0, 0, 0, 0, 0, 10.0)

    inputs = {f"n{i}": ["x"] for i in range(4)}
    for noise in (1.0, 1.0001, 0.9999):
        rels = [2e-3, 2e-3 * noise, 9e-3, 2e-3 / noise]
        lw = LayerwiseResult("fp16", 1e-2, tuple(record(i, r) for i, r in enumerate(rels)),
                             None, None, 1)
        assert rank_by_sensitivity(lw, [f"n{i}" for i in range(4)], inputs) == \
            ["n2", "n0", "n1", "n3"]


def test_jobs_option_validation():
    assert resolve_jobs("2", 5) == 2 and resolve_jobs(8, 3) == 3 and resolve_jobs("auto", 1) == 1
    with pytest.raises(InputError, match="--jobs"):
        resolve_jobs("many", 3)
    with pytest.raises(InputError, match="--jobs"):
        resolve_jobs(0, 3)


def test_fix_reports_evaluations_wall_time_and_peak_rss(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                       [tensor("w", np.eye(4))])
    result = fix(model, random_samples((1, 4)), Precision.FP16, TOL)
    r = result.to_dict()["resources"]
    assert r["evaluations"] == result.search.evaluations >= 1
    assert r["samples_run"] >= 2 and r["wall_s"] > 0 and r["peak_rss_mb"] > 10
    assert 0 < r["cpu_s"]
    assert r["jobs"] == 1 and r["peak_rss_workers_mb"] == 0
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    res = CliRunner().invoke(app, ["fix", str(path), "-o", str(tmp_path / "f.onnx"), "--data",
                                   "random:seed=0,count=2,shape=x:1x4", "--jobs", "2"])
    assert res.exit_code == 0, res.output
    assert "evaluations (" in res.output and "peak RSS" in res.output
    report = (tmp_path / "f.report.json").read_text()
    assert '"peak_rss_mb"' in report and '"wall_s"' in report and '"jobs": 2' in report


def _decision_setup(needed_by_sample, hidden=None):
    """Top-1 on 6 samples; sample i flips unless ``needed_by_sample[i]`` are all FP32; the
    other samples keep a wide margin in the start plan. ``hidden``: the same, but only for
    plans with some FP32 node (the start plan does not show it: not monotone)."""
    samples = [SimpleNamespace(feeds={"x": np.full((1, 4), float(i), np.float32)})
               for i in range(6)]
    runs: list[int] = []

    def open_plan(plan: PrecisionPlan, threads: int = 0) -> FakeRunner:
        fp32 = set(plan.fp32_nodes())

        def fn(feeds):
            i = int(feeds["x"][0, 0])
            runs.append(i)
            needed = needed_by_sample.get(i)
            late = (hidden or {}).get(i) if fp32 else None
            if any(n is not None and not n <= fp32 for n in (needed, late)):
                return {"y": np.array([[0.4, 0.6, 0.0]], np.float32)}  # flipped
            return {"y": np.array([[0.9, 0.1, 0.0]], np.float32)}
        return FakeRunner([TensorMeta("x", np.dtype(np.float32), (1, 4))], ["y"], fn)

    reference = {"y": [np.array([[0.9, 0.1, 0.0]], np.float32) for _ in samples]}
    return samples, open_plan, reference, runs


def test_margin_screening_runs_only_samples_at_risk_and_verifies_the_rest():
    from precision_doctor.search.near_ties import at_risk_samples

    objective = Objective(metric=get_metric("top1"), threshold=1.0)
    samples, open_plan, reference, runs = _decision_setup({2: NEEDED})

    def screen(outputs):
        return at_risk_samples(reference, outputs, objective)

    result = search_fp32_set(open_plan, samples, reference, objective,
                             PrecisionPlan(Precision.FP16), NODES, max_evals=60, screen=screen)
    assert set(result.kept) == NEEDED and result.score.passed
    searched = [t for t in result.trials if t.stage in ("grow", "shrink")]
    assert searched and all(t.samples == 1 for t in searched)  # only sample 2 at risk
    assert result.trials[-1].stage == "final" and result.trials[-1].samples == 6
    # sample 4 also needs n9 once any node is FP32, which the start plan cannot show (it is
    # screened out): the final evaluation catches it and the search goes on over every sample
    samples, open_plan, reference, _ = _decision_setup({2: NEEDED}, hidden={4: {"n9"}})
    result = search_fp32_set(open_plan, samples, reference, objective,
                             PrecisionPlan(Precision.FP16), NODES, max_evals=80, screen=screen)
    assert result.score.passed and set(result.kept) == NEEDED | {"n9"}
    final = next(t for t in result.trials if t.stage == "final")
    assert not final.passed and final.samples == 6  # caught there, then searched again


def test_fix_on_ort_cpu_reuses_the_final_evaluation_as_the_verification():
    from precision_doctor.runners.ort import OrtRunner

    model = transformer_block(hot_value=1000.0, opset=13)
    data = random_samples((1, 8, 16), count=2)
    def ort_cpu(m, intra_op_threads=0):
        return OrtRunner(m, ("cpu",), intra_op_threads=intra_op_threads)

    result = fix(model, data, Precision.FP16, TOL, rewrites=[], runner=ort_cpu)
    assert result.passed and result.search.final_outputs is not None
    # same numbers as running the written model again with ONNX Runtime CPU
    with OrtRunner(result.model) as again:
        out = again.run(data[0].feeds)["probs"]
    assert np.array_equal(out, result.search.final_outputs["probs"][0])
