"""Outputs whose shape depends on the data: a VITS-like duration model whose FP16 run changes
the audio's length, by a near-tie flip of one rounded duration or by a destroyed predictor."""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import precision_doctor as pd
from precision_doctor.compare.metrics import compute_metrics, relative_l2
from precision_doctor.compare.tolerance import Tolerance, check
from precision_doctor.diagnosis.lengths.measure import boundary, ulp
from precision_doctor.diagnosis.lengths.sites import decision_sites, input_cone
from precision_doctor.diagnosis.report import DiagnosisReport
from precision_doctor.formats import Precision
from precision_doctor.graph.random_ops import seed_random_ops, unseeded_random_ops
from precision_doctor.search.objective import Objective
from tests.duration_models import duration_model, phonemes
from tests.tiny_models import make_model


def lengths_of(model, feeds) -> list[tuple[int, ...]]:
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return [session.run(None, f)[0].shape for f in feeds]


@pytest.fixture(scope="module")
def near_tie():
    return pd.diagnose(duration_model(), phonemes(), target="fp16", quiet=True, device="cpu")


@pytest.fixture(scope="module")
def destroyed():
    return pd.diagnose(duration_model(scale=3e3), phonemes(), target="fp16", quiet=True,
                       device="cpu")


def test_a_near_tie_duration_flip_is_a_decision_flip_with_its_cure(near_tie) -> None:
    lengths = near_tie.lengths
    assert near_tie.verdict == "fail" and lengths is not None
    assert lengths.changes and {c.output for c in lengths.changes} == {"audio"}
    change = lengths.changes[0]
    assert change.reference != change.candidate and len(change.reference) == 3
    assert lengths.roots == ("dp/ceil",) and lengths.reading == "near-tie"
    d = lengths.decisions[0]
    assert d.rounding == "Ceil" and d.sets_shape and d.max_step == 1
    assert 0 < d.changed <= 2 and d.boundary_ulps <= 3 * max(d.typical_ulps, 0.5)
    assert lengths.cured and "dp/exp" in lengths.cure_nodes
    assert near_tie.assessment.kind == "decision-flips"
    assert "near-tie" in near_tie.assessment.summary
    assert "shorter" in lengths.summary or "longer" in lengths.summary
    audio = next(o for o in near_tie.outputs if o.name == "audio")
    assert audio.metrics.shape_changed == len(lengths.changes)
    assert math.isinf(audio.metrics.rel_l2) and not audio.metrics.finite_statistics


def test_a_destroyed_duration_predictor_gets_its_measured_cause(destroyed) -> None:
    lengths = destroyed.lengths
    assert lengths is not None and lengths.reading == "destroyed"
    assert len(lengths.changes) == 3  # every phrase has another length
    assert lengths.decisions[0].total_ratio < 0.5
    a = destroyed.assessment
    assert a.kind == "defect" and "destroyed" in a.summary
    assert "dp/norm/square" in a.nodes  # the overflowing sum of squares, not the whole cone
    assert destroyed.explained_share is not None and destroyed.explained_share >= 0.9


def test_the_length_report_round_trips_through_json(near_tie) -> None:
    again = DiagnosisReport.from_dict(near_tie.to_dict())
    assert again.lengths == near_tie.lengths
    assert again.outputs == near_tie.outputs


def test_a_changed_shape_is_counted_not_compared() -> None:
    ref = [np.ones((1, 8), np.float32), np.ones((1, 6), np.float32)]
    cand = [np.ones((1, 8), np.float32) * 1.001, np.ones((1, 5), np.float32)]
    m = compute_metrics(ref, cand)
    assert m.shape_changed == 1 and math.isinf(m.rel_l2) and m.numel == 8
    assert m.max_abs == pytest.approx(1e-3, rel=1e-3)  # over the equal-shaped sample
    assert check(m, Tolerance(1e-2))[0] is False
    assert math.isinf(relative_l2(ref, cand))
    score = Objective({"*": Tolerance(1e-2)}).score({"y": ref}, {"y": cand})
    assert not score.passed and math.isinf(score.value)
    assert score.detail["shape_changed"] == {"y": [1]}
    stream = Objective({"*": Tolerance(1e-2)}).stream({"y": ref})
    assert not stream.add(0, {"y": cand[0]}) and stream.add(1, {"y": cand[1]})


def test_decision_sites_and_their_rounding_boundaries() -> None:
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    n = helper.make_node
    model = make_model(
        [n("Round", ["x"], ["r0"], name="round"), n("Clip", ["r0", "zero"], ["r"], name="clip"),
         n("Cast", ["r"], ["ri"], name="cast", to=i64),
         n("ArgMax", ["x"], ["am"], name="argmax", axis=1),
         n("Greater", ["x", "zero"], ["gt"], name="gt"),
         n("NonZero", ["gt"], ["nz"], name="nonzero"),
         n("Relu", ["x"], ["y"], name="relu")],
        [helper.make_tensor_value_info("x", f, [2, 4])],
        [helper.make_tensor_value_info(k, t, s) for k, t, s in
         (("ri", i64, [2, 4]), ("am", i64, [2]), ("nz", i64, [2, "n"]), ("y", f, [2, 4]))],
        [helper.make_tensor("zero", f, [], [0.0])], opset=17)
    sites = {s.node: s for s in decision_sites(model)}
    assert set(sites) == {"round", "argmax", "gt"}  # the Round is the Cast's site
    assert sites["round"].rounding == "Round" and sites["round"].source == "x"
    assert sites["gt"].sets_shape and not sites["round"].sets_shape
    assert input_cone(model, ["r"]) == ["round", "clip"]
    assert boundary(np.array([2.4, 2.6]), "Round").tolist() == [2.5, 2.5]
    assert boundary(np.array([2.999, -1.2]), "Ceil").tolist() == [3.0, -1.0]
    assert ulp(np.array([3.0]), Precision.FP16)[0] == 2.0 ** -9  # 10 fraction bits, 2^1


def noisy_duration_model():
    """``duration_model`` with VITS' noise on: the log-durations get RandomNormalLike noise
    without a seed, so two FP32 runs differ."""
    model = duration_model()
    g = model.graph
    i = next(k for k, node in enumerate(g.node) if node.name == "dp/exp")
    g.node[i].input[0] = "logw_noisy"
    g.node.insert(i, helper.make_node("Add", ["logw", "noise_s"], ["logw_noisy"],
                                      name="dp/add_noise"))
    g.node.insert(i, helper.make_node("Mul", ["noise", "noise_scale"], ["noise_s"],
                                      name="dp/noise_scale"))
    g.node.insert(i, helper.make_node("RandomNormalLike", ["logw"], ["noise"],
                                      name="dp/noise"))
    g.initializer.append(helper.make_tensor("noise_scale", TensorProto.FLOAT, [], [0.8]))
    return model


def test_unseeded_random_operators_are_seeded_and_said() -> None:
    model = noisy_duration_model()
    assert unseeded_random_ops(model) == ["dp/noise"]
    feeds = phonemes()
    assert len(set(lengths_of(model, [feeds[2]] * 6))) > 1  # unseeded: varies run to run
    seeded, names = seed_random_ops(model)
    assert names == ("dp/noise",) and not unseeded_random_ops(seeded)
    assert lengths_of(seeded, feeds) == lengths_of(seeded, feeds)
    d = pd.diagnose(model, feeds, target="fp16", quiet=True, device="cpu", noise=False)
    assert any("seed" in w and "dp/noise" in w for w in d.warnings)
def test_fix_writes_a_model_that_keeps_the_reference_lengths() -> None:
    model, feeds = duration_model(), phonemes()
    fixed = pd.fix(model, feeds, target="fp16", quiet=True, device="cpu")
    assert fixed.verdict == "pass" and fixed.plan.fp32_nodes()
    assert lengths_of(fixed.model, feeds) == lengths_of(model, feeds)




def test_fix_draws_the_same_noise_in_every_run_and_writes_the_random_operator_back() -> None:
    model = noisy_duration_model()
    feeds = phonemes()
    fixed = pd.fix(model, feeds, target="fp16", quiet=True, device="cpu")
    assert fixed.verdict == "pass"
    assert any("drew the same numbers" in n for n in fixed.report["notes"])
    assert unseeded_random_ops(fixed.model) == ["dp/noise"]  # deployed as the user's
    assert not any("noise-table" in n.name for n in fixed.model.graph.node)
    assert len(set(lengths_of(fixed.model, [feeds[2]] * 6))) > 1  # it draws again


def test_a_determinized_random_operator_draws_the_same_numbers_every_run() -> None:
    from precision_doctor.graph.random_ops import determinize, restore_random_ops

    model = noisy_duration_model()
    fixed, originals = determinize(model)
    assert list(originals) == ["dp/noise"] and not unseeded_random_ops(fixed)
    feeds = phonemes()
    assert len(set(lengths_of(fixed, [feeds[2]] * 4))) == 1
    assert lengths_of(fixed, feeds[::-1]) == lengths_of(fixed, feeds)[::-1]  # any order
    back = restore_random_ops(fixed, originals)
    assert [n.op_type for n in back.graph.node if n.name == "dp/noise"] == ["RandomNormalLike"]


def test_the_noise_floor_repeats_a_model_with_random_operators() -> None:
    from precision_doctor.diagnosis.noise import measure_noise_floor

    model, _ = seed_random_ops(noisy_duration_model())
    feeds = phonemes()
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    reference = {"audio": [session.run(None, f)[0] for f in feeds]}
    floor = measure_noise_floor(model, feeds, reference)
    assert "repeat" in floor.probes and "fp64" in floor.skipped
    assert not floor.nondeterministic  # seeded: the same draws in a new session
    again = {"audio": [session.run(None, f)[0] for f in feeds]}  # the session's next draws
    assert measure_noise_floor(model, feeds, again).nondeterministic


def test_the_html_report_shows_the_lengths_escaped(near_tie, tmp_path) -> None:
    path = tmp_path / "d.html"
    near_tie.to_html(path)
    page = path.read_text()
    assert 'id="lengths"' in page and "dp/ceil" in page and "near-tie" in page
    assert "shape changed on 1 sample(s)" in page
