"""PreprocessSpec parsing/round-trips, resize geometry, and image -> tensor on tiny images."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from precision_doctor.errors import InputError
from precision_doctor.inputs import PRESETS, PreprocessSpec, image_to_tensor, parse_preprocess
from precision_doctor.inputs.resize import limit_side_size, plan_resize, short_side_size


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_round_trip_text_and_json(name: str) -> None:
    spec = PRESETS[name]
    assert parse_preprocess(name) == spec
    assert parse_preprocess(str(spec)) == spec
    assert PreprocessSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_key_value_overrides() -> None:
    spec = parse_preprocess("size=224x224,layout=nhwc,order=bgr,scale=0.00392156862745098,"
                            "mean=0.485/0.456/0.406,std=0.229/0.224/0.225")
    assert spec.resize == "fixed" and spec.size == (224, 224)
    assert (spec.layout, spec.order) == ("nhwc", "bgr")
    assert spec.mean == (0.485, 0.456, 0.406)
    assert parse_preprocess("scale=1/255").scale == pytest.approx(1 / 255)


def test_preset_with_overrides() -> None:
    spec = parse_preprocess("ppocr-det:max-side=960,mean=0.485/0.456/0.406")
    assert spec.resize == "max-side" and spec.side == 960
    assert spec.order == "bgr" and spec.multiple == 32
    assert parse_preprocess("imagenet:layout=nhwc").crop == (224, 224)


@pytest.mark.parametrize("text, fragment", [
    ("nosuchpreset", "unknown preprocessing preset"),
    ("size=224x224,colour=red", "unknown preprocessing key"),
    ("layout=nchwc", "layout="),
    ("mean=1/2", "1 or 3 values"),
    ("resize=fixed", "needs size"),
    ("std=0", "std must not contain 0"),
    ("scale=abc", "not a number"),
])
def test_bad_specs_say_what_is_wrong(text: str, fragment: str) -> None:
    with pytest.raises(InputError, match=fragment):
        parse_preprocess(text)


def test_limit_side_matches_paddleocr_rounding() -> None:
    # DetResizeForTest: int(h * ratio), then round(v / 32) * 32 with Python's round.
    h, w = limit_side_size(323, 430, 736, "min", 32)
    assert (h, w) == (736, 992)  # 323 -> 736, 430 * 736/323 = 979.8 -> 979 -> 992
    assert limit_side_size(1000, 2000, 960, "max", 32) == (480, 960)
    assert limit_side_size(100, 200, 960, "max", 32) == (96, 192)  # never enlarged
    assert limit_side_size(10, 10, 960, "max", 32) == (32, 32)  # at least one multiple


def test_short_side_and_center_crop_match_torchvision() -> None:
    assert short_side_size(480, 640, 256) == (256, 341)
    plan = plan_resize(480, 640, parse_preprocess("imagenet"))
    assert plan.resized == (256, 341)
    assert plan.crop == (16, 58, 224, 224)  # int(round((341 - 224) / 2)) = 58
    assert plan.output == (224, 224)


def test_height_mode_canvas_follows_rapidocr() -> None:
    rec = parse_preprocess("ppocr-rec")
    assert plan_resize(32, 100, rec).resized == (48, 150)
    assert plan_resize(32, 100, rec).output == (48, 320)  # padded to 320
    wide = plan_resize(30, 400, rec)  # 48 * 400 / 30 = 640: canvas grows past 320
    assert wide.resized == (48, 640) and wide.output == (48, 640)
    cls = parse_preprocess("ppocr-cls")
    assert plan_resize(30, 400, cls).output == (48, 192)
    assert plan_resize(30, 400, cls).resized == (48, 192)


def _gradient(h: int, w: int) -> Image.Image:
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1),
                    np.full_like(x, 200)], axis=-1).astype(np.uint8)
    return Image.fromarray(rgb)


def test_tensor_layout_order_and_normalisation() -> None:
    image = Image.fromarray(np.array([[[10, 20, 30]]], dtype=np.uint8))
    nchw = image_to_tensor(image, parse_preprocess("none"))
    assert nchw.shape == (1, 3, 1, 1) and nchw.dtype == np.float32
    assert nchw.ravel().tolist() == [10, 20, 30]
    bgr = image_to_tensor(image, parse_preprocess("order=bgr,layout=nhwc"))
    assert bgr.shape == (1, 1, 1, 3) and bgr.ravel().tolist() == [30, 20, 10]
    norm = image_to_tensor(image, parse_preprocess("scale=1/255,mean=0.5,std=0.5"))
    np.testing.assert_allclose(norm.ravel(), (np.array([10, 20, 30]) / 255 - 0.5) / 0.5,
                               rtol=1e-6)
    raw = image_to_tensor(image, parse_preprocess("dtype=uint8"))
    assert raw.dtype == np.uint8


def test_rec_padding_is_in_output_space() -> None:
    tensor = image_to_tensor(_gradient(32, 64), parse_preprocess("ppocr-rec"))
    assert tensor.shape == (1, 3, 48, 320)
    assert np.all(tensor[..., 96:] == 0.0)  # 48 * 64 / 32 = 96 columns of image, then zeros
    assert tensor[..., :96].min() >= -1.0 and tensor[..., :96].max() <= 1.0


def test_det_sizes_are_multiples_of_32() -> None:
    tensor = image_to_tensor(_gradient(123, 457), parse_preprocess("ppocr-det"))
    assert tensor.shape[2] % 32 == 0 and tensor.shape[3] % 32 == 0


def test_cv2_linear_differs_from_antialiased_bilinear_only_on_downscale() -> None:
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (40, 60, 3), dtype=np.uint8))
    up_aa = image_to_tensor(image, parse_preprocess("size=80x120"))
    up_cv = image_to_tensor(image, parse_preprocess("size=80x120,interp=cv2-linear"))
    assert np.abs(up_aa - up_cv).max() <= 1.0
    down_aa = image_to_tensor(image, parse_preprocess("size=10x15"))
    down_cv = image_to_tensor(image, parse_preprocess("size=10x15,interp=cv2-linear"))
    assert np.abs(down_aa - down_cv).max() > 10  # antialiasing averages, cv2 does not


def test_size_on_a_preset_switches_to_fixed_resize() -> None:
    spec = parse_preprocess("ppocr-det:size=640x640")
    assert (spec.resize, spec.size, spec.side) == ("fixed", (640, 640), None)
    assert spec.order == "bgr"
    with pytest.raises(InputError, match="crop does not combine"):
        parse_preprocess("ppocr-rec:crop=48x48")


def test_letterbox_matches_ultralytics_and_records_where_the_image_lies():
    from precision_doctor.inputs.resize import letterbox

    # ultralytics LetterBox(auto=False): r = min(640/300, 640/451); 451x300 -> 640x426,
    # dh = 214 / 2 = 107: top = round(107 - 0.1) = 107, bottom = 107
    plan = letterbox(300, 451, (640, 640))
    assert plan.resized == (426, 640) and plan.offset == (107, 0) and plan.output == (640, 640)
    assert plan.image_box() == (107, 0, 426, 640)
    assert letterbox(100, 200, (65, 64)).offset == (16, 0)  # dh = 16.5: 16 above, 17 below
    spec = parse_preprocess("ultralytics:size=64x64")
    assert spec.resize == "letterbox" and spec.size == (64, 64)
    image = Image.new("RGB", (200, 100), (255, 0, 0))
    x = image_to_tensor(image, spec)
    assert x.shape == (1, 3, 64, 64)
    assert np.allclose(x[0, :, :16], 114 / 255) and np.allclose(x[0, 0, 16:48], 1.0)
    assert plan_resize(100, 200, spec).image_box() == (16, 0, 32, 64)
    crop = parse_preprocess("imagenet")
    assert plan_resize(256, 256, crop).image_box() == (-16, -16, 256, 256)
    with pytest.raises(InputError, match="crop does not combine with resize=letterbox"):
        PreprocessSpec(resize="letterbox", size=(64, 64), crop=(32, 32))
    with pytest.raises(InputError, match="resize=letterbox needs size"):
        PreprocessSpec(resize="letterbox")
