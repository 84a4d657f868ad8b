"""Terminal rendering: everything shown, bracketed TensorRT names not read as markup."""

from __future__ import annotations

import re

from rich.console import Console

from precision_doctor.audit import audit_engine, compare_builds
from precision_doctor.report.terminal.audit import render_audit, render_build_diff


def text_of(fn, *args, **kwargs) -> str:
    console = Console(record=True, width=200)
    fn(*args, console, **kwargs)
    return console.export_text()


def test_render_audit(trt86: dict, trt86_prof: list) -> None:
    report = audit_engine(trt86, trt86_prof, expect_fp32=["*norm1*", "*Softmax*"])
    out = text_of(render_audit, report)
    for needle in ("TensorRT 8.6", "Precision summary", "FP32 requests not honored",
                   "Sensitive ops in reduced precision", "Fused Myelin regions",
                   "Nodes wanted in FP32", "{ForeignNode[blocks.0", "warning:",
                   "--stronglyTyped", "Layers (7 of 7)"):
        assert needle in out, needle


def test_render_limits_and_names_only(trt84: dict, trt84_prof: list, names_only: dict) -> None:
    out = text_of(render_audit, audit_engine(trt84, trt84_prof), max_layers=2)
    assert "Layers (2 of 5)" in out and "TF32 tactics" in out
    out = text_of(render_audit, audit_engine(names_only))
    assert "Layer names only" in out and "Not readable" in out


def test_render_unknown_fused(trt86_noformats: dict) -> None:
    out = text_of(render_audit, audit_engine(trt86_noformats))
    assert "unknown (fused Myelin region)" in out


def test_render_diff(trt86: dict, trt86_prof: list, trt84: dict) -> None:
    diff = compare_builds(audit_engine(trt84, None), audit_engine(trt86, trt86_prof))
    out = text_of(render_build_diff, diff)
    for needle in ("Build A:", "Precision per build", "Layers that changed precision",
                   "Unpaired compute layers"):
        assert needle in out, needle


def test_render_at_80_columns_cuts_no_time_or_header(trt86: dict, trt86_prof: list,
                                                     trt84: dict) -> None:
    report = audit_engine(trt86, trt86_prof, expect_fp32=["*norm1*", "*Softmax*"])
    for width in (60, 80):
        console = Console(record=True, width=width)
        render_audit(report, console)
        render_build_diff(compare_builds(audit_engine(trt84, None), report), console)
        out = console.export_text()
        assert all(len(line.rstrip()) <= width for line in out.splitlines())
        for layer in report.layers:  # every time in full (3 decimals, ms)
            if layer.time_ms is not None:
                assert f"{layer.time_ms:.3f}" in out
        for header in ("precision", "ms/inference", "time share"):
            assert header in out
        # an ellipsis only ever ends a deliberately shortened engine name, never a number
        assert not re.search(r"(?<![\w.\[])[-+]?\d[\d.,e+-]*%?…", out), out
