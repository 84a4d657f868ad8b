"""Reports lead with the answer: a short pass, grouped findings, evidence in sentences.

A passing model's terminal report fits 30 lines at 100 columns and lists no near-tie flip; an
8-block quantized encoder that FP16 destroys (every block overflows at its accumulator Cast,
``tiny_models.quantized_block``) fits 120 lines at 80 columns, its 8 overflows as one group;
the HTML writes the assessment's evidence in sentences and the groups' members in <details>;
``finding_groups`` round-trips through the JSON.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from rich.console import Console
from tiny_models import random_samples, transformer_block, write_quantized_block

import precision_doctor as pd
from precision_doctor.diagnosis.decisions.records import DecisionFlip
from precision_doctor.diagnosis.diagnose import diagnose
from precision_doctor.diagnosis.report import DiagnosisReport
from precision_doctor.formats import Precision
from precision_doctor.layerwise.candidates import emulated
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.report.evidence import evidence_sentences
from precision_doctor.report.html import render_html
from precision_doctor.report.terminal.diagnosis import render_diagnosis
from precision_doctor.report.terminal.findings import short_name


def _lines(report, width: int) -> list[str]:
    console = Console(width=width, record=True, force_terminal=False, color_system=None)
    render_diagnosis(report, console)
    return console.export_text().splitlines()


def _flip(i: int, reading: str, changed: bool | None) -> DecisionFlip:
    return DecisionFlip("y", f"s{i}", (0, i), 1e-4, 1e-6, changed, 0.001, (1, 2), 2,
                        f"flip {i}", reading)


@pytest.fixture(scope="module")
def passing():
    """A model that passes FP16, with 12 near-tie flips (a sigmoid map's ties) added."""
    model = transformer_block(hot_value=1.0)
    report = diagnose(model, random_samples((1, 8, 16)), Precision.FP16,
                      emulated(PrecisionPlan(Precision.FP16)))
    assert report.passed
    return replace(report, decision_flips=tuple(_flip(i, "near-tie", None) for i in range(12)))


def test_a_pass_fits_30_lines_and_lists_no_near_tie_flip(passing):
    lines = _lines(passing, 100)
    text = "\n".join(lines)
    assert len(lines) <= 30, text
    assert "flip 1:" not in text and "12 near-tie flip(s)" in text
    assert "Headroom:" in text and "Next:" in text
    assert "Layerwise (" not in text  # the table is for failures (and in the HTML)
    if passing.hazards:
        assert f"{len(passing.hazards)} static hazard(s) checked, none measured to matter" in text


def test_a_flip_that_damages_is_listed(passing):
    report = replace(passing, decision_flips=(*passing.decision_flips,
                                               _flip(99, "damage", True)))
    text = "\n".join(_lines(report, 100))
    assert "flip 1: s99" in text and "12 near-tie flip(s)" in text


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    model, data = write_quantized_block(tmp_path_factory.mktemp("encoder8"), blocks=8)
    return pd.diagnose(model, data, target="fp16")


def test_a_destroyed_encoder_fits_120_lines_at_80_columns(encoder):
    assert encoder.verdict == "fail"
    lines = _lines(encoder, 80)
    text = "\n".join(lines)
    assert len(lines) <= 120, text
    assert all(len(line.rstrip()) <= 80 for line in lines), text
    casts = next(g for g in encoder.finding_groups if g.op_type == "Cast")
    assert casts.blocks == tuple(range(8)) and casts.joint and casts.impact == 1.0
    assert "Cast b*/cast in blocks 0-7 (8" in " ".join(text.split())
    assert text.count("b3/cast") <= 2  # the members are not each printed in full


def test_groups_round_trip_and_stay_out_of_other_reports(encoder, passing):
    d = json.loads(json.dumps(encoder.to_dict()))
    assert len(d["finding_groups"]) >= 1
    assert {m for g in d["finding_groups"] for m in g["members"]} <= {
        f["node"] for f in d["findings"]}  # the members stay in the findings
    back = DiagnosisReport.from_dict(d)
    assert back.finding_groups == encoder.finding_groups
    assert back.to_dict() == d
    assert "finding_groups" not in passing.to_dict()


def test_html_groups_members_and_evidence_sentences(encoder):
    page = render_html(encoder)
    assert "in blocks 0-7" in page and "member findings</summary>" in page
    a = encoder.assessment
    assert a is not None
    assert "<dt>unit_roundoff</dt>" not in page and "<dt>worst_output</dt>" not in page
    assert "FP16 unit roundoff 4.88e-04" in page
    assert "What to do:" in page


def test_evidence_sentences_have_units_and_a_fallback():
    sentences = evidence_sentences({
        "worst_output": "y", "worst_rel_l2": 1.0e-3, "tolerance_rel_l2": 1e-2,
        "unit_roundoff": 2.0 ** -11, "max_local_gain": 3.2, "max_gain_node": "N",
        "rewritten_share": 0.4, "brand_new": 7}, "fp16")
    assert sentences[0] == "Worst relative L2 error 1.00e-03 on output y (tolerance 1.00e-02)"
    assert "FP16 unit roundoff 4.88e-04" in sentences
    assert "Largest local error gain 3.20x at node N" in sentences
    assert "The safe rewrites alone remove 40% of the error" in sentences
    assert sentences[-1] == "brand_new: 7"


def test_a_pass_page_leads_with_the_answer(passing):
    page = render_html(passing)
    hero = page[:page.index('id="assessment"')]
    assert "Next:" in hero and "headroom" in hero
    assert "high/medium" not in hero  # a pass does not lead with the hazard count
    assert "12 near-tie flip(s), none measured to change the task" in page


def test_short_name_keeps_the_distinctive_tail():
    name = "/model/encoder/layers.3/self_attn/k_proj/MatMul_output_0"
    short = short_name(name, 36)
    assert short.startswith(".../") and short.endswith("k_proj/MatMul_output_0")
    assert len(short) <= 36 and short_name("b0/cast") == "b0/cast"
    assert len(short_name("x" * 80, 36)) == 36
