"""Acceptance on real OCR images with the real PP-OCR preprocessing and wrong variants of it.

Needs ../shared (real crops and pages from PaddleOCR/RapidOCR, the PP-OCRv4 rec model); skipped
cleanly without it.
"""

from __future__ import annotations

import pytest

from precision_doctor.forensics import compare_inputs

# Colourful crops (channel order is visible): one the rec preset downscales (274x116 -> h 48),
# one it upscales (445x39 -> h 48); one page the det preset upscales (323x430 -> 736x992).
REC_IMAGES = ("rec_crops/paddleocr/imgs_words_en__word_116.png",
              "rec_crops/rapidocr/test_without_det.jpg")
DET_IMAGE = "full_images/ch_en_num.jpg"

# (spec A, spec B, expected top finding kind)
REC_CASES = [
    ("ppocr-rec", "ppocr-rec:order=rgb", "channel-order"),                  # RGB vs BGR
    ("ppocr-rec:mean=0,std=1", "ppocr-rec:scale=1,mean=0,std=1", "scale"),  # 0-1 vs 0-255
    ("ppocr-rec", "ppocr-rec:mean=0,std=1", "normalization"),               # missing mean/std
    ("ppocr-rec", "ppocr-rec:layout=nhwc", "layout"),                       # NCHW vs NHWC
    ("ppocr-rec", "ppocr-rec:interpolation=nearest", "interpolation"),      # bilinear/nearest
    ("ppocr-rec:scale=1,mean=0,std=1", "ppocr-rec:scale=1,mean=0,std=1,dtype=uint8", "dtype"),
]
DET_CASES = [
    ("ppocr-det", "ppocr-det:order=rgb", "channel-order"),
    ("ppocr-det", "ppocr-det:scale=1", "scale"),
    ("ppocr-det", "ppocr-det:max-side=960", "resize"),
    ("ppocr-det", "ppocr-det:layout=nhwc", "layout"),
    ("ppocr-det", "ppocr-det:interpolation=nearest", "interpolation"),
]


@pytest.mark.shared
@pytest.mark.parametrize("image", REC_IMAGES)
@pytest.mark.parametrize(("spec_a", "spec_b", "kind"), REC_CASES)
def test_real_rec_crops(shared_dir, image, spec_a, spec_b, kind):
    path = shared_dir / "data/ocr" / image
    result = compare_inputs(path, path, preprocess_a=spec_a, preprocess_b=spec_b)
    assert result.kinds() == [kind], [f.summary for f in result.findings]


@pytest.mark.shared
@pytest.mark.parametrize(("spec_a", "spec_b", "kind"), DET_CASES)
def test_real_det_page(shared_dir, spec_a, spec_b, kind):
    path = shared_dir / "data/ocr" / DET_IMAGE
    result = compare_inputs(path, path, preprocess_a=spec_a, preprocess_b=spec_b)
    assert result.top.kind == kind, [f.summary for f in result.findings]


@pytest.mark.shared
def test_real_det_imagenet_vs_half_normalization(shared_dir):
    # RapidOCR's det preset (mean = std = 0.5) vs PaddleOCR's (ImageNet mean/std), same resize.
    path = shared_dir / "data/ocr" / DET_IMAGE
    result = compare_inputs(path, path, preprocess_a="ppocr-det",
                            preprocess_b="ppocr-det:mean=0.485/0.456/0.406,"
                                         "std=0.229/0.224/0.225")
    assert result.kinds() == ["normalization"]
    assert "ImageNet" in result.top.summary


@pytest.mark.shared
def test_real_det_rapidocr_vs_paddleocr_presets(shared_dir):
    # RapidOCR (min side 736, mean = std = 0.5) vs PaddleOCR (max side 960, ImageNet mean/std).
    path = shared_dir / "data/ocr" / DET_IMAGE
    result = compare_inputs(path, path, preprocess_a="ppocr-det",
                            preprocess_b="paddleocr-det:exif=0")
    assert result.kinds() == ["normalization", "resize"]
    assert result.transform["normalization"] == {"a": "x/127.5-1", "b": "imagenet"}


@pytest.mark.shared
def test_rec_model_bgr_swap_vs_fp16(shared_dir):
    """RGB/BGR swap on a real colourful crop moves the PP-OCRv4 rec outputs more than FP16."""
    path = shared_dir / "data/ocr" / REC_IMAGES[0]
    result = compare_inputs(path, path, preprocess_a="ppocr-rec",
                            preprocess_b="ppocr-rec:order=rgb",
                            model=shared_dir / "models/ppocrv4/rec.onnx")
    assert result.top.kind == "channel-order"
    effect = result.output_effect
    assert effect["b_fits"] is True and effect["target"] == "fp16"
    # Measured: preprocessing 5.3 % vs FP16 1.6 % relative L2 (ratio 3.4).
    assert 0 < effect["precision_rel_l2"] < effect["preprocessing_rel_l2"]
    assert effect["ratio"] > 2
