"""parse_layer_info on every schema: 8.4, 8.6 ForeignNode, 10.x kgen, names only, odd input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from precision_doctor.audit.layers import parse_layer_info
from precision_doctor.errors import DataFormatError


def by_name(info) -> dict:
    return {x.name: x for x in info.layers}


def test_trt84(trt84: dict, tmp_path: Path) -> None:
    path = tmp_path / "layers.json"
    path.write_text(json.dumps(trt84))
    info = parse_layer_info(path)
    assert info.source == str(path) and info.detailed
    assert info.trt_version_guess == "8.0-8.5"
    layers = by_name(info)
    reformat = layers["Reformatting CopyNode for Input Tensor 0 to Conv_0 + Relu_1"]
    assert (reformat.precision, reformat.onnx_nodes) == ("mixed", ())
    conv = layers["Conv_0 + Relu_1"]
    assert conv.precision == "fp16" and conv.onnx_nodes == ("Conv_0", "Relu_1")
    assert conv.nodes_source == "layer-name" and "weights: Half" in conv.evidence
    assert layers["Conv_2"].precision == "tf32"
    assert layers["Softmax_3"].precision == "fp32"
    # Unknown layer type, missing name-less format: no crash, unknown + warning + unparsed key.
    mystery = layers["MysteryLayer_4"]
    assert mystery.precision == "unknown" and mystery.type == "SomethingNew"
    assert mystery.unparsed_keys == ("BrandNewKey",)
    assert any("Sixty-four wide quantum format" in w for w in info.warnings)


def test_trt86(trt86: dict) -> None:
    info = parse_layer_info(trt86)
    assert info.trt_version_guess == "8.6" and "Metadata" in info.trt_version_evidence
    layers = list(info.layers)
    assert layers[0].precision == "int"
    assert layers[1].precision == "mixed" and layers[1].nodes_source == "none"
    region = layers[3]
    assert region.fused and region.type == "Myelin" and region.precision == "fp16"
    assert region.nodes_source == "foreign-node-endpoints"
    assert region.onnx_nodes == ("blocks.0.transformer_blocks.0.norm1.weight",
                                 "/blocks.0/Reshape_3")
    assert layers[5].onnx_nodes == ("/blocks.0/act/Sigmoid", "/blocks.0/act/Mul")
    assert layers[5].nodes_source == "metadata"


def test_trt86_region_without_formats(trt86_noformats: dict) -> None:
    region = parse_layer_info(trt86_noformats).layers[3]
    assert region.precision == "unknown" and region.fused
    assert "precision is not visible" in region.evidence[0]


def test_trt10(trt10: dict) -> None:
    info = parse_layer_info(trt10)
    assert info.trt_version_guess == "10.x"
    layers = list(info.layers)
    assert layers[1].precision == "none" and layers[1].fused   # shape_call
    assert layers[2].precision == "fp16" and layers[2].onnx_nodes == ("/Flatten",)
    gemm = layers[3]
    assert gemm.precision == "fp16" and gemm.input_precision == "fp16"
    assert gemm.onnx_nodes == ("/fc/Gemm", "/fc/Softmax")


def test_names_only(names_only: dict) -> None:
    info = parse_layer_info(names_only)
    assert not info.detailed and info.trt_version_guess == "unknown"
    assert all(x.precision == "unknown" for x in info.layers)
    assert "--profilingVerbosity=detailed" in info.warnings[0]
    assert info.layers[1].onnx_nodes == ("Conv_0", "Relu_1")


def test_odd_inputs_never_crash() -> None:
    info = parse_layer_info({"Layers": [
        42, {"LayerType": "Foo"}, {"Name": "a", "Inputs": "not json", "Outputs": {"x": 1}},
        {"Name": "b", "Inputs": json.dumps([{"Name": "t", "Format/Datatype": "Half"}]),
         "Outputs": [7, {"Name": "u", "Format/Datatype": "Half", "Dimensions": ["?"]}]},
        {"Name": "c", "LayerType": "signal"}, {"Name": "Conv_0 [profile 1]"}]})
    names = [x.name for x in info.layers]
    assert names == ["<layer #0>", "<layer #1>", "a", "b"]
    assert info.layers[3].precision == "fp16"
    assert any("profiles other than the first" in w for w in info.warnings)
    assert any("has no Name" in w for w in info.warnings)
    assert parse_layer_info({"Layers": []}).warnings == ("<object> lists no layers",)
    single = parse_layer_info({"Name": "x", "LayerType": "NoOp"})
    assert single.layers[0].name == "x"


def test_bad_files(tmp_path: Path, trt84_prof: list) -> None:
    with pytest.raises(DataFormatError, match="not found|cannot read"):
        parse_layer_info(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DataFormatError, match="not valid JSON"):
        parse_layer_info(bad)
    with pytest.raises(DataFormatError, match="looks like a profile"):
        parse_layer_info(trt84_prof)
    with pytest.raises(DataFormatError, match="not TensorRT layer information"):
        parse_layer_info({"foo": 1})


def test_raw_control_characters_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "raw.json"
    path.write_bytes(b'{"Layers": [{"Name": "a", "LayerType": "NoOp", "Metadata": '
                     b'"[ONNX Layer: /x/Conv]\x1e[ONNX Layer: /x/Relu]"}]}')
    assert parse_layer_info(path).layers[0].onnx_nodes == ("/x/Conv", "/x/Relu")


def test_device_metadata_is_not_layer_info() -> None:
    with pytest.raises(DataFormatError, match="not TensorRT layer information"):
        parse_layer_info([{"Name": "NVIDIA A100 80GB PCIe", "ComputeCapability": [8, 0]}])
