"""Periodic functions of large arguments, and the report of a model destroyed by range, on the
tiny models of ``periodic_models`` (a diffusion UNet's timestep embedding and residual blocks)."""

from __future__ import annotations

import math

import pytest
from periodic_models import timestep_embedding, timestep_samples

import precision_doctor as pd
from precision_doctor.diagnosis.causes.findings import Finding
from precision_doctor.diagnosis.causes.mechanisms import (
    NodeFacts,
    name_mechanism,
    periodic_rule,
    phase_limit,
    spacing,
)


def test_spacing_and_the_phase_limit():
    u16, ubf16 = 2.0 ** -11, 2.0 ** -8
    assert spacing(1000.0, u16) == 0.5  # FP16 numbers in [512, 1024) are 0.5 apart
    assert spacing(127.9, u16) == 2.0 ** -4 and spacing(128.0, u16) == 2.0 ** -3
    assert phase_limit(u16) == 128.0 and phase_limit(ubf16) == 16.0
    assert periodic_rule("Sin", 127.9, u16) is None
    assert "0.125 rad" in periodic_rule("Cos", 128.0, u16)
    assert periodic_rule("Exp", 1e3, u16) is None
    assert spacing(0.0, u16) == 0.0 and spacing(math.inf, u16) == 0.0


def test_name_mechanism_reads_the_argument():
    import numpy as np

    big = NodeFacts("s", "Sin", gain=1.0, ref_inputs=[np.array([10.0, -900.0])])
    named = name_mechanism(big)
    assert named is not None and named.kind == "periodic-argument"
    assert named.evidence["argument_max_abs"] == 900.0
    small = NodeFacts("s", "Sin", gain=1.0, ref_inputs=[np.array([10.0, -90.0])])
    assert name_mechanism(small) is None


@pytest.fixture(scope="module")
def embedding():
    return pd.diagnose(timestep_embedding(), [s.feeds for s in timestep_samples()],
                       target="fp16", quiet=True, device="cpu")


def test_timestep_embedding_is_a_periodic_argument_defect(embedding):
    d = embedding
    assert d.verdict == "fail" and d.assessment.kind == "defect"
    top = d.findings[0]
    assert top.kind == "periodic-argument" and top.group == "main"
    # the cure keeps the argument FP32 through Sin and Cos: the Mul and both periodic ops
    assert set(top.nodes) == {"/time_embed/Mul", "/time_embed/Sin", "/time_embed/Cos"}
    assert top.impact is not None and top.impact > 0.9
    assert top.evidence["argument_max_abs"] == pytest.approx(1000.0)
    assert top.evidence["spacing"] == 0.5
    assert "reduce-periodic-argument" in top.remedy
    assert d.assessment.evidence["defect_kind"] == "periodic-argument"
    assert not [f for f in d.findings if f.kind == "unnamed-mechanism"]


def test_unexplained_is_never_said_beside_an_explained_share_of_half():
    from dataclasses import replace

    from precision_doctor.diagnosis.assess import assess
    from precision_doctor.diagnosis.assessment import AssessmentInputs
    from precision_doctor.diagnosis.causes.findings import Finding
    from precision_doctor.formats import Precision

    warn = Finding("headroom", "n", "Add", "t", "close to the max", {}, "keep n in FP32",
                   "warning", ("n",), 0.0, "minor")
    x = AssessmentInputs(False, (("y", 0.5, 0.01, False, 0),), Precision.FP16, depth=100,
                         findings=(warn,), measured=True, explained_share=0.2)
    assert assess(x).kind == "unexplained"
    cured = assess(replace(x, explained_share=1.0))
    assert cured.kind == "defect" and cured.explained_share == 1.0
    assert "Not explained" not in cured.summary and "removes 100.0%" in cured.summary


def _f(node: str, op: str = "Add", size: float = 1e5) -> Finding:
    return Finding("activation-overflow", node, op, node, f"{op} {node} overflows",
                   {"ref_max_abs": size}, f"keep {node} in FP32", "error", (node,), 0.0)


def test_findings_group_by_region_across_ops_and_names():
    from precision_doctor.diagnosis.causes.groups import pattern_groups, region_of

    assert region_of("output_blocks.3.output_blocks.3.0") == ("output_blocks.*", 3)
    assert region_of("encoder.layers.3.self_attn") == ("encoder.layers.*", 3)
    assert region_of("p2o") is None and region_of(None) is None and region_of("3.x") is None
    findings = [_f(f"/output_blocks.{b}/output_blocks.{b}.0/Add", size=7.1e4 * (b + 1))
                for b in range(8)]
    findings += [_f(f"/output_blocks.{b}/output_blocks.{b}.1/conv/Conv", "Conv", 6.2e6)
                 for b in range(8, 16)]
    findings.append(_f("p2o.Conv.30", "Conv"))
    (g,) = pattern_groups(findings)
    assert g.pattern == "output_blocks.*" and g.blocks == tuple(range(16))
    assert g.op_type == "" and len(g.members) == 16 and g.magnitude == (7.1e4, 6.2e6)
    # the exporter's module metadata decides where it is given
    some = findings[:2] + findings[8:10]
    modules = {f.node: f"decoder.up.{i % 2}.conv" for i, f in enumerate(some)}
    (g,) = pattern_groups(some, modules=modules)
    assert g.pattern == "decoder.up.*" and g.blocks == (0, 1)
    # one pattern is still a pattern group, with its name
    (g,) = pattern_groups(findings[:3])
    assert g.pattern == "/output_blocks.*/output_blocks.*.0/Add" and g.blocks == (0, 1, 2)


@pytest.fixture(scope="module")
def unet():
    from periodic_models import diffusion_unet, unet_samples

    return pd.diagnose(diffusion_unet(), [s.feeds for s in unet_samples()], target="fp16",
                       quiet=True, device="cpu")


def test_destroyed_unet_is_a_defect_with_a_joint_cause(unet):
    d = unet
    assert d.verdict == "fail" and d.assessment.kind == "defect"
    assert d.explained_share == 1.0
    joint = d.joint_cause
    assert joint is not None and len(joint["members"]) == 25 and joint["share"] == 1.0
    assert {m["kind"] for m in joint["members"]} == {"activation-overflow"}
    assert "25 independent causes" in d.assessment.summary
    assert "Not explained" not in d.assessment.summary
    # the lost phase of the timestep embedding: 0% alone (the output stays NaN), most of what
    # the joint cure leaves
    (periodic,) = [f for f in d.findings if f.kind == "periodic-argument"]
    assert periodic.group == "main" and periodic.evidence["residual_share"] > 0.9
    assert periodic.evidence["residual_before"] > 0.01  # the joint cure alone still fails
    assert d.assessment.evidence["residual_kind"] == "periodic-argument"
    assert set(periodic.nodes) <= set(d.assessment.nodes)


def test_every_finding_has_a_share_or_a_reason(unet):
    assert unet.findings
    for f in unet.findings:
        assert f.impact is not None or f.not_measured, f.node
    for g in unet.finding_groups:
        assert g.impact is not None or g.not_measured, g.pattern
    again = pd.Diagnosis.from_dict(unet.to_dict())
    assert [f.not_measured for f in again.findings] == [f.not_measured for f in unet.findings]


def test_the_terminal_diagnosis_fits_120_lines_of_80_columns(unet):
    from rich.console import Console

    from precision_doctor.report.terminal.diagnosis import render_diagnosis

    console = Console(width=80, record=True, color_system=None)
    render_diagnosis(unet, console)
    lines = console.export_text().splitlines()
    assert len(lines) <= 120
    assert max(len(line.encode()) for line in lines) <= 80  # columns, and bytes too
    text = "\n".join(lines)
    # the all-NaN output: its counts, no finite-looking statistics
    assert "NaN/Inf 256/0" in text and "max abs n/a" in text
    assert "max abs 0 " not in text and "SNR dB inf" not in text
    assert "periodic-argument" in text and "25 independent causes" in text


def test_the_html_shows_no_statistics_of_a_nan_output(unet):
    from precision_doctor.report.html import render_html

    page = render_html(unet)
    assert "not computed: 256 NaN, 0 Inf of 256 values" in page
    assert "not measured: " in page or all(f.impact is not None for f in unet.findings)


class _Timed:
    """A measure with a budget of ``calls`` new measurements (as ``ImpactTrials.affordable``
    reads its wall time)."""

    seconds = 60.0

    def __init__(self, calls: int) -> None:
        self.left, self.errors = calls, {}

    def affordable(self, nodes) -> bool:
        return frozenset(nodes) in self.errors or self.left > 0

    def __call__(self, nodes) -> float:
        key = frozenset(nodes)
        if key not in self.errors:
            self.left -= 1
            self.errors[key] = 0.0 if "a" in key else 1.0
        return self.errors[key]


def test_findings_beyond_the_budget_say_where_it_went():
    from dataclasses import replace

    from precision_doctor.diagnosis.causes.trials import rank_findings

    findings = [replace(_f(n), impact=None) for n in ("a", "b", "c", "d")]
    ranked = rank_findings(findings, _Timed(2), 1.0)
    measured = [f for f in ranked if f.impact is not None]
    assert [f.node for f in measured] == ["a", "b"] and measured[0].impact == 1.0
    for f in ranked[2:]:
        assert f.impact is None
        assert f.not_measured == "the 60 s findings budget went to the 2 findings measured before"


def test_what_one_cure_leaves_of_a_destroyed_output_is_measured_too():
    """One overflowing block: its cure alone makes the output finite (100% of an infinite
    error); the lost phase behind it is measured on top of that cure."""
    from periodic_models import diffusion_unet, unet_samples

    d = pd.diagnose(diffusion_unet(inputs=0, outputs=0), [s.feeds for s in unet_samples()],
                    target="fp16", quiet=True, device="cpu")
    assert d.assessment.kind == "defect" and d.joint_cause is None
    (periodic,) = [f for f in d.findings if f.kind == "periodic-argument"]
    assert periodic.group == "main" and periodic.evidence["residual_share"] > 0.9
    assert periodic.evidence["residual_cure"].startswith("activation-overflow at ")
    assert "What its cure leaves" in d.assessment.summary


def test_twelve_overflowing_residual_blocks_are_one_joint_entry():
    from periodic_models import destroyed_residual, noise_samples
    from rich.console import Console

    from precision_doctor.report.terminal.diagnosis import render_diagnosis

    d = pd.diagnose(destroyed_residual(), [s.feeds for s in noise_samples()], target="fp16",
                    quiet=True, device="cpu")
    assert d.assessment.kind == "defect" and len(d.joint_cause["members"]) == 12
    console = Console(width=80, record=True, color_system=None)
    render_diagnosis(d, console)
    text = console.export_text()
    assert "12 independent causes" in text
    assert "/output_blocks.*/branch/MatMul in blocks 0-11 (12 nodes)" in text.replace("\n", " ")
    assert max(len(line) for line in text.splitlines()) <= 80
