"""Terminal output readable at 80 columns: no number or header cut with ``…``.

Rendered with ``Console(width=..., record=True)`` and through the CLI with ``COLUMNS`` set (typer's
CliRunner), on a tiny model built here and on the real PP-OCRv4 det and rec models (../shared).
"""

from __future__ import annotations

import json

import pytest
from rich.console import Console
from tiny_models import random_samples, transformer_block
from typer.testing import CliRunner

from precision_doctor import cli
from precision_doctor.diagnosis.diagnose import diagnose
from precision_doctor.formats import Precision
from precision_doctor.layerwise.candidates import emulated
from precision_doctor.numbers import fmt3
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.report.terminal.diagnosis import render_diagnosis


def _text(report, width: int) -> str:
    console = Console(width=width, record=True, force_terminal=False, color_system=None)
    render_diagnosis(report, console)
    return console.export_text()


def _assert_readable(text: str, width: int, report: dict) -> None:
    assert "…" not in text
    for line in text.splitlines():
        assert len(line.rstrip()) <= width, line
    for o in report["outputs"]:  # the main numbers appear in full, as 3 significant digits
        assert fmt3(o["metrics"]["rel_l2"]) in text
    lw = report.get("layerwise")
    if lw and lw.get("first_divergence") and report["verdict"] == "fail":
        rec = next(r for r in lw["records"] if r["tensor"] == lw["first_divergence"])
        assert fmt3(rec["rel_l2"]) in text
    elif lw and report["verdict"] == "pass":  # a pass shows the tightest headroom instead
        finite = [r for r in lw["records"] if isinstance(r["headroom_bits"], float)
                  and r["ref_max_abs"] > 0]
        tightest = min(finite, key=lambda r: r["headroom_bits"])
        assert "Headroom:" in text and fmt3(tightest["headroom_bits"]) in text


@pytest.fixture(scope="module")
def hot_report():
    model = transformer_block(hot_value=1000.0)
    return diagnose(model, random_samples((1, 8, 16)), Precision.FP16,
                    emulated(PrecisionPlan(Precision.FP16)))


@pytest.mark.parametrize("width", [40, 60, 80, 100, 120, 200])
def test_no_number_or_header_cut_at_any_width(hot_report, width):
    text = _text(hot_report, width)
    _assert_readable(text, width, hot_report.to_dict())
    assert "activation-overflow" in text and "ln/pow" in text  # never split by a fold
    if width >= 120:  # wide: the output table with its headers on one line
        assert any(all(h in line for h in ("rel L2", "max abs", "x noise"))
                   for line in text.splitlines())
    if width <= 80:  # narrow: key: value blocks with the long labels
        assert "argmax agree" in text and "rel L2 " + fmt3(
            hot_report.outputs[0].metrics.rel_l2) in text


def test_static_hazard_severity_is_printed_not_read_as_markup(hot_report):
    text = _text(hot_report, 100)
    assert any(f"[{h.severity}]" in text for h in hot_report.hazards if h.severity != "low")


def _cli(monkeypatch, args: list[str], columns: int):
    # a Console created without COLUMNS reads it at every print (rich Console.size)
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(cli, "console", Console())
    return CliRunner().invoke(cli.app, args, env={"COLUMNS": str(columns)})


@pytest.mark.parametrize("columns", [60, 80])
def test_cli_diagnose_with_columns(monkeypatch, tmp_path, columns):
    model = tmp_path / "hot.onnx"
    import onnx

    onnx.save(transformer_block(hot_value=1000.0), str(model))
    out = tmp_path / "r.json"
    res = _cli(monkeypatch, ["diagnose", str(model), "--data",
                             "random:seed=0,low=-1,high=1,count=2,shape=x:1x8x16",
                             "--json", str(out)], columns)
    assert res.exit_code == 1, res.output
    _assert_readable(res.output, columns, json.loads(out.read_text()))


@pytest.mark.shared
@pytest.mark.slow
@pytest.mark.parametrize("model", ["det", "rec"])
def test_cli_diagnose_real_models_at_80_columns(cli_diagnose_at_80_columns, model):
    """``diagnose MODEL --data ... --max-samples 6 --no-noise --json`` with ``COLUMNS=80`` on the
    real det (3 images at max side 480) and rec (6 crops); the run is shared with the
    acceptance tests (tests/conftest.py)."""
    res = cli_diagnose_at_80_columns(model)
    assert res.exit_code in (0, 1), res.output
    report = res.report
    assert report is not None, res.output
    _assert_readable(res.output, 80, report)
    if report["verdict"] == "fail":  # a pass leads with the answer: no layerwise rows
        # at 80 columns the layerwise rows are blocks (tensor and op type, then the numbers)
        for header in ("rel L2", "max|x|", "bits", "NaN/Inf"):
            assert header in res.output
        assert any(r["op_type"] in res.output for r in report["layerwise"]["records"])


def test_terminal_and_html_write_the_same_numbers(hot_report):
    from precision_doctor.report.html import render_html

    page = render_html(hot_report)
    text = _text(hot_report, 80)
    for o in hot_report.outputs:
        m = o.metrics
        for value in (m.rel_l2, m.max_abs, m.p99_abs, 1.0 - m.cosine, o.noise_multiple):
            if value is not None:
                assert fmt3(value) in text and f">{fmt3(value)}<" in page, value
