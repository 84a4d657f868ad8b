"""Real data: PP-OCRv4 det/rec/cls through ONNX Runtime, and real Polygraphy JSON files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from precision_doctor.inputs import load_polygraphy_outputs, load_samples
from precision_doctor.runners.base import TensorMeta

pytestmark = pytest.mark.shared

_ORT_DTYPES = {"tensor(float)": np.dtype(np.float32), "tensor(int64)": np.dtype(np.int64)}


def _session(path: Path) -> tuple[ort.InferenceSession, list[TensorMeta]]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    metas = [TensorMeta(i.name, _ORT_DTYPES[i.type],
                        tuple(d if isinstance(d, int) else (d or "?") for d in i.shape))
             for i in session.get_inputs()]
    return session, metas


def _ctc_greedy(logits: np.ndarray, characters: list[str]) -> str:
    # PaddleOCR CTCLabelDecode: index 0 = blank, merge repeats, drop blanks.
    best = logits[0].argmax(axis=-1)
    keep = [i for t, i in enumerate(best) if i != 0 and (t == 0 or i != best[t - 1])]
    return "".join(characters[i] for i in keep)


def test_ppocr_det_on_full_images(shared_dir: Path) -> None:
    session, metas = _session(shared_dir / "models/ppocrv4/det.onnx")
    samples = load_samples(shared_dir / "data/ocr/full_images", metas, "ppocr-det")
    assert len(samples) >= 3
    for sample in samples:
        x = sample.feeds["x"]
        assert x.shape[2] % 32 == 0 and x.shape[3] % 32 == 0 and min(x.shape[2:]) >= 736
        assert -1.0 <= x.min() and x.max() <= 1.0
    [prob] = session.run(None, samples[0].feeds)
    assert prob.shape[2:] == samples[0].feeds["x"].shape[2:]
    assert prob.max() > 0.9  # text is found


def test_ppocr_rec_reads_joint(shared_dir: Path) -> None:
    path = shared_dir / "models/ppocrv4/rec.onnx"
    session, metas = _session(path)
    meta = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    characters = ["blank", *meta["character"].splitlines(), " "]  # use_space_char
    crop = shared_dir / "data/ocr/rec_crops/paddleocr/imgs_words__en_word_1.png"
    [sample] = load_samples(crop, metas, "ppocr-rec")
    assert sample.feeds["x"].shape == (1, 3, 48, 320)
    [logits] = session.run(None, sample.feeds)
    assert _ctc_greedy(logits, characters).lower() == "joint"
    # The wrong channel order/normalisation must not read the same: the check has teeth.
    [wrong] = load_samples(crop, metas, "ppocr-rec:order=rgb,mean=0,std=1,scale=1")
    [bad_logits] = session.run(None, wrong.feeds)
    assert _ctc_greedy(bad_logits, characters).lower() != "joint"


def test_ppocr_rec_and_cls_on_all_crops(shared_dir: Path) -> None:
    rec, rec_inputs = _session(shared_dir / "models/ppocrv4/rec.onnx")
    cls, cls_inputs = _session(shared_dir / "models/ppocrv4/cls.onnx")
    crops = str(shared_dir / "data/ocr/rec_crops/rapidocr/*")
    for sample in load_samples(crops, rec_inputs, "ppocr-rec"):
        assert sample.feeds["x"].shape[2] == 48 and sample.feeds["x"].shape[3] >= 320
        rec.run(None, sample.feeds)
    for sample in load_samples(crops, cls_inputs, "ppocr-cls"):
        assert sample.feeds["x"].shape == (1, 3, 48, 192)
        [probs] = cls.run(None, sample.feeds)
        assert probs.shape == (1, 2)


def test_real_polygraphy_files(shared_dir: Path) -> None:
    folder = (shared_dir / "data/polygraphy/NVIDIA_trt-samples-for-hackathon-cn"
              / "RunExample_2023_trt861")
    x = TensorMeta("tensorX", np.dtype(np.float32), ("b", 1, 28, 28))
    [sample] = load_samples(folder / "input.json", [x])
    assert sample.feeds["tensorX"].shape == (4, 1, 28, 28)
    assert 0.0 <= sample.feeds["tensorX"].min() and sample.feeds["tensorX"].max() <= 1.0
    outputs = load_polygraphy_outputs(folder / "output.json")
    [(runner, iterations)] = outputs.items()
    assert runner.startswith("trt-runner")
    assert iterations[0]["A-V-12-Add"].shape == (4, 10)
    assert iterations[0]["A-V-14-ArgMax"].dtype == np.int32
    np.testing.assert_array_equal(iterations[0]["A-V-14-ArgMax"].ravel(),
                                  iterations[0]["A-V-12-Add"].argmax(axis=-1).ravel())
