"""HTML report: escaping of untrusted names, structure, plots, fix section (no browser needed).

The report under test comes from the real ``diagnose`` on a tiny model whose node, tensor and
output names carry HTML/script payloads and whose Pow overflows FP16 (x up to 1000, x^2 up to
1e6 > 65504), so the report fails with findings, hazards and a NaN/Inf birth.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from precision_doctor.diagnosis.diagnose import diagnose
from precision_doctor.diagnosis.report import DiagnosisReport
from precision_doctor.formats import Precision
from precision_doctor.graph.load import input_metadata
from precision_doctor.inputs import load_samples
from precision_doctor.layerwise.candidates import emulated
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.report import plots
from precision_doctor.report.html import render_html
from precision_doctor.report.html_fix import render_fix_section
from precision_doctor.report.templating import fmt_num, sort_key

SCRIPT_NODE = "<script>alert(1)</script>"
IMG_TENSOR = '<img src=x onerror="alert(2)">'
OUTPUT = "out'\"&<b>bold</b>"


def tiny_failing_model() -> onnx.ModelProto:
    """x[1,64] -> Mul(0.5) named SCRIPT_NODE -> Pow(2) -> Sub -> Relu -> output OUTPUT."""
    nodes = [
        helper.make_node("Mul", ["x", "half"], [IMG_TENSOR], name=SCRIPT_NODE),
        helper.make_node("Pow", [IMG_TENSOR, "two"], ["sq"], name="pow&<i>"),
        helper.make_node("Sub", ["sq", "sq_shift"], ["d"], name="sub"),
        helper.make_node("Relu", ["d"], [OUTPUT], name="relu"),
    ]
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "half"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1.0, np.float32), "sq_shift")]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, [1, 64])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    return model


def tiny_failing_report() -> DiagnosisReport:
    """The real diagnosis of ``tiny_failing_model`` in FP16 on seeded random inputs."""
    model = tiny_failing_model()
    samples = load_samples("random:seed=0,low=0,high=1000,count=2", input_metadata(model))
    return diagnose(model, samples, Precision.FP16, emulated(PrecisionPlan(Precision.FP16)),
                    model_path="/tmp/<evil>.onnx")


@pytest.fixture(scope="module")
def report() -> DiagnosisReport:
    return tiny_failing_report()


@pytest.fixture(scope="module")
def page(report: DiagnosisReport) -> str:
    return render_html(report, command="precision-doctor diagnose '<evil>.onnx' --target fp16")


def test_the_tiny_model_really_fails_with_findings(report: DiagnosisReport) -> None:
    assert report.verdict == "fail"
    assert report.findings and report.layerwise is not None
    assert report.layerwise.nan_birth == "sq"
    assert any(r.node == SCRIPT_NODE for r in report.layerwise.records)


def test_untrusted_names_are_escaped(page: str) -> None:
    assert SCRIPT_NODE not in page and IMG_TENSOR not in page and "<b>bold</b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=&#34;alert(2)&#34;&gt;" in page
    assert "out&#39;&#34;&amp;&lt;b&gt;bold&lt;/b&gt;" in page
    assert "/tmp/&lt;evil&gt;.onnx" in page and "&#39;&lt;evil&gt;.onnx&#39;" in page
    # one script element: ours, allowed by its hash in the Content-Security-Policy
    assert len(re.findall(r"<script\b", page)) == 1
    assert re.search(r"script-src 'sha256-[A-Za-z0-9+/=]{44}'", page)
    assert "onerror=" not in page.replace("onerror=&#34;", "")


def test_page_is_self_contained(page: str) -> None:
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "@import" not in page and "url(http" not in page
    assert page.startswith("<!DOCTYPE html>")


def test_sections_verdict_first_and_content(page: str, report: DiagnosisReport) -> None:
    ids = re.findall(r'<section id="([a-z-]+)"', page)
    assert ids == ["verdict", "assessment", "outputs", "findings", "plots", "hazards", "layerwise",
                   "reproduce", "details"]
    assert "<title>FAIL: &lt;evil&gt;.onnx in FP16 - precision-doctor</title>" in page
    assert page.count("<svg") == 2
    assert 'class="finding sev-' in page and "Remedy" in page
    assert 'class="sortable' in page and "<details" in page
    for f in report.findings:
        assert f.kind in page


def test_json_round_trip_renders_the_same(report: DiagnosisReport, page: str) -> None:
    again = DiagnosisReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert render_html(again, command="precision-doctor diagnose '<evil>.onnx' --target fp16") \
        == page


def test_without_layerwise_or_command(report: DiagnosisReport) -> None:
    bare = DiagnosisReport.from_dict({**report.to_dict(), "layerwise": None, "noise": None})
    page = render_html(bare)
    assert "<svg" not in page and 'id="layerwise"' not in page
    assert "The exact command was not recorded" in page


def test_fix_section_escapes_and_orders(report: DiagnosisReport) -> None:
    fix = {"before": {OUTPUT: {"rel_l2": 1.0, "max_abs": "inf", "numel": 64}},
           "after": {OUTPUT: {"rel_l2": 0.004, "max_abs": 0.5, "numel": 64}},
           "plan": [{"node": SCRIPT_NODE, "op_type": "Mul", "precision": "fp32",
                     "reason": "search", "detail": "x<y"}],
           "fp32_share_nodes": 0.25, "fp32_share_flops": 0.013,
           "recipes": {"trtexec": "trtexec --onnx='<m>.onnx' --stronglyTyped"},
           "verdict": "pass"}
    page = render_html(report, fix=fix)
    ids = re.findall(r'<section id="([a-z-]+)"', page)
    assert ids.index("fix") == ids.index("outputs") + 1
    section = render_fix_section(fix).html
    assert SCRIPT_NODE not in section and "&lt;script&gt;" in section
    assert "25.0%" in section and "1.3%" in section and "0.004" in section
    assert "∞" in section and "numel" not in section  # JSON "inf"; only the key metrics
    assert "trtexec --onnx=&#39;&lt;m&gt;.onnx&#39; --stronglyTyped" in section


def test_number_formatting() -> None:
    assert fmt_num(None) == "–" and fmt_num(math.inf) == "∞" and fmt_num(math.nan) == "NaN"
    assert fmt_num(65504.0) == "65,504" and fmt_num(0.000123456) == "1.23e-04"
    assert fmt_num(1234567) == "1,234,567" and fmt_num(9.79e7) == "9.79e+07"
    assert sort_key(math.inf) == "Infinity" and sort_key(None) == "-Infinity"
    assert float(sort_key(1e-5)) == 1e-5


@pytest.mark.skipif(not plots.available(), reason="matplotlib is not installed")
def test_plots_are_inline_deterministic_and_escape_text(report: DiagnosisReport) -> None:
    from matplotlib.figure import Figure

    svg = plots.error_vs_depth_svg(report.layerwise, 1e-6)
    assert svg.startswith("<svg") and 'width="100%"' in svg and "<?xml" not in svg
    assert svg == plots.error_vs_depth_svg(report.layerwise, 1e-6)
    assert SCRIPT_NODE not in svg and "NaN/Inf birth" in svg
    assert all(i.startswith("err-") for i in re.findall(r'\bid="([^"]+)"', svg))
    fig = Figure()
    fig.add_subplot().set_title(SCRIPT_NODE)
    text = plots.to_svg(fig, "t")
    assert "<script" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text


def test_without_matplotlib_the_page_says_so(report: DiagnosisReport,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plots, "available", lambda: False)
    page = render_html(report)
    assert "<svg" not in page and "Plots need matplotlib" in page
