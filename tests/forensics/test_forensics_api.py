"""compare_inputs / load_side / output_effect / render_forensics with files and a tiny model."""

from __future__ import annotations

import io
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from rich.console import Console

from precision_doctor.errors import DataFormatError, InputError, InputNameError
from precision_doctor.forensics import (
    ForensicsResult,
    compare_inputs,
    load_side,
    output_effect,
    parse_source,
)
from precision_doctor.inputs import (
    Sample,
    image_to_tensor,
    parse_preprocess,
    save_polygraphy_inputs,
)
from precision_doctor.report.terminal.forensics import render_forensics


def _conv_model() -> onnx.ModelProto:
    """x [1, 3, H, W] -> Conv 3x3 (2 filters) -> Relu -> y [1, 2, H, W]."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.normal(0, 0.5, (2, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"], name="relu")],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, "h", "w"])],
        [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture
def image_file(tmp_path, natural_image):
    path = tmp_path / "scene.png"
    natural_image.save(path)
    return path


def test_compare_two_specs_of_one_image(image_file):
    result = compare_inputs(image_file, image_file, preprocess_a="ppocr-rec",
                            preprocess_b="ppocr-rec:order=rgb")
    assert result.top.kind == "channel-order"
    assert result.a_desc == "scene.png with ppocr-rec: float32 [1, 3, 48, 320]"
    assert result.output_effect is None


def test_compare_npy_npz_and_polygraphy_json(tmp_path, natural_image):
    a = image_to_tensor(natural_image, parse_preprocess("ppocr-rec"))
    b = image_to_tensor(natural_image, parse_preprocess("ppocr-rec:layout=nhwc"))
    np.save(tmp_path / "a.npy", a)
    np.savez(tmp_path / "feeds.npz", x=b, other=np.zeros(3))
    save_polygraphy_inputs([Sample("s0", {"x": a}), Sample("s1", {"x": b})],
                           tmp_path / "inputs.json")
    result = compare_inputs(tmp_path / "a.npy", f"{tmp_path / 'feeds.npz'}:x")
    assert result.top.kind == "layout"
    assert result.b_desc.startswith("feeds.npz:x")
    result = compare_inputs(tmp_path / "a.npy", f"{tmp_path / 'inputs.json'}@1")
    assert result.top.kind == "layout"
    assert result.b_desc.startswith("inputs.json:x@1")
    assert compare_inputs(f"{tmp_path / 'inputs.json'}:x@0", tmp_path / "a.npy").findings == ()


def test_parse_source():
    assert parse_source("d/feeds.npz:x") == (parse_source("d/feeds.npz")[0], "x", None)
    path, key, it = parse_source("in.json:images@3")
    assert (path.name, key, it) == ("in.json", "images", 3)
    assert parse_source("in.json@2")[1:] == (None, 2)


def test_load_side_errors(tmp_path, image_file):
    with pytest.raises(InputError, match="give its preprocessing"):
        load_side(image_file)
    np.save(tmp_path / "a.npy", np.zeros((1, 3, 4, 4), np.float32))
    with pytest.raises(InputError, match="preprocessing applies to images only"):
        load_side(tmp_path / "a.npy", "ppocr-rec")
    np.savez(tmp_path / "two.npz", p=np.zeros(2), q=np.ones(2))
    with pytest.raises(InputNameError, match=r"two.npz:KEY"):
        load_side(tmp_path / "two.npz")
    with pytest.raises(InputNameError, match="no array 'r'"):
        load_side(f"{tmp_path / 'two.npz'}:r")
    assert load_side(tmp_path / "two.npz", input_names=["q"]).desc == "two.npz:q"
    save_polygraphy_inputs([Sample("s", {"x": np.zeros(2)})], tmp_path / "in.json")
    with pytest.raises(DataFormatError, match="@4 does not exist"):
        load_side(f"{tmp_path / 'in.json'}@4")
    with pytest.raises(InputError, match="not found"):
        load_side(tmp_path / "missing.npy", label="B")


def test_output_effect_against_fp16(natural_image):
    model = _conv_model()
    a = image_to_tensor(natural_image, parse_preprocess("ppocr-rec"))
    b = image_to_tensor(natural_image, parse_preprocess("ppocr-rec:order=rgb"))
    effect = output_effect(model, a, b, "fp16")
    assert effect["b_fits"] is True
    assert effect["precision_rel_l2"] > 0
    assert effect["preprocessing_rel_l2"] > 10 * effect["precision_rel_l2"]
    assert effect["ratio"] == pytest.approx(
        effect["preprocessing_rel_l2"] / effect["precision_rel_l2"])
    assert "more than FP16 does" in effect["summary"]
    assert set(effect["outputs"]["y"]) == {"preprocessing", "precision"}
    json.dumps(effect)


def test_output_effect_when_b_does_not_fit(natural_image):
    a = image_to_tensor(natural_image, parse_preprocess("ppocr-rec"))
    b = image_to_tensor(natural_image, parse_preprocess("ppocr-rec:layout=nhwc"))
    effect = output_effect(_conv_model(), a, b)
    assert effect["b_fits"] is False
    assert effect["preprocessing_rel_l2"] is None
    assert "B does not fit the model input" in effect["b_error"]
    assert effect["precision_rel_l2"] > 0


def test_compare_with_model_and_render(tmp_path, image_file):
    model_path = tmp_path / "tiny.onnx"
    onnx.save(_conv_model(), model_path)
    result = compare_inputs(image_file, image_file, preprocess_a="ppocr-rec",
                            preprocess_b="ppocr-rec:mean=0,std=1", model=model_path)
    assert result.top.kind == "normalization"
    assert result.output_effect["model"] == "tiny.onnx"
    buffer = io.StringIO()
    render_forensics(result, Console(file=buffer, width=150, color_system=None))
    text = buffer.getvalue()
    for words in ("normalization", "mean/std normalization missing in B", "Output effect",
                  "explained", "more than FP16 does"):
        assert words in text, text
    back = ForensicsResult.from_dict(json.loads(json.dumps(result.to_dict())))
    buffer = io.StringIO()
    render_forensics(back, Console(file=buffer, width=150, color_system=None))
    assert buffer.getvalue() == text


def test_render_without_findings(natural_image):
    a = image_to_tensor(natural_image, parse_preprocess("ppocr-rec"))
    result = compare_inputs(a, a.copy())
    buffer = io.StringIO()
    render_forensics(result, Console(file=buffer, width=120, color_system=None))
    assert "No difference found" in buffer.getvalue()


def test_markup_in_names_is_not_interpreted(natural_image):
    a = image_to_tensor(natural_image, parse_preprocess("ppocr-rec"))
    result = ForensicsResult.from_dict({**compare_inputs(a, a).to_dict(), "a": "[red]x[/red].npy"})
    buffer = io.StringIO()
    render_forensics(result, Console(file=buffer, width=120, color_system=None))
    assert "[red]x[/red].npy" in buffer.getvalue()


def test_output_effect_of_identical_inputs(natural_image):
    a = image_to_tensor(natural_image, parse_preprocess("ppocr-rec"))
    effect = output_effect(_conv_model(), a, a.copy())
    assert effect["preprocessing_rel_l2"] == 0.0 and effect["ratio"] == 0.0
    assert "does not change the outputs" in effect["summary"]
