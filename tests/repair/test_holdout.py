"""Held-out evaluation of ``fix`` (``repair.holdout``): the split is deterministic, every target
scores the written model on samples the search never saw, and a plan that only the search
samples pass is reported as overfitting."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper
from tiny_models import S, make_model, tensor
from typer.testing import CliRunner

import precision_doctor as pd
from precision_doctor.cli import app
from precision_doctor.errors import InputError
from precision_doctor.repair.holdout import HoldoutCheck, default_holdout, split_holdout


def _scaled_matmul(scale: float = 1000.0):
    """``y = (x @ W) * scale / scale``: a MatMul (quantizable) whose product overflows FP16
    once ``|x @ W| * scale`` passes 65504, so only large inputs need ``up`` in FP32."""
    rng = np.random.default_rng(0)
    f = TensorProto.FLOAT
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Mul", ["h", "scale"], ["u"], name="up"),
             helper.make_node("Div", ["u", "scale"], ["y"], name="down")]
    inits = [tensor("w", np.eye(8) + rng.normal(0, 0.05, (8, 8))), tensor("scale", scale)]
    return make_model(nodes, [helper.make_tensor_value_info("x", f, [1, 8])],
                      [helper.make_tensor_value_info("y", f, [1, 8])], inits)


def _samples(count: int, seed: int = 1) -> list[S]:
    rng = np.random.default_rng(seed)
    return [S(f"s{i}", {"x": rng.standard_normal((1, 8)).astype(np.float32)})
            for i in range(count)]


def test_split_is_deterministic_disjoint_and_follows_the_default_rule():
    samples = _samples(20)
    a, b = split_holdout(samples), split_holdout(list(samples))
    assert a.held_indices == b.held_indices and len(a.held) == default_holdout(20) == 2
    names = {s.name for s in a.search}
    assert not names & {s.name for s in a.held} and len(names) + len(a.held) == 20
    assert [s.name for s in a.held] == [samples[i].name for i in a.held_indices]
    assert split_holdout(samples, seed=1).held_indices != a.held_indices  # seeded
    assert default_holdout(7) == 0 and default_holdout(8) == 1 and default_holdout(35) == 3
    assert split_holdout(samples[:3]).held == () and split_holdout(samples, 0).held == ()
    with pytest.raises(InputError, match="no sample for the search"):
        split_holdout(samples[:3], 3)
    with pytest.raises(InputError):
        split_holdout(samples[:3], -1)


@pytest.mark.parametrize("target", ["fp16", "bf16", "int8", "fp8"])
def test_every_target_scores_the_written_model_on_the_held_out_samples(target):
    fix = pd.fix_quantized if target in ("int8", "fp8") else pd.fix
    fixed = fix(_scaled_matmul(1.0), [s.feeds for s in _samples(4)], target=target, holdout=1,
                quiet=True)
    held = fixed.report["holdout"]  # INT8/FP8: out of the evaluation samples
    assert held["samples"] == 1 and held["search_samples"] >= 1 and held["chosen"] == "requested"
    assert len(held["names"]) == 1 and held["names"][0].startswith("data[")
    assert held["passed"] is True and held["score"] is not None and not held["overfits"]
    assert fixed.report["verdict"] == "pass" and fixed.passed
    assert HoldoutCheck.from_dict(json.loads(json.dumps(held))).to_dict() == held


def test_few_samples_are_not_held_out_and_the_report_says_so():
    fixed = pd.fix(_scaled_matmul(1.0), [s.feeds for s in _samples(3)], quiet=True)
    held = fixed.report["holdout"]
    assert held["samples"] == 0 and held["chosen"] == "off" and held["passed"] is None
    assert "not checked on unseen samples" in held["message"] and fixed.passed


def test_a_plan_that_only_the_search_samples_pass_overfits(tmp_path):
    """One sample drives ``up`` past FP16's range: held out, the search keeps nothing in FP32
    and the written model overflows on it."""
    samples = _samples(4)
    split = split_holdout([S(f"data[{i}]", s.feeds) for i, s in enumerate(samples)], 1)
    big = split.held_indices[0]
    feeds = [s.feeds for s in samples]
    feeds[big] = {"x": feeds[big]["x"] * 0 + 200.0}  # 200 * 1000 > 65504
    fixed = pd.fix(_scaled_matmul(), feeds, holdout=1, quiet=True)
    held = fixed.report["holdout"]
    assert held["indices"] == [big] and held["passed"] is False and held["overfits"]
    assert fixed.report["verdict"] == "overfits" and not fixed.passed
    assert fixed.report["score_after"]["passed"] and "more" in held["message"]
    # the same samples with nothing held out: the search sees the large one and keeps ``up``
    assert "up" in pd.fix(_scaled_matmul(), feeds, holdout=0, quiet=True).fp32_nodes
    cli = split_holdout([S(f"s{i}.npy", f) for i, f in enumerate(feeds)], 1).held_indices[0]
    feeds[big], feeds[cli] = feeds[cli], feeds[big]  # the CLI holds out s<cli>.npy
    (tmp_path / "data").mkdir()
    for i, f in enumerate(feeds):
        np.save(tmp_path / "data" / f"s{i}.npy", f["x"])
    out = CliRunner().invoke(app, ["fix", str(_save(tmp_path)), "-o", str(tmp_path / "f.onnx"),
                                   "--data", str(tmp_path / "data"), "--holdout", "1"])
    assert out.exit_code == 1, out.output
    assert "OVERFITS" in out.output and "held out" in out.output


def _save(folder):
    import onnx

    path = folder / "m.onnx"
    onnx.save(_scaled_matmul(), path)
    return path
