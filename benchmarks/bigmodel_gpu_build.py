"""The build step of ``benchmarks/bigmodel_gpu.py`` (there, on the lent GPU machine, offline):
BERT-large from its config numbers with seeded weights, exported to ONNX with external data and
checked against PyTorch; its seeded samples; and ``derive``, the same model with one LayerNorm
scaled. ``bigmodel_gpu.py``'s docstring gives the numbers and why."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
# bert-large-uncased's config.json (no network on the GPU machine: the numbers, not the hub)
BERT_LARGE = dict(vocab_size=30522, hidden_size=1024, num_hidden_layers=24,
                  num_attention_heads=16, intermediate_size=4096, hidden_act="gelu",
                  hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                  max_position_embeddings=512, type_vocab_size=2, initializer_range=0.02,
                  layer_norm_eps=1e-12, pad_token_id=0)


def make_samples(folder: Path, samples: int, batch: int, seq: int, seed: int) -> list[Path]:
    """Write ``folder/s<k>.npz`` (see the module docstring); returns their paths."""
    import numpy as np

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(samples):
        ids = rng.integers(1000, 30000, size=(batch, seq), dtype=np.int64)
        ids[:, 0] = 101
        mask = np.zeros((batch, seq), dtype=np.int64)
        types = np.zeros((batch, seq), dtype=np.int64)
        for row in range(batch):
            n = max(2, seq - row * seq // 4)
            mask[row, :n] = 1
            types[row, n // 2:n] = 1
            ids[row, n:] = 0
        path = folder / f"s{k}.npz"
        np.savez(path, input_ids=ids, attention_mask=mask, token_type_ids=types)
        paths.append(path)
    return paths


def build(folder: Path, layers: int, samples: int, batch: int, seq: int, seed: int,
          scale_ln: str | None) -> dict:
    """Build, export and check the model; write ``folder/build.json``; returns its record."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch
    import transformers
    from transformers import BertConfig, BertModel

    t0 = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = BertConfig(**dict(BERT_LARGE, num_hidden_layers=layers))
    config._attn_implementation = "eager"  # plain MatMul/Softmax (as export_minilm.py)
    bert = BertModel(config).eval()
    params = sum(p.numel() for p in bert.parameters())
    scaled = None
    if scale_ln:
        name, factor = scale_ln.split("=")
        module = dict(bert.named_modules())[name]
        with torch.no_grad():
            module.weight.mul_(float(factor))
            module.bias.mul_(float(factor))
        scaled = {"module": name, "factor": float(factor)}

    class Encoder(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):  # noqa: ANN001
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    enc = Encoder(bert).eval()
    paths = make_samples(folder / "inputs", samples, batch, seq, seed)
    feeds = dict(np.load(paths[0]))
    built = time.perf_counter() - t0
    tmp = folder / "export_tmp.onnx"
    axes = {k: {0: "batch", 1: "sequence"} for k in (*INPUT_NAMES, "last_hidden_state")}
    t = time.perf_counter()
    with torch.no_grad():
        torch.onnx.export(enc, tuple(torch.from_numpy(feeds[k]) for k in INPUT_NAMES), str(tmp),
                          dynamo=False, opset_version=17, input_names=list(INPUT_NAMES),
                          output_names=["last_hidden_state"], dynamic_axes=axes,
                          do_constant_folding=True)
    exported = time.perf_counter() - t
    t = time.perf_counter()
    model = onnx.load(str(tmp))
    path = folder / "model.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=1024)
    del model
    for p in folder.glob("export_tmp.onnx*"):
        p.unlink()
    for p in folder.iterdir():  # the TorchScript exporter's per-tensor files, if any
        if p.is_file() and p.name not in ("model.onnx", "model.onnx.data", "build.log"):
            p.unlink()
    resaved = time.perf_counter() - t
    t = time.perf_counter()
    with torch.no_grad():
        ref = enc(*(torch.from_numpy(feeds[k]) for k in INPUT_NAMES)).numpy()
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {k: feeds[k] for k in INPUT_NAMES})[0]
    checked = time.perf_counter() - t
    proto = onnx.load(str(path), load_external_data=False)
    ops: dict[str, int] = {}
    for node in proto.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    record = {
        "config": dict(BERT_LARGE, num_hidden_layers=layers), "seed": seed,
        "parameters": params, "scaled_layernorm": scaled,
        "samples": {"count": samples, "batch": batch, "seq": seq,
                    "real_tokens_per_row": [max(2, seq - r * seq // 4) for r in range(batch)]},
        "files_bytes": {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()},
        "nodes": len(proto.graph.node), "ops": dict(sorted(ops.items(), key=lambda kv: -kv[1])),
        "opset": 17, "max_abs_diff_ort_cpu_vs_torch": float(np.max(np.abs(
            got.astype(np.float64) - ref.astype(np.float64)))),
        "output_max_abs": float(np.max(np.abs(ref))),
        "seconds": {"init": round(built, 1), "export": round(exported, 1),
                    "resave_external": round(resaved, 1), "check": round(checked, 1),
                    "total": round(time.perf_counter() - t0, 1)},
        "torch": torch.__version__, "transformers": transformers.__version__,
        "onnx": onnx.__version__, "onnxruntime_check": ort.__version__,
    }
    (folder / "build.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1), flush=True)
    return record


def derive(src: Path, folder: Path, scale_ln: str) -> dict:
    """``src``'s model with one LayerNorm's weight and bias multiplied (``MODULE=FACTOR``), in
    ``folder`` with the same samples: no second export. The TorchScript exporter shares
    equal initializers through ``Identity`` nodes (every LayerNorm weight is ones at init), so
    the scaled weight and bias are new initializers that this LayerNorm alone reads."""
    import shutil

    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    t0 = time.perf_counter()
    module, factor = scale_ln.split("=")
    model = onnx.load(str(src / "model.onnx"))
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    alias = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Identity"}

    def value(name: str) -> np.ndarray:
        while name not in inits:
            name = alias[name]
        return numpy_helper.to_array(inits[name])

    node = next(n for n in graph.node if n.op_type == "LayerNormalization"
                and n.input[1] == f"inner.{module}.weight")
    for k, suffix in ((1, "weight"), (2, "bias")):
        scaled = (value(node.input[k]) * np.float32(factor)).astype(np.float32)
        name = f"inner.{module}.{suffix}.scaled"
        graph.initializer.append(numpy_helper.from_array(scaled, name))
        node.input[k] = name
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src / "inputs", folder / "inputs", dirs_exist_ok=True)
    path = folder / "model.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=1024)
    del model
    feeds = dict(np.load(folder / "inputs" / "s0.npz"))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {k: feeds[k] for k in INPUT_NAMES})[0]
    record = json.loads((src / "build.json").read_text())
    record.update(
        derived_from=str(src), scaled_layernorm={"module": module, "factor": float(factor),
                                                 "node": node.name},
        output_max_abs=float(np.max(np.abs(got))),
        output_share_over_fp16_max=float(np.mean(np.abs(got) > 65504)),
        files_bytes={p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()},
        seconds={"derive": round(time.perf_counter() - t0, 1)})
    record.pop("max_abs_diff_ort_cpu_vs_torch", None)
    (folder / "build.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: record[k] for k in ("scaled_layernorm", "output_max_abs",
                                             "output_share_over_fp16_max", "seconds")}))
    return record
