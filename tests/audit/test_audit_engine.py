"""audit_engine: findings, FP32 checks, summaries and JSON round trip on fixture builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from precision_doctor.audit import AuditReport, audit_engine
from precision_doctor.formats import Precision
from precision_doctor.precision.plan import PrecisionPlan


def kinds(report: AuditReport) -> dict[str, list]:
    out: dict[str, list] = {}
    for f in report.findings:
        out.setdefault(f.kind, []).append(f)
    return out


def test_trt84_findings_and_summary(trt84: dict, trt84_prof: list) -> None:
    report = audit_engine(trt84, trt84_prof, expect_fp32=["Conv_0", "Softmax_*", "Nope"])
    found = kinds(report)
    assert [f.layer for f in found["tf32-tactic"]] == ["Conv_2"]
    assert found["tf32-tactic"][0].time_ms == 0.3 and "--noTF32" in found["tf32-tactic"][0].remedy
    assert [f.layer for f in found["reformat"]] == [
        "Reformatting CopyNode for Input Tensor 0 to Conv_0 + Relu_1"]
    assert [f.layer for f in found["unreadable"]] == ["MysteryLayer_4"]
    not_honored = found["fp32-not-honored"]
    assert len(not_honored) == 1 and not_honored[0].layer == "Conv_0 + Relu_1"
    assert not_honored[0].confidence == "confirmed"
    assert "--layerPrecisions=Conv_0:fp32" in not_honored[0].remedy
    checks = {c.node: c for c in report.fp32_checks}
    assert checks["Conv_0"].status == "not-honored" and checks["Conv_0"].ran_in == "fp16"
    assert checks["Softmax_3"].status == "honored" and checks["Softmax_3"].pattern == "Softmax_*"
    assert checks["Nope"].status == "not-found"
    assert any("'Nope'" in w for w in report.warnings)
    summary = report.precision_summary
    assert summary["fp16"]["layers"] == 1 and summary["fp16"]["time_share"] == pytest.approx(0.4)
    assert list(summary)[0] == "fp16"                       # slowest precision first
    assert report.total_time_ms == pytest.approx(1.0)
    assert report.findings[0].kind == "fp32-not-honored"   # most important kind first


def test_trt86_region_fp32_request(trt86: dict, trt86_prof: list) -> None:
    report = audit_engine(trt86, trt86_prof, expect_fp32=["*norm1*"])
    assert len(report.regions) == 1
    region = report.regions[0]
    assert region.precision == "fp16" and region.time_ms == 1.5
    assert region.first[0] == "blocks.0.transformer_blocks.0.norm1.weight"
    assert [s.op for s in region.sensitive] == ["LayerNorm (a norm inside a transformer block)"]
    found = kinds(report)
    nh = found["fp32-not-honored"]
    assert len(nh) == 1 and nh[0].confidence == "likely" and "--stronglyTyped" in nh[0].remedy
    sens = {f.layer: f for f in found["sensitive-op"]}
    assert sens[region.name].confidence == "likely"
    assert sens["/blocks.0/norm/InstanceNormalization"].confidence == "confirmed"
    # /blocks.0/act/Mul is a Mul, not a normalization.
    assert len(sens) == 2
    assert any("pass --onnx" in w for w in report.warnings)


def test_trt86_region_without_formats_is_possible(trt86_noformats: dict) -> None:
    report = audit_engine(trt86_noformats, expect_fp32=["*norm1*"])
    nh = kinds(report)["fp32-not-honored"][0]
    assert nh.confidence == "possible"
    assert "possibly not honored: fused region, precision not visible" in nh.evidence
    assert report.regions[0].precision == "unknown"


def test_plan_overrides_are_checked(trt84: dict, tmp_path: Path) -> None:
    plan = PrecisionPlan(Precision.FP16).keep_fp32(["Conv_0", "Relu_1"], "hazard")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_dict()))
    report = audit_engine(trt84, plan=path)
    assert {(c.node, c.source, c.status) for c in report.fp32_checks} == {
        ("Conv_0", "plan", "not-honored"), ("Relu_1", "plan", "not-honored")}
    assert kinds(report)["fp32-not-honored"][0].nodes == ("Conv_0", "Relu_1")


def test_trt10_regions(trt10: dict) -> None:
    report = audit_engine(trt10, expect_fp32=["/fc/Softmax"])
    assert [r.name for r in report.regions] == ["Myelin graph myl9 (3 kernels)"]
    region = report.regions[0]
    assert region.precision == "fp16" and region.nodes_source == "metadata"
    assert region.onnx_nodes == ("/Flatten", "/fc/Gemm", "/fc/Softmax")
    assert [s.op for s in region.sensitive] == ["Softmax"]
    check = report.fp32_checks[0]
    assert (check.status, check.confidence, check.ran_in) == ("not-honored", "likely", "fp16")


def test_names_only_report(names_only: dict) -> None:
    report = audit_engine(names_only, expect_fp32=["Softmax_3"])
    assert not report.detailed
    assert report.findings[-1].kind == "unreadable"
    assert "profilingVerbosity=detailed" in report.findings[-1].remedy
    assert report.fp32_checks[0].status == "unknown"
    assert report.precision_summary == {"unknown": {"layers": 3, "time_ms": None,
                                                    "time_share": None}}


@pytest.mark.parametrize("fixture", ["trt84", "trt86", "trt86_noformats", "trt10", "names_only"])
def test_json_round_trip(fixture: str, request: pytest.FixtureRequest) -> None:
    report = audit_engine(request.getfixturevalue(fixture), expect_fp32=["*"])
    again = AuditReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again == report
    assert report.to_dict()["schema_version"] == 1
