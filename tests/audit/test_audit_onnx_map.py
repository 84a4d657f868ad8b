"""Resolving ForeignNode regions against the ONNX model (graph slice, topological fallback)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from precision_doctor.audit import audit_engine
from precision_doctor.audit.onnx_map import OnnxIndex
from precision_doctor.errors import ModelLoadError

REGION_NODES = ("/blocks.0/Reshape", "/blocks.0/Transpose",
                "/blocks.0/transformer_blocks.0/norm1/LayerNormalization", "/blocks.0/attn/MatMul",
                "/blocks.0/attn/Softmax", "/blocks.0/attn/MatMul_1", "/blocks.0/Transpose_1",
                "/blocks.0/Reshape_3")


def model() -> onnx.ModelProto:
    """The ONNX graph the trt86 fixture engine was 'built' from (shapes are not checked)."""
    init = [numpy_helper.from_array(np.ones(16, np.float32), n) for n in
            ("blocks.0.transformer_blocks.0.norm1.weight", "ln_bias")]
    init += [numpy_helper.from_array(np.array([1, 16, 64], np.int64), "shape_a"),
             numpy_helper.from_array(np.array([1, 64, 8, 8], np.int64), "shape_b"),
             numpy_helper.from_array(np.ones((64, 4, 1, 1), np.float32), "w")]
    n = helper.make_node
    nodes = [
        n("Cast", ["x"], ["/Cast_1_output_0"], name="/Cast_1", to=TensorProto.FLOAT),
        n("Conv", ["/Cast_1_output_0", "w"], ["/blocks.0/proj_in/Conv_output_0"],
          name="/blocks.0/proj_in/Conv"),
        n("Reshape", ["/blocks.0/proj_in/Conv_output_0", "shape_a"], ["r0"],
          name="/blocks.0/Reshape"),
        n("Transpose", ["r0"], ["t0"], name="/blocks.0/Transpose", perm=[0, 2, 1]),
        n("LayerNormalization", ["t0", "blocks.0.transformer_blocks.0.norm1.weight", "ln_bias"],
          ["ln"], name="/blocks.0/transformer_blocks.0/norm1/LayerNormalization", axis=-1),
        n("MatMul", ["ln", "context"], ["mm0"], name="/blocks.0/attn/MatMul"),
        n("Softmax", ["mm0"], ["sm"], name="/blocks.0/attn/Softmax", axis=-1),
        n("MatMul", ["sm", "context"], ["mm1"], name="/blocks.0/attn/MatMul_1"),
        n("Transpose", ["mm1"], ["t1"], name="/blocks.0/Transpose_1", perm=[0, 2, 1]),
        n("Reshape", ["t1", "shape_b"], ["/blocks.0/Reshape_3_output_0"],
          name="/blocks.0/Reshape_3"),
        n("InstanceNormalization", ["/blocks.0/Reshape_3_output_0", "ln_bias", "ln_bias"],
          ["/blocks.0/norm/InstanceNormalization_output_0"],
          name="/blocks.0/norm/InstanceNormalization"),
        n("Sigmoid", ["/blocks.0/norm/InstanceNormalization_output_0"], ["s"],
          name="/blocks.0/act/Sigmoid"),
        n("Mul", ["/blocks.0/norm/InstanceNormalization_output_0", "s"], ["out"],
          name="/blocks.0/act/Mul"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8]),
                     helper.make_tensor_value_info("context", TensorProto.FLOAT, [1, 64, 64])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_graph_slice(trt86: dict, tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(model(), path)
    report = audit_engine(trt86, onnx_model=path,
                          expect_fp32=["*LayerNormalization", "/blocks.0/act/Mul"])
    region = report.regions[0]
    assert region.onnx_nodes == REGION_NODES and region.nodes_source == "onnx-graph"
    assert [(s.op, s.evidence) for s in region.sensitive] == [
        ("LayerNormalization", "op type in the ONNX model"),
        ("Softmax", "op type in the ONNX model")]
    layer = next(x for x in report.layers if x.fused)
    assert layer.onnx_nodes == REGION_NODES
    checks = {c.node: c for c in report.fp32_checks}
    ln = checks["/blocks.0/transformer_blocks.0/norm1/LayerNormalization"]
    assert (ln.status, ln.confidence, ln.layers) == ("not-honored", "likely", (region.name,))
    assert checks["/blocks.0/act/Mul"].confidence == "confirmed"
    assert report.onnx_source == str(path)
    assert not any("pass --onnx" in w for w in report.warnings)


def test_reformatted_output_is_traced(trt86: dict) -> None:
    data = copy.deepcopy(trt86)
    region = data["Layers"][3]
    renamed = f"Reformatted Output Tensor 0 to {region['Name']}"
    region["Outputs"][0]["Name"] = renamed
    data["Layers"].insert(4, {"Name": "Reformatting CopyNode for Output Tensor 0 to x",
                              "LayerType": "Reformat", "Metadata": "",
                              "Inputs": [dict(region["Outputs"][0])],
                              "Outputs": [{"Name": "/blocks.0/Reshape_3_output_0",
                                           "Format/Datatype": "Row major linear FP16 format"}]})
    report = audit_engine(data, onnx_model=model())
    assert report.regions[0].onnx_nodes == REGION_NODES


def test_topological_range_fallback(trt86: dict) -> None:
    data = copy.deepcopy(trt86)
    data["Layers"][3]["Outputs"][0]["Name"] = "unknown_tensor"
    report = audit_engine(data, onnx_model=model())
    region = report.regions[0]
    assert region.nodes_source == "onnx-topological-range"
    assert region.onnx_nodes == REGION_NODES[2:]   # from the LayerNorm weight's consumer on


def test_wrong_model_warns(trt84: dict) -> None:
    report = audit_engine(trt84, onnx_model=model())
    assert any("is it the model" in w for w in report.warnings)


def test_index_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        OnnxIndex.build(tmp_path / "none.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00garbage")
    with pytest.raises(ModelLoadError):
        OnnxIndex.build(bad)
    index = OnnxIndex.build(model())
    assert index.index_of("blocks.0.transformer_blocks.0.norm1.weight") == 4
    assert index.index_of("nothing") is None


def test_layer_name_parts_filtered_by_model(trt84: dict) -> None:
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="Conv_0"),
         helper.make_node("Relu", ["y"], ["z"], name="Relu_1")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "w")])
    data = copy.deepcopy(trt84)
    data["Layers"][1]["Name"] = "w + Conv_0 + Relu_1"     # QAT-style: weight name in the layer name
    report = audit_engine(data, onnx_model=helper.make_model(graph, ir_version=9))
    assert report.layers[1].onnx_nodes == ("Conv_0", "Relu_1")
    assert report.layers[2].nodes_source == "none"        # Conv_2 is not in this model
