"""The audit on the real TensorRT layer-information files in ../shared/data/engine-json
(TREx 8.4/8.5 samples, ControlNet TensorRT 8.6.1 FP32/FP16 builds, TensorRT 10 samples)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from precision_doctor.audit import (
    AuditReport,
    BuildDiff,
    audit_engine,
    compare_builds,
    parse_layer_info,
)

CONTROLNET = "yuanjiechen_trt2023_controlnet_trt861"
TREX = "NVIDIA_TensorRT_TREx"
TRT10 = "fuzzylabs_edge-vision-power-estimation_trt10"


def layer_files(root: Path) -> list[tuple[Path, Path | None]]:
    base = root / "data" / "engine-json"
    files = sorted(base.rglob("*.graph.json")) + sorted(base.rglob("layerinfo.json")) + \
        sorted(base.rglob("trt_engine_info.json"))
    out = []
    for f in files:
        prof = f.with_name(f.name.replace("graph.json", "profile.json")
                           .replace("layerinfo.json", "profile.json"))
        out.append((f, prof if prof.is_file() and prof != f else None))
    return out


def controlnet(shared: Path, build: str) -> AuditReport:
    folder = shared / "data" / "engine-json" / CONTROLNET / build
    return audit_engine(folder / "layerinfo.json", folder / "profile.json",
                        expect_fp32=["*norm1*", "*InstanceNormalization"])


def test_every_real_file(shared_dir: Path) -> None:
    files = layer_files(shared_dir)
    assert len(files) == 9
    for layers, profile in files:
        report = audit_engine(layers, profile)
        assert report.detailed and report.layers, layers
        assert not any("names no data type" in w for w in report.warnings), layers
        assert sum(r["layers"] for r in report.precision_summary.values()) == len(report.layers)
        hidden = [x for x in report.layers if x.precision == "unknown"]
        assert not hidden, (layers, [x.name for x in hidden])
        if profile is not None:
            assert all(x.time_ms is not None for x in report.layers), layers
            shares = sum(r["time_share"] or 0 for r in report.precision_summary.values())
            assert shares == pytest.approx(1.0, abs=1e-3)
        assert AuditReport.from_dict(json.loads(json.dumps(report.to_dict()))) == report


def test_versions(shared_dir: Path) -> None:
    guesses = {f.parent.name: parse_layer_info(f).trt_version_guess
               for f, _ in layer_files(shared_dir)}
    assert guesses["pytorch_resnet_A100_fp16"] == "8.0-8.5"
    assert guesses["fp16_commit_d6f4129"] == "8.6"
    assert guesses["trtexec_alexnet_fp16"] == "10.x"
    assert guesses["torch_trt_inspector_mobilenet_v2"] == "10.x"


def test_controlnet_fp16(shared_dir: Path) -> None:
    report = controlnet(shared_dir, "fp16_commit_d6f4129")
    assert report.trt_version_guess == "8.6" and len(report.layers) == 389
    assert len(report.regions) == 7
    for region in report.regions:
        assert region.precision == "fp16" and region.name.startswith("{ForeignNode[")
        assert region.first[0].endswith("transformer_blocks.0.norm1.weight")
        assert [s.op for s in region.sensitive] == ["LayerNorm (a norm inside a transformer block)"]
        assert region.time_ms and region.time_ms > 0.3
    checks = Counter((c.status, c.ran_in, c.confidence) for c in report.fp32_checks)
    # norm1 inside the 7 FP16 regions; InstanceNorm: 22 layers ran FP16, 5 ran FP32.
    assert checks == {("not-honored", "fp16", "likely"): 7,
                      ("not-honored", "fp16", "confirmed"): 22,
                      ("honored", "fp32", "confirmed"): 5}
    kinds = Counter(f.kind for f in report.findings)
    assert kinds["fp32-not-honored"] == 29 and kinds["reformat"] == 29
    assert report.precision_summary["fp16"]["time_share"] > 0.95


def test_controlnet_fp32_uses_tf32(shared_dir: Path) -> None:
    report = controlnet(shared_dir, "fp32_initial_commit_b3d06c8")
    assert report.precision_summary["tf32"]["layers"] == 33
    assert Counter(f.kind for f in report.findings) == {"tf32-tactic": 33}
    assert all(c.status == "honored" for c in report.fp32_checks if c.status != "not-found")
    assert {r.precision for r in report.regions} == {"fp32"}


def test_controlnet_compare(shared_dir: Path) -> None:
    a = controlnet(shared_dir, "fp32_initial_commit_b3d06c8")
    b = controlnet(shared_dir, "fp16_commit_d6f4129")
    diff = compare_builds(a, b)
    assert [(r.a_precision, r.b_precision, r.match) for r in diff.regions] == \
        [("fp32", "fp16", "type+shape")] * 7
    assert diff.a_total_ms == pytest.approx(8.973, abs=1e-3)
    assert diff.b_total_ms == pytest.approx(15.295, abs=1e-3)
    changed = Counter((c.a_precision, c.b_precision) for c in diff.precision_changes)
    assert changed[("tf32", "fp16")] == 33 and changed[("fp32", "fp16")] > 100
    assert diff.reformat["b"]["layers"] == 29
    assert BuildDiff.from_dict(json.loads(json.dumps(diff.to_dict()))) == diff


def test_trex_a100_fp32_tf32(shared_dir: Path) -> None:
    folder = shared_dir / "data" / "engine-json" / TREX / "pytorch_resnet_A100_fp32"
    report = audit_engine(folder / "resnet.onnx.engine.graph.json",
                          folder / "resnet.onnx.engine.profile.json")
    tf32 = [f for f in report.findings if f.kind == "tf32-tactic"]
    assert len(tf32) == 20 and all(f.confidence == "confirmed" for f in tf32)
    assert report.precision_summary["tf32"]["time_share"] == pytest.approx(0.684, abs=1e-3)


def test_trt10_alexnet(shared_dir: Path) -> None:
    folder = shared_dir / "data" / "engine-json" / TRT10 / "trtexec_alexnet_fp16"
    report = audit_engine(folder / "alexnet_fp16.graph.json", folder / "alexnet_fp16.profile.json",
                          expect_fp32=["/classifier/classifier.6/Gemm"])
    assert [r.name for r in report.regions] == ["Myelin graph myl9 (5 kernels)"]
    assert report.regions[0].precision == "fp16"
    check = report.fp32_checks[0]
    assert (check.status, check.ran_in, check.confidence) == ("not-honored", "fp16", "likely")


def test_real_file_names_only(shared_dir: Path) -> None:
    folder = shared_dir / "data" / "engine-json" / CONTROLNET / "fp16_commit_d6f4129"
    data = json.loads((folder / "layerinfo.json").read_text())
    names = {"Layers": [x["Name"] for x in data["Layers"]], "Bindings": data["Bindings"]}
    report = audit_engine(names, folder / "profile.json")
    assert not report.detailed and "--profilingVerbosity=detailed" in report.warnings[0]
    assert set(report.precision_summary) == {"unknown"}
    assert report.total_time_ms == pytest.approx(15.295, abs=1e-3)
