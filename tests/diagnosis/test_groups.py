"""Findings grouped by mechanism and pattern (``diagnosis.causes.groups``)."""

from __future__ import annotations

import json

from precision_doctor.diagnosis.causes.findings import Finding
from precision_doctor.diagnosis.causes.groups import (
    FindingGroup,
    block_ranges,
    entries,
    name_pattern,
    pattern_groups,
)
from precision_doctor.diagnosis.causes.joint import JointCause


def _f(node: str, kind: str = "activation-overflow", op: str = "Pow", size: float = 1e5,
       impact: float | None = 0.0, group: str = "main") -> Finding:
    return Finding(kind, node, op, node, f"{op} {node} overflows", {"ref_max_abs": size},
                   f"keep {node} in FP32", "error", (node, node + "_next"), impact, group)


def test_name_pattern_normalizes_block_indices_but_not_the_last_component():
    assert name_pattern("/encoder/layers.3/self_attn/Pow") == (
        "/encoder/layers.*/self_attn/Pow", (3,))
    assert name_pattern("b12/cast") == ("b*/cast", (12,))
    # the trailing op counter of an exporter is not a block index
    assert name_pattern("p2o.Conv.30")[0] != name_pattern("p2o.Conv.31")[0]
    assert name_pattern("Conv_123") == ("Conv_123", ())


def test_block_ranges():
    assert block_ranges([7, 2, 3, 4, 5, 6]) == "2-7"
    assert block_ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert block_ranges([]) == ""


def test_repeated_findings_form_one_group_per_kind_op_and_pattern():
    findings = [_f(f"/encoder/layers.{b}/self_attn/Pow", size=10.0 ** b) for b in range(2, 8)]
    findings += [_f("/encoder/layers.4/Add", kind="headroom", op="Add"),
                 _f("p2o.Conv.30", op="Conv"), _f("p2o.Conv.31", op="Conv")]
    groups = pattern_groups(findings)
    assert len(groups) == 1
    g = groups[0]
    assert (g.kind, g.op_type, g.pattern) == ("activation-overflow", "Pow",
                                              "/encoder/layers.*/self_attn/Pow")
    assert g.blocks == (2, 3, 4, 5, 6, 7) and g.blocks_text() == "2-7"
    assert g.members == tuple(f.node for f in findings[:6])
    assert g.magnitude == (1e2, 1e7)
    assert g.impact is None  # no measure given
    assert g.remedy == findings[0].remedy


def test_constant_digits_stay_and_kinds_do_not_mix():
    findings = [_f(f"/l1/block.{b}/Pow") for b in (0, 1)] + [
        _f(f"/l1/block.{b}/Pow", kind="headroom") for b in (2, 3)]
    groups = pattern_groups(findings)
    assert [g.pattern for g in groups] == ["/l1/block.*/Pow", "/l1/block.*/Pow"]
    assert [g.kind for g in groups] == ["activation-overflow", "headroom"]
    assert groups[1].blocks == (2, 3)


def test_group_impact_is_measured_jointly_once():
    findings = [_f(f"b{b}/pow", impact=0.0) for b in range(4)]
    calls = []

    def measure(nodes):
        calls.append(tuple(nodes))
        return 0.0 if len(nodes) == 8 else 1.0

    (g,) = pattern_groups(findings, measure, baseline=1.0)
    assert g.impact == 1.0 and len(calls) == 1
    assert set(calls[0]) == {n for f in findings for n in f.nodes}
    # unmeasured members (warnings): no measurement
    assert pattern_groups([_f("b0/x", impact=None), _f("b1/x", impact=None)], measure,
                          1.0)[0].impact is None and len(calls) == 1


def test_a_joint_cause_is_one_group_even_across_patterns():
    findings = [_f("b0/cast", op="Cast"), _f("b1/cast", op="Cast"), _f("b1/pow"),
                _f("c0/x", kind="headroom")]
    joint = JointCause((("activation-overflow", "b0/cast"), ("activation-overflow", "b1/cast"),
                        ("activation-overflow", "b1/pow")), (), 0.99, (0.0, 0.0, 0.0))
    (g,) = pattern_groups(findings, joint=joint)
    assert g.joint and g.impact == 0.99 and g.op_type == ""
    assert g.pattern == "b*/cast + b1/pow" and g.blocks == (0, 1)
    assert g.members == ("b0/cast", "b1/cast", "b1/pow")


def test_round_trip():
    (g,) = pattern_groups([_f("b0/pow", size=3.0), _f("b1/pow", size=9e8)])
    d = json.loads(json.dumps(g.to_dict()))
    assert FindingGroup.from_dict(d) == g
    assert d["blocks"] == [0, 1] and d["magnitude"] == [3.0, 9e8]


def test_entries_list_each_group_once_at_its_first_member():
    findings = [_f("b0/cast", op="Cast"), _f("x/other", kind="headroom"),
                _f("b1/cast", op="Cast"), _f("b2/cast", op="Cast")]
    groups = pattern_groups(findings)
    listed = entries(findings, groups)
    assert listed == [groups[0], findings[1]]
    # a review removed all but one member: the finding is shown on its own
    assert entries(findings[:2], groups) == findings[:2]
