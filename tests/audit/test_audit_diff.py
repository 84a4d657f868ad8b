"""compare_builds: pairing by name, ONNX nodes and type+shape; JSON round trip."""

from __future__ import annotations

import copy
import json

from engine_fixtures import F32, TF32_TACTIC, trt86_layers

from precision_doctor.audit import BuildDiff, audit_engine, compare_builds
from precision_doctor.audit.diff import layer_family


def fp32_twin(data: dict, rename: bool) -> dict:
    """The same network built in FP32 (every format FP32), optionally with other layer names."""
    twin = copy.deepcopy(data)
    for i, layer in enumerate(twin["Layers"]):
        for side in ("Inputs", "Outputs"):
            for t in layer.get(side, []):
                if "FP16" in t["Format/Datatype"] or t["Format/Datatype"] == "Half":
                    t["Format/Datatype"] = F32
        if rename:
            layer["Name"] = (f"{{ForeignNode[Reshape_{i}...Reshape_{i + 9}]}}"
                             if layer["LayerType"] == "Myelin" else f"renamed_{i}")
            layer["Metadata"] = ""
    twin["Layers"][2]["TacticName"] = TF32_TACTIC
    return twin


def test_pair_by_name(trt86: dict, trt86_prof: list) -> None:
    a = audit_engine(fp32_twin(trt86, rename=False))
    b = audit_engine(trt86, trt86_prof)
    diff = compare_builds(a, b)
    assert diff.matched == {"name": 4}
    assert {(c.a_precision, c.b_precision) for c in diff.precision_changes} == {
        ("fp32", "fp16"), ("tf32", "fp16")}
    assert [(r.a_precision, r.b_precision, r.match) for r in diff.regions] == [
        ("fp32", "fp16", "name")]
    assert diff.reformat["a"]["layers"] == 0 and diff.reformat["b"]["layers"] == 2
    assert diff.b_total_ms is not None and diff.a_total_ms is None
    assert BuildDiff.from_dict(json.loads(json.dumps(diff.to_dict()))) == diff


def test_pair_by_onnx_nodes_and_shape() -> None:
    b = trt86_layers()
    a = copy.deepcopy(b)
    a["Layers"][2]["Name"] = "Conv_renamed"          # same Metadata -> onnx-nodes
    diff = compare_builds(audit_engine(a), audit_engine(b))
    assert diff.matched == {"name": 3, "onnx-nodes": 1}
    renamed = compare_builds(audit_engine(fp32_twin(b, rename=True)), audit_engine(b))
    assert renamed.matched == {"type+shape": 4}
    assert renamed.regions[0].match == "type+shape"
    assert any("approximate" in n for n in renamed.notes)
    assert renamed.only_in_a == () and renamed.only_in_b == ()


def test_unpaired_layers(trt86: dict, trt84: dict) -> None:
    diff = compare_builds(audit_engine(trt84), audit_engine(trt86))
    assert diff.only_in_a or diff.only_in_b
    assert all(r.match in ("unmatched", "type+shape", "name") for r in diff.regions)


def test_layer_family() -> None:
    assert layer_family("CaskConvolution") == layer_family("CaskGemmConvolution") == "conv"
    assert layer_family("Myelin") == layer_family("kgen") == "myelin"
    assert layer_family("PointWiseV2") == layer_family("Scale") == "pointwise"
    assert layer_family("Whatever") == "whatever"
