"""Forensics on a seeded synthetic image with the real PP-OCR presets and wrong variants of them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from precision_doctor.forensics import (
    KNOWN_NORMALIZATIONS,
    ForensicsResult,
    InputFinding,
    analyze_tensors,
    recognize,
)
from precision_doctor.inputs import PreprocessSpec, image_to_tensor, parse_preprocess


def _pair(image: Image.Image, spec_a: str, spec_b: str) -> ForensicsResult:
    a = image_to_tensor(image, parse_preprocess(spec_a))
    b = image_to_tensor(image, parse_preprocess(spec_b))
    return analyze_tensors(a, b, spec_a, spec_b)


# (spec A, spec B, expected top finding, words the summary must contain)
CASES = [
    ("ppocr-rec", "ppocr-rec:order=rgb", "channel-order", "RGB vs BGR"),
    ("ppocr-det", "ppocr-det:order=rgb", "channel-order", "RGB vs BGR"),
    ("ppocr-rec:mean=0,std=1", "ppocr-rec:scale=1,mean=0,std=1", "scale", "255"),
    ("ppocr-rec", "ppocr-rec:scale=1", "scale", "255"),
    ("imagenet", "imagenet:mean=0,std=1", "normalization", "missing in B"),
    ("ppocr-rec", "ppocr-rec:mean=0,std=1", "normalization", "missing in B"),
    ("ppocr-rec", "ppocr-rec:mean=0.485/0.456/0.406,std=0.229/0.224/0.225", "normalization",
     "ImageNet"),
    ("ppocr-rec", "ppocr-rec:layout=nhwc", "layout", "NHWC"),
    ("ppocr-det", "ppocr-det:layout=nhwc", "layout", "NHWC"),
    ("ppocr-rec", "ppocr-rec:interpolation=nearest", "interpolation", "interpolation"),
    ("ppocr-rec:interpolation=bilinear", "ppocr-rec:interpolation=nearest", "interpolation",
     "B has"),
    ("size=64x180,interpolation=bilinear", "size=64x180,interpolation=nearest", "interpolation",
     "B has"),
    ("ppocr-rec:scale=1,mean=0,std=1", "ppocr-rec:scale=1,mean=0,std=1,dtype=uint8", "dtype",
     "uint8"),
    ("ppocr-rec", "ppocr-rec:dtype=float16", "dtype", "float16"),
]


@pytest.mark.parametrize(("spec_a", "spec_b", "kind", "words"), CASES)
def test_names_the_mismatch(natural_image, spec_a, spec_b, kind, words):
    result = _pair(natural_image, spec_a, spec_b)
    assert result.top is not None, result
    assert result.top.kind == kind, result.findings
    assert words in result.top.summary
    assert len(result.findings) == 1, result.findings  # nothing spurious besides
    if kind not in ("interpolation",):
        assert result.transform["residual_rel_std"] < 0.02  # the explanation is complete


def test_nearest_upscale_is_blocky(small_image):
    result = _pair(small_image, "ppocr-rec", "ppocr-rec:interpolation=nearest")
    assert result.kinds() == ["interpolation"]
    assert "B is blocky" in result.top.summary
    assert result.top.evidence["duplicate_lines_b"] > 0.3


def test_identical_inputs_have_no_findings(natural_image):
    result = _pair(natural_image, "ppocr-rec", "ppocr-rec")
    assert result.findings == ()
    assert result.residual_rel_l2 == 0.0
    assert result.transform["normalization"] == {"a": "x/127.5-1", "b": "x/127.5-1"}


def test_recognizes_both_normalizations(natural_image):
    result = _pair(natural_image, "imagenet", "imagenet:mean=0,std=1")
    assert result.transform["normalization"] == {"a": "imagenet", "b": "x/255"}
    assert "A uses ImageNet mean/std" in result.top.summary


@pytest.mark.parametrize(("dy", "dx"), [(3, 5), (-2, 4), (0, -6)])
def test_crop_offset(natural_image, dy, dx):
    pixels = np.asarray(natural_image)
    spec = parse_preprocess("ppocr-det:resize=none")
    a = image_to_tensor(Image.fromarray(pixels[10:130, 10:330]), spec)
    b = image_to_tensor(Image.fromarray(pixels[10 + dy:130 + dy, 10 + dx:330 + dx]), spec)
    result = analyze_tensors(a, b)
    assert result.top.kind == "crop-offset"
    assert result.transform["shift_px"] == [dy, dx]
    assert result.residual_rel_l2 < 1e-6


def test_window_of_a_larger_tensor(natural_image):
    spec = parse_preprocess("ppocr-det:resize=none")
    a = image_to_tensor(natural_image, spec)
    b = image_to_tensor(natural_image.crop((40, 20, 290, 120)), spec)  # (left, top, right, bottom)
    result = analyze_tensors(a, b)
    assert result.top.kind == "crop-offset"
    assert result.transform["window_offset"] == [20, 40]


def test_different_resize(natural_image):
    result = _pair(natural_image, "ppocr-det", "ppocr-det:min-side=640")
    assert result.top.kind == "resize"
    assert result.top.evidence["a_size"] != result.top.evidence["b_size"]
    assert result.transform["residual_rel_std"] < 0.2


def test_padding_only(natural_image):
    # Same 48x135 content on a 600-wide and on the standard 320-wide canvas.
    result = _pair(natural_image, "ppocr-rec:pad-width=600", "ppocr-rec")
    assert result.kinds() == ["padding"]
    assert "same 48x135 content" in result.top.summary
    assert result.residual_rel_l2 < 1e-6


def test_padding_with_width_rounding(natural_image):
    # PaddleOCR rounds the width up when it pads (135) and down when it does not (134).
    result = _pair(natural_image, "ppocr-rec", "ppocr-rec:pad-width=none")
    assert result.top.kind == "padding"
    assert "size rounding" in result.top.summary


def test_reshaped_instead_of_transposed(natural_image):
    a = image_to_tensor(natural_image, parse_preprocess("ppocr-rec"))
    b = np.ascontiguousarray(a.transpose(0, 2, 3, 1)).reshape(a.shape)
    result = analyze_tensors(a, b)
    assert result.top.kind == "layout"
    assert "reshaped instead of transposed" in result.top.summary


def test_gray_image_channel_order_not_observable():
    rng = np.random.default_rng(3)
    plane = (rng.uniform(0, 1, (40, 120)).cumsum(1) % 1 * 255).astype(np.uint8)
    image = Image.fromarray(np.repeat(plane[..., None], 3, axis=2))
    result = _pair(image, "ppocr-rec", "ppocr-rec:order=rgb")
    assert result.findings == ()
    assert result.transform["channel_order_observable"] is False


def test_gamma_curve_is_not_called_resampling(natural_image):
    spec = parse_preprocess("ppocr-rec:scale=1,mean=0,std=1")
    a = image_to_tensor(natural_image, spec)
    b = (255.0 * (a / 255.0) ** (1 / 2.2)).astype(np.float32)
    result = analyze_tensors(a, b)
    assert result.kinds() == ["normalization"]
    assert "non-linear curve" in result.top.summary


def test_noise_is_unexplained(natural_image):
    a = image_to_tensor(natural_image, parse_preprocess("ppocr-rec"))
    b = a + np.random.default_rng(0).normal(0, 0.2, a.shape).astype(np.float32)
    result = analyze_tensors(a, b)
    assert result.kinds() == ["unexplained"]


@pytest.mark.parametrize("norm", KNOWN_NORMALIZATIONS, ids=lambda n: n.key)
def test_recognize_each_known_normalization(natural_image, norm):
    spec = PreprocessSpec(scale=norm.scale, mean=norm.mean, std=norm.std)
    tensor = image_to_tensor(natural_image, spec)[0].astype(np.float64)
    assert recognize(tensor, "float32").normalization == norm


def test_result_json_round_trip(natural_image):
    result = _pair(natural_image, "ppocr-rec", "ppocr-rec:order=rgb,interpolation=nearest")
    text = json.dumps(result.to_dict())
    back = ForensicsResult.from_dict(json.loads(text))
    assert back.to_dict() == result.to_dict()
    assert back.kinds() == ["channel-order", "interpolation"]


def test_finding_rejects_unknown_kind():
    with pytest.raises(ValueError, match="unknown finding kind"):
        InputFinding("colour", "x")


def test_small_integer_tensors_follow_the_fit():
    # Both look like raw 0..255 "pixels", but B is twice A: the fitted map wins.
    result = analyze_tensors(np.arange(10.0), np.arange(10.0) * 2)
    assert result.kinds() == ["scale"]
    assert "x 2" in result.top.summary


def test_nonfinite_values_are_reported(natural_image):
    a = image_to_tensor(natural_image, parse_preprocess("ppocr-rec"))
    b = a.copy()
    b[0, 0, 5, 7] = np.nan
    result = analyze_tensors(a, b)
    assert result.transform["nonfinite"] == {"a": 0, "b": 1}
    json.dumps(result.to_dict())


def test_bfloat16_and_channel_count(natural_image):
    import ml_dtypes

    a = image_to_tensor(natural_image, parse_preprocess("ppocr-rec"))
    result = analyze_tensors(a, a.astype(ml_dtypes.bfloat16))
    assert result.kinds() == ["dtype"]
    assert "bfloat16" in result.top.summary
    result = analyze_tensors(a[:, :1], a)
    assert result.top.kind == "layout"
    assert "channel count differs" in result.top.summary


def test_padded_vs_stretched_same_canvas(natural_image):
    # PP-OCR keeps the aspect ratio and pads to 320; the wrong variant stretches to 48x320.
    result = _pair(natural_image, "ppocr-rec", "ppocr-rec:size=48x320")
    assert result.kinds() == ["resize"]
    assert "48x135 in A and 48x320 in B" in result.top.summary
