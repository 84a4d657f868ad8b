"""ONNX node names from Metadata, layer names and ForeignNode ranges."""

from __future__ import annotations

from precision_doctor.audit.names import (
    has_profile_suffix,
    myelin_graph_id,
    parse_foreign_node,
    split_layer_name,
    split_metadata,
)


def test_split_metadata_both_separators_and_trailing() -> None:
    assert split_metadata("[ONNX Layer: /a/Conv]\x1e[ONNX Layer: /a/Relu]\x1e") == \
        (("/a/Conv", "/a/Relu"), ())
    assert split_metadata("[ONNX Layer: /fc/Gemm]\x1f[ONNX Layer: /fc/Relu]") == \
        (("/fc/Gemm", "/fc/Relu"), ())
    assert split_metadata("custom note") == ((), ("custom note",))


def test_split_layer_name() -> None:
    assert split_layer_name("Conv_5 + Add_6 + Relu_7") == ("Conv_5", "Add_6", "Relu_7")
    assert split_layer_name("PWN(PWN(/b/Sigmoid), /b/Mul)") == ("/b/Sigmoid", "/b/Mul")
    assert split_layer_name("/a/Gemm || /b/Gemm") == ("/a/Gemm", "/b/Gemm")
    assert split_layer_name("reshape_after_/t/Gemm_copy_input") == ("/t/Gemm",)
    assert split_layer_name("onnx::Mul_4109 + (Unnamed Layer* 53) [Shuffle] + /n/Mul") == \
        ("onnx::Mul_4109", "/n/Mul")
    assert split_layer_name("Reformatting CopyNode for Input Tensor 0 to Conv_0 + Relu_1") == ()
    assert split_layer_name("__myl_Add_myl16_0") == ()
    assert split_layer_name("Conv_0 [profile 1]") == ("Conv_0",)


def test_parse_foreign_node() -> None:
    name = ("{ForeignNode[input_blocks.1.1.transformer_blocks.0.norm1.weight + (Unnamed Layer* "
            "109) [Shuffle].../input_blocks.1/input_blocks.1.1/Reshape_2 + "
            "/input_blocks.1/input_blocks.1.1/Reshape_3]}")
    first, last = parse_foreign_node(name)
    assert first == ("input_blocks.1.1.transformer_blocks.0.norm1.weight",
                     "(Unnamed Layer* 109) [Shuffle]")
    assert last == ("/input_blocks.1/input_blocks.1.1/Reshape_2",
                    "/input_blocks.1/input_blocks.1.1/Reshape_3")
    assert split_layer_name(name) == ("input_blocks.1.1.transformer_blocks.0.norm1.weight",
                                      "/input_blocks.1/input_blocks.1.1/Reshape_2",
                                      "/input_blocks.1/input_blocks.1.1/Reshape_3")
    assert parse_foreign_node("{ForeignNode[/a/MatMul]}") == (("/a/MatMul",), ("/a/MatMul",))
    # A reformat feeding a region is not the region.
    assert parse_foreign_node("Reformatting CopyNode for Input Tensor 0 to {ForeignNode[a...b]}") \
        is None
    assert parse_foreign_node("Conv_0") is None


def test_myelin_graph_and_profile_suffix() -> None:
    assert myelin_graph_id("__myl_MaxMinCas_myl12_0") == "myl12"
    assert myelin_graph_id("/classifier/classifier_1/Gemm_myl9_2") == "myl9"
    assert myelin_graph_id("Conv_0") is None
    assert has_profile_suffix("Conv_0 [profile 2]") and not has_profile_suffix("Conv_0")
