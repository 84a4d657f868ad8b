"""``fix`` reports headlined by the objective the user set; causes the fix removed never shown
as the fixed model's (once the demo's fix.html said FAIL, "Main cause: BatchNormalization").

The model: Conv -> BatchNormalization (running variance 9.8e7, out of FP16 range: ``fix`` folds
it into the Conv) -> y - 0.999 * y (a cancellation: 0.999 rounds to 0.99902 in FP16, so the
difference is 2% off even in the fixed model) -> Relu. With the objective rel L2 <= 0.5 the fix
passes; against the default 1e-2 tolerance the fixed model still fails, for the cancellation.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import replace

import onnx
import pytest
from onnx import helper
from rich.console import Console
from tiny_models import conv_bn, random_samples, tensor
from typer.testing import CliRunner

from precision_doctor import cli
from precision_doctor.compare.tolerance import Tolerance
from precision_doctor.diagnosis.diagnose import diagnose
from precision_doctor.formats import Precision
from precision_doctor.layerwise.candidates import onnxruntime
from precision_doctor.numbers import fmt_vs
from precision_doctor.repair.pipeline import fix
from precision_doctor.repair.review import review_fixed_diagnosis
from precision_doctor.report.terminal.fix import render_fix
from precision_doctor.search.objective import Objective

LOOSE = Objective(tolerances={"*": Tolerance(rel_l2=0.5)})


def bn_then_cancellation() -> onnx.ModelProto:
    model = conv_bn()
    g = model.graph
    relu = next(n for n in g.node if n.op_type == "Relu")
    relu.input[0] = "diff"
    g.node.insert(2, helper.make_node("Mul", ["bn", "near_one"], ["scaled"], name="scale"))
    g.node.insert(3, helper.make_node("Sub", ["bn", "scaled"], ["diff"], name="cancel"))
    g.initializer.append(tensor("near_one", 0.999))
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def fixed():
    model = bn_then_cancellation()
    samples = random_samples((1, 3, 8, 8))
    result = fix(model, samples, Precision.FP16, LOOSE)
    after = diagnose(model, samples, Precision.FP16,
                     onnxruntime(["cpu"], model=result.model, name="ort-cpu-fixed"),
                     noise=False, measure_impact=False)
    return model, result, after


def test_the_folded_batchnorm_is_a_resolved_cause_not_a_finding(fixed):
    _, result, after = fixed
    assert result.passed and not after.passed  # the objective vs the default tolerance
    assert any(f.node == "bn" for f in after.findings)  # what the old fix.html headlined
    kept, resolved = review_fixed_diagnosis(after, result.model, result.plan, result.rewrites,
                                            result.writer)
    assert not any("bn" in (f.node, *f.nodes) for f in kept.findings)
    assert not any(h.node == "bn" for h in kept.hazards)
    assert [(c.kind, c.node, c.how) for c in resolved] == [
        ("parameter-out-of-range", "bn", "removed by the fold-batchnorm rewrite")]
    assert [f.node for f in kept.findings] == ["cancel"]  # the real remaining cause stays
    # a node the plan keeps in FP32 is resolved too
    plan = result.plan.keep_fp32(["cancel"], "user", "test")
    kept, resolved = review_fixed_diagnosis(after, result.model, plan, result.rewrites,
                                            result.writer)
    assert not kept.findings
    assert ("cancel", "kept in FP32 by the fix") in {(c.node, c.how) for c in resolved}


def test_terminal_headline_is_the_objective_at_80_columns(fixed):
    _, result, _ = fixed
    console = Console(width=80, record=True, force_terminal=False, color_system=None)
    render_fix(result, console)
    text = console.export_text()
    assert text.startswith("PASS FP16 fix against the objective: *: rel_l2 <= 0.5")
    after = fmt_vs(result.score_after.value, 1.0, False)
    assert f"fixed {after} (pass)" in text and "(fail)" in text
    assert "…" not in text and "after emu" in text


def _visible(page: str) -> str:
    body = re.sub(r"<style.*?</style>|<script.*?</script>|<svg.*?</svg>", "", page, flags=re.S)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body)))


def test_fix_html_headline_is_the_objective_with_before_after(monkeypatch, tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(bn_then_cancellation(), str(model))
    page = tmp_path / "fix.html"
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(cli, "console", Console())
    res = CliRunner().invoke(cli.app, [
        "fix", str(model), "-o", str(tmp_path / "f.onnx"), "--data",
        "random:seed=0,count=2,shape=x:1x3x8x8", "--tolerance", "rel_l2=0.5", "--html",
        str(page)], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert "…" not in res.output and res.output.startswith("PASS FP16 fix against the objective")
    report = json.loads((tmp_path / "f.report.json").read_text())
    text = _visible(page.read_text())
    assert "<title>PASS: m.onnx" in page.read_text()
    head, _, secondary = text.partition("Fixed model against the default tolerance")
    before = fmt_vs(report["score_before"]["value"], 1.0, False)
    after = fmt_vs(report["score_after"]["value"], 1.0, False)
    assert re.search(r"PASS m\.onnx fixed for FP16 judged against the objective you set: "
                     r"\*: rel_l2 <= 0\.5", head)
    assert f"original model, naive FP16 (emulated) {before} fail" in head
    assert f"fixed model (its exact emulation on ONNX Runtime CPU) {after} pass" in head
    assert "Causes the fix removed" in head and "removed by the fold-batchnorm rewrite" in head
    # the default-tolerance diagnosis is secondary, labelled, and never names the folded BN
    assert secondary and "secondary" in secondary[:40] and "FAIL" in secondary
    assert "Main cause" not in text
    assert "Largest remaining cause: cancellation Sub cancel" in secondary
    assert "BatchNormalization bn" not in secondary.split("Static hazards")[0]


def test_plain_diagnosis_html_keeps_its_own_verdict(fixed):
    from precision_doctor.report.html import render_html

    _, _, after = fixed
    # a report without an assessment (schema v1) names its top finding as the main cause
    page = render_html(replace(after, findings=after.findings[:1], assessment=None))
    assert "<title>FAIL:" in page and "Main cause" in _visible(page)
    # with an assessment, a "main cause" is only named for a defect
    page = render_html(replace(after, findings=after.findings[:1]))
    assert "<title>FAIL:" in page
    kind = after.assessment.kind if after.assessment else None
    assert ("Main cause" in _visible(page)) == (kind == "defect")
