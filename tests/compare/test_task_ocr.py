"""CTC decoding, charset from model metadata, margins, CER; real PP-OCRv4 rec decoding."""

import json
import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from precision_doctor.compare.tasks.ocr import (
    OcrSample,
    character_error_rate,
    ctc_best_path,
    ctc_char_agreement,
    ctc_charset_from_model,
    ctc_details,
    ctc_greedy_decode,
    ctc_margin,
    ctc_string_agreement,
    edit_distance,
)
from precision_doctor.errors import MetricError

CHARSET = ["", "a", "b", " "]


def probs_for(paths, classes=4, top=0.7):
    """[N, T, C] probabilities whose argmax follows each index path."""
    out = np.full((len(paths), len(paths[0]), classes), (1 - top) / (classes - 1))
    for n, path in enumerate(paths):
        out[n, np.arange(len(path)), path] = top
    return out


def test_greedy_decode_collapses_repeats_and_drops_blank():
    p = probs_for([[1, 1, 0, 1, 2, 2], [0, 0, 0, 0, 0, 0]])
    p[0, 3, 1] = 0.9  # kept steps 0, 3, 4 -> confidence (0.7 + 0.9 + 0.7) / 3
    (seq, conf), (empty, conf0) = ctc_best_path(p)
    assert seq == (1, 1, 2) and conf == pytest.approx(2.3 / 3)
    assert empty == () and conf0 == 0.0
    assert ctc_greedy_decode(p, CHARSET)[0] == ("aab", pytest.approx(2.3 / 3))
    assert ctc_greedy_decode(p[0], CHARSET)[0][0] == "aab"  # [T, C] is one sample
    with pytest.raises(MetricError, match="5 entries but the output has 4"):
        ctc_greedy_decode(p, [*CHARSET, "c"])


def test_ctc_margin_min_over_non_blank_steps():
    p = np.array([[[0.1, 0.6, 0.3], [0.9, 0.05, 0.05], [0.2, 0.3, 0.5]],
                  [[0.5, 0.4, 0.1], [0.8, 0.1, 0.1], [0.6, 0.3, 0.1]]])
    # sample 0: non-blank steps 0 (0.6-0.3) and 2 (0.5-0.3) -> 0.2; step 1 (blank) ignored
    m = ctc_margin(p)
    assert m[0] == pytest.approx(0.2) and m[1] == math.inf


def test_edit_distance_and_cer():
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("", "abc") == 3 and edit_distance((1, 2), (1, 2)) == 0
    # (1 + 0) edits over (4 + 2) reference characters
    assert character_error_rate(["abcd", "xy"], ["abed", "xy"]) == pytest.approx(1 / 6)
    assert character_error_rate([""], [""]) == 0.0 and character_error_rate([""], ["a"]) == 1.0


def test_string_and_char_agreement_with_and_without_charset():
    ref = {"y": probs_for([[1, 2, 0], [2, 0, 1], [1, 1, 1]])}  # "ab", "ba", "a"
    cand = {"y": probs_for([[1, 2, 0], [2, 0, 2], [3, 1, 1]])}  # "ab", "bb", " a"
    assert ctc_string_agreement(ref, cand) == pytest.approx(1 / 3)  # class indices
    assert ctc_string_agreement(ref, cand, charset=CHARSET) == pytest.approx(1 / 3)
    # CER = (0 + 1 + 1) / (2 + 2 + 1)
    assert ctc_char_agreement(ref, cand, charset=CHARSET) == pytest.approx(1 - 2 / 5)
    samples = ctc_details(ref, cand, charset=CHARSET)
    assert [(s.reference_text, s.candidate_text, s.equal) for s in samples] == [
        ("ab", "ab", True), ("ba", "bb", False), ("a", " a", False)]
    assert OcrSample.from_dict(json.loads(json.dumps(samples[1].to_dict()))) == samples[1]
    with pytest.raises(MetricError, match="ignore_case=true needs the character list"):
        ctc_string_agreement(ref, cand, ignore_case=True)


def test_ignore_case():
    charset = ["", "a", "A"]
    ref, cand = {"y": probs_for([[1, 0]], 3)}, {"y": probs_for([[2, 0]], 3)}
    assert ctc_string_agreement(ref, cand, charset=charset) == 0.0
    assert ctc_string_agreement(ref, cand, charset=charset, ignore_case=True) == 1.0


def rec_like_model(characters, classes):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "t", classes])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "t", classes])
    model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])],
                                                "rec", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 12)], ir_version=8)
    if characters is not None:
        helper.set_model_props(model, {"character": characters})
    return model


def test_charset_from_model_metadata(tmp_path):
    assert ctc_charset_from_model(rec_like_model("a\nb", 4)) == ["", "a", "b", " "]
    assert ctc_charset_from_model(rec_like_model("a\nb", 3)) == ["", "a", "b"]
    with pytest.raises(MetricError, match="output has 7 classes"):
        ctc_charset_from_model(rec_like_model("a\nb", 7))
    with pytest.raises(MetricError, match="no 'character' metadata"):
        ctc_charset_from_model(rec_like_model(None, 4))
    path = tmp_path / "rec.onnx"
    onnx.save(rec_like_model("a\nb", 4), path)
    ref = {"y": probs_for([[1, 2, 3]])}
    samples = ctc_details(ref, ref, charset=str(path))
    assert samples[0].reference_text == "ab " and samples[0].equal
    keys = tmp_path / "keys.txt"
    keys.write_text("a\nb\n", encoding="utf-8")
    assert ctc_details(ref, ref, charset=str(keys))[0].reference_text == "ab "


# --- real data: PP-OCRv4 rec in FP32 decodes the upstream labels -----------------------------

EXPECTED = {  # file under data/ocr/rec_crops -> label from LABELS_FROM_UPSTREAM.txt
    "paddleocr/imgs_words__ch_word_1.jpg": "韩国小馆",
    "paddleocr/imgs_words__ch_word_4.jpg": "实力活力",
    "paddleocr/imgs_words__en_word_1.png": "joint",
    "paddleocr/imgs_words__en_word_2.png": "yourself",
    "paddleocr/imgs_words_en__word_10.png": "pain",
    "paddleocr/imgs_words_en__word_336.png": "super",
    "rapidocr/en_rec.jpg": "To facilitate the shot type analysis in videos, we collect "
                           "MovieShots, a large-scale",
    "rapidocr/test_without_det.jpg": "在中国作家协会第三届儿童文学",
}


def _resize_bilinear(img, out_h, out_w):
    """cv2.resize INTER_LINEAR in float (half-pixel centres, edge clamp, no antialiasing)."""
    def taps(n_out, n_in):
        x = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
        x0 = np.floor(x).astype(int)
        return x0, np.minimum(x0 + 1, n_in - 1), x - x0
    y0, y1, fy = taps(out_h, img.shape[0])
    x0, x1, fx = taps(out_w, img.shape[1])
    img = img.astype(np.float32)
    rows = img[y0] * (1 - fy)[:, None, None] + img[y1] * fy[:, None, None]
    return rows[:, x0] * (1 - fx)[None, :, None] + rows[:, x1] * fx[None, :, None]


def rec_input(path):
    """RapidOCR 1.4.4 TextRecognizer.resize_norm_img for one image, rec_img_shape [3, 48, 320]."""
    from PIL import Image
    bgr = np.asarray(Image.open(path).convert("RGB"))[..., ::-1]  # as cv2.imread
    h, w = bgr.shape[:2]
    img_w = int(48 * max(320 / 48, w / h))
    resized_w = min(img_w, math.ceil(48 * w / h))
    x = (_resize_bilinear(bgr, 48, resized_w).transpose(2, 0, 1) / 255 - 0.5) / 0.5
    out = np.zeros((1, 3, 48, img_w), np.float32)
    out[0, :, :, :resized_w] = x
    return out


@pytest.mark.shared
def test_ppocrv4_rec_decodes_upstream_labels(shared_dir):
    ort = pytest.importorskip("onnxruntime")
    model = shared_dir / "models/ppocrv4/rec.onnx"
    charset = ctc_charset_from_model(model)
    assert len(charset) == 6625 and charset[-1] == " "
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    decoded = {}
    for name in EXPECTED:
        probs = session.run(None, {"x": rec_input(shared_dir / "data/ocr/rec_crops" / name)})[0]
        text, confidence = ctc_greedy_decode(probs, charset)[0]
        assert confidence > 0.9
        decoded[name] = text
        outputs = {"softmax_11.tmp_0": probs}
        assert ctc_string_agreement(outputs, outputs, charset=str(model)) == 1.0
    # English labels compare case-insensitively (older EN models print "JOINT", "PAIN")
    wrong = {n: t for n, t in decoded.items() if t.casefold() != EXPECTED[n].casefold()}
    assert not wrong, wrong
