"""Joint causes (``diagnosis.causes.joint``): independent NaN sources cured only together."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_models import quantized_block, write_quantized_block

import precision_doctor as pd
from precision_doctor.diagnosis.causes.findings import Finding
from precision_doctor.diagnosis.causes.joint import _reduce, find_joint_cause


def test_reduction_finds_the_minimal_jointly_sufficient_set():
    needed = {2, 5, 7}
    calls = []

    def passes(subset):
        calls.append(tuple(subset))
        return needed <= set(subset)

    assert sorted(_reduce(list(range(24)), passes)) == [2, 5, 7]
    assert len(calls) <= 20  # irrelevant findings go by halves (one at a time: 24)
    assert sorted(_reduce(list(range(6)), lambda s: True)) == [0]  # the empty set never passes
    every = list(range(6))
    assert _reduce(every, lambda s: set(s) == set(every)) == every  # all needed


def _finding(node: str, impact: float) -> Finding:
    return Finding("activation-overflow", node, "Cast", node, "", {}, "", "error", (node,),
                   impact)


def test_joint_cause_only_when_no_single_cure_explains():
    # three NaN sources: the output is finite only when all three are in FP32
    sources = {"a", "b", "c"}

    def measure(nodes):
        return 0.01 if sources <= set(nodes) else float("inf")

    findings = [_finding(n, 0.0) for n in ("a", "b", "c", "d")]
    joint = find_joint_cause(findings, measure, float("inf"), 1.0)
    assert joint is not None
    assert [n for _, n in joint.members] == ["a", "b", "c"]
    assert joint.share == 1.0 and max(joint.alone) == 0.0
    # one finding alone already explains it: no joint group
    alone = [_finding("a", 0.95), _finding("b", 0.0)]
    assert find_joint_cause(alone, measure, float("inf"), 1.0) is None


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    return write_quantized_block(tmp_path_factory.mktemp("quantized"), blocks=3)


def test_quantized_encoder_is_a_defect_of_independent_causes(quantized):
    d = pd.diagnose(*quantized, target="fp16")
    assert d.verdict == "fail"
    assert d.assessment.kind == "defect"
    assert d.explained_share is not None and d.explained_share >= 0.9
    assert d.joint_cause is not None and len(d.joint_cause["members"]) == 3
    assert {m["node"] for m in d.joint_cause["members"]} == {"b0/cast", "b1/cast", "b2/cast"}
    assert "3 independent causes" in d.assessment.summary
    assert pd.Diagnosis.from_dict(d.to_dict()).joint_cause == d.joint_cause


def test_fix_cures_the_quantized_encoder(quantized):
    f = pd.fix(*quantized, target="fp16")
    assert f.passed
    assert {"b0/cast", "b1/cast", "b2/cast"} <= set(f.fp32_nodes)


def test_unmask_finds_a_cause_hidden_behind_the_first():
    """Block 1's overflow is never *born* in the plain layerwise comparison (block 0's Inf has
    already made everything NaN); once block 0's cure runs in FP32 it is."""
    from tiny_models import S

    from precision_doctor.diagnosis.causes.joint import unmask
    from precision_doctor.diagnosis.causes.trials import ImpactTrials
    from precision_doctor.formats import Precision
    from precision_doctor.layerwise.candidates import emulated, reference_factory, run_samples
    from precision_doctor.precision.plan import PrecisionPlan

    model = quantized_block(blocks=2)
    x = np.random.default_rng(1).uniform(0, 1, (1, 8, 64)).astype(np.float32)
    samples = [S("s0", {"x": x})]
    reference = run_samples(reference_factory(model), samples, ["y"])
    candidate = emulated(PrecisionPlan(Precision.FP16))
    measure = ImpactTrials(model, candidate.plan, candidate.conv_bias, samples, reference, ["y"])
    first = Finding("activation-overflow", "b0/cast", "Cast", "b0/accf", "", {}, "", "error",
                    ("b0/cast", "b0/deq"))
    found = unmask(model, {"x": x}, candidate, [first], measure, float("inf"), 1e-2)
    assert [f.node for f in found] == ["b1/cast"]
    assert found[0].evidence["found_by"] == "unmasking"
    assert np.isfinite(measure(["b0/cast", "b0/deq", *found[0].nodes]))
