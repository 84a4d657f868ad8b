"""load_samples on every source kind built in tmp_path: images, npy/npz, Polygraphy JSON, random."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from precision_doctor.errors import DataFormatError, InputError, InputNameError, InputShapeError
from precision_doctor.inputs import (
    RandomSpec,
    SkippedImageWarning,
    load_polygraphy_outputs,
    load_samples,
    parse_random,
    save_polygraphy_inputs,
)
from precision_doctor.runners.base import TensorMeta

F32 = np.dtype(np.float32)
IMAGE = TensorMeta("x", F32, ("batch", 3, "h", "w"))
FIXED = TensorMeta("x", F32, (1, 3, 8, 8))


def _write_image(path: Path, mode: str = "RGB", size: tuple[int, int] = (12, 10)) -> Path:
    rng = np.random.default_rng(len(path.name))
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    pixels = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode).save(path)
    return path


def test_image_folder_sorted_one_sample_each(tmp_path: Path) -> None:
    for name, mode in [("b.png", "RGBA"), ("a.jpg", "RGB"), ("c.bmp", "L")]:
        _write_image(tmp_path / name, mode)
    (tmp_path / "labels.txt").write_text("ignored")
    samples = load_samples(tmp_path, [FIXED], "size=8x8,scale=1/255")
    assert [s.name for s in samples] == ["a.jpg", "b.png", "c.bmp"]
    assert all(s.feeds["x"].shape == (1, 3, 8, 8) for s in samples)
    assert len(load_samples(tmp_path, [FIXED], "size=8x8", max_samples=2)) == 2
    globbed = load_samples(str(tmp_path / "*.png"), [FIXED], "size=8x8")
    assert [s.name for s in globbed] == ["b.png"]


def test_images_need_an_explicit_spec_and_fitting_size(tmp_path: Path) -> None:
    _write_image(tmp_path / "a.png")
    with pytest.raises(InputError, match="explicit preprocessing spec"):
        load_samples(tmp_path, [FIXED])
    with pytest.raises(InputShapeError, match="a.png: .*size=8x8"):
        load_samples(tmp_path, [FIXED], "none")
    nhwc = TensorMeta("x", F32, (1, 8, 8, 3))
    with pytest.raises(InputShapeError, match="layout=nhwc"):
        load_samples(tmp_path, [nhwc], "size=8x8")


def test_truncated_jpeg_is_named_or_skipped(tmp_path: Path) -> None:
    good = _write_image(tmp_path / "good.jpg", size=(64, 64))
    (tmp_path / "bad.jpg").write_bytes(good.read_bytes()[:300])
    with pytest.raises(DataFormatError, match="bad.jpg"):
        load_samples(tmp_path, [IMAGE], "none")
    with pytest.warns(SkippedImageWarning, match="bad.jpg"):
        samples = load_samples(tmp_path, [IMAGE], "none", skip_bad=True)
    assert [s.name for s in samples] == ["good.jpg"]
    (tmp_path / "bad.jpg").write_bytes(b"not an image at all")
    with pytest.raises(DataFormatError, match="bad.jpg"):
        load_samples(tmp_path / "bad.jpg", [IMAGE], "none")


def test_npy_and_npz_with_batch_split(tmp_path: Path) -> None:
    data = np.arange(2 * 3 * 8 * 8, dtype=np.float64).reshape(2, 3, 8, 8)
    np.save(tmp_path / "one.npy", data)
    [sample] = load_samples(tmp_path / "one.npy", [IMAGE])
    assert sample.feeds["x"].dtype == np.float32 and sample.feeds["x"].shape == (2, 3, 8, 8)
    split = load_samples(tmp_path / "one.npy", [IMAGE], split_batch=True)
    assert [s.name for s in split] == ["one.npy[0]", "one.npy[1]"]
    np.testing.assert_array_equal(split[1].feeds["x"][0], data[1])
    mask = TensorMeta("mask", np.dtype(np.int64), ("batch", 4))
    np.savez(tmp_path / "multi.npz", x=data, mask=np.ones((2, 4), np.int64))
    [both] = load_samples(tmp_path / "multi.npz", [IMAGE, mask])
    assert list(both.feeds) == ["x", "mask"]
    np.savez(tmp_path / "positional.npz", data)  # key arr_0 feeds a single-input model
    assert load_samples(tmp_path / "positional.npz", [IMAGE])[0].feeds["x"].shape[0] == 2


def test_array_errors(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros((1, 3, 8, 8), np.float32))
    mask = TensorMeta("mask", np.dtype(np.int64), ("batch", 4))
    with pytest.raises(InputNameError, match="save a .npz"):
        load_samples(tmp_path / "a.npy", [IMAGE, mask])
    np.savez(tmp_path / "wrong.npz", image=np.zeros((1, 3, 8, 8), np.float32))
    with pytest.raises(InputNameError, match=r"wrong.npz: missing input\(s\) \['x'\]"):
        load_samples(tmp_path / "wrong.npz", [IMAGE])
    np.save(tmp_path / "rank.npy", np.zeros((3, 8, 8), np.float32))
    with pytest.raises(InputShapeError, match="rank.npy: input 'x' has rank 3"):
        load_samples(tmp_path / "rank.npy", [IMAGE])
    (tmp_path / "junk.npz").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(DataFormatError, match="junk.npz"):
        load_samples(tmp_path / "junk.npz", [IMAGE])
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DataFormatError, match="obj.npy"):
        load_samples(tmp_path / "obj.npy", [IMAGE])


def _encode(arr: np.ndarray) -> str:
    buffer = io.BytesIO()
    np.save(buffer, arr)
    return base64.b64encode(buffer.getvalue()).decode()


def test_polygraphy_inputs_in_the_real_format(tmp_path: Path) -> None:
    a, b = np.ones((1, 3, 8, 8), np.float32), np.zeros((1, 3, 8, 8), np.float32)
    iterations = [{"x": {"array": _encode(a), "polygraphy_class": "ndarray"}},
                  {"x": {"array": _encode(b),  # legacy marker of older Polygraphy
                         "__polygraphy_encoded_ndarray": "polygraphy_serialized_json_type"}}]
    (tmp_path / "inputs.json").write_text(json.dumps(iterations))
    samples = load_samples(tmp_path / "inputs.json", [IMAGE])
    assert [s.name for s in samples] == ["inputs.json[0]", "inputs.json[1]"]
    np.testing.assert_array_equal(samples[0].feeds["x"], a)
    written = save_polygraphy_inputs(samples, tmp_path / "again.json")
    assert json.loads(written.read_text()) [0]["x"]["polygraphy_class"] == "ndarray"
    again = load_samples(written, [IMAGE])
    np.testing.assert_array_equal(again[1].feeds["x"], b)


def test_polygraphy_outputs_run_results(tmp_path: Path) -> None:
    out = np.arange(6, dtype=np.float32).reshape(2, 3)
    lazy = {"values": {"array": _encode(out), "polygraphy_class": "ndarray"},
            "polygraphy_class": "LazyNumpyArray"}
    iteration = {"outputs": {"y": lazy}, "runtime": 0.1, "runner_name": "trt-runner",
                 "polygraphy_class": "IterationResult"}
    results = {"lst": [["trt-runner", [iteration, iteration]], ["trt-runner", [iteration]]],
               "polygraphy_class": "RunResults"}
    (tmp_path / "outputs.json").write_text(json.dumps(results))
    loaded = load_polygraphy_outputs(tmp_path / "outputs.json")
    assert list(loaded) == ["trt-runner", "trt-runner#2"]
    assert len(loaded["trt-runner"]) == 2
    np.testing.assert_array_equal(loaded["trt-runner"][1]["y"], out)
    with pytest.raises(DataFormatError, match="Polygraphy \\*outputs\\*"):
        load_samples(tmp_path / "outputs.json", [IMAGE])


def test_random_is_seeded_and_needs_concrete_dims() -> None:
    text = "random:seed=3,low=-1,high=1,count=2,shape=x:1x3x4x4"
    first, second = load_samples(text, [IMAGE]), load_samples(text, [IMAGE])
    assert [s.name for s in first] == ["random[0]", "random[1]"]
    np.testing.assert_array_equal(first[1].feeds["x"], second[1].feeds["x"])
    assert first[0].feeds["x"].min() >= -1 and first[0].feeds["x"].max() < 1
    assert not np.array_equal(first[0].feeds["x"], first[1].feeds["x"])
    with pytest.raises(InputShapeError, match="'x' dim 0 is dynamic.*shape=x:1x3x1x1"):
        load_samples("random", [IMAGE])
    ids = TensorMeta("ids", np.dtype(np.int64), (2, 5))
    [sample] = load_samples("random:low=0,high=9", [ids])
    assert sample.feeds["ids"].dtype == np.int64 and sample.feeds["ids"].max() <= 9
    spec = parse_random(text)
    assert RandomSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    with pytest.raises(InputNameError, match="'y'"):
        load_samples("random:shape=y:1x3x4x4", [IMAGE])


def test_source_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not found"):
        load_samples(tmp_path / "missing", [IMAGE])
    _write_image(tmp_path / "a.png")
    np.save(tmp_path / "b.npy", np.zeros((1, 3, 4, 4), np.float32))
    with pytest.raises(DataFormatError, match="mixes data kinds"):
        load_samples(tmp_path, [IMAGE], "none")
    with pytest.raises(InputError, match="applies to images only"):
        load_samples(tmp_path / "b.npy", [IMAGE], "imagenet")
