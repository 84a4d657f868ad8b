"""Dynamically quantized encoders: ``onnxruntime.quantization.quantize_dynamic`` on real models.

What an ONNX Runtime user does to shrink a transformer for the CPU: ``quantize_dynamic`` with its
defaults (QInt8 weights, per tensor, ``MatMulInteger``/``ConvInteger`` fed by
``DynamicQuantizeLinear``; the int32 accumulator is Cast to float and multiplied by the two
scales). Such a model is still an FP32 model to the precision tools: its float tensors (the Casts
from int32, the scale Muls, the LayerNorms, the attention) are what FP16 changes.

Models (float sources, provenance in ``benchmarks/MODELS.md``):

- ``minilm14`` / ``minilm17``: ``.models/minilm_op{14,17}.onnx`` (``export_minilm.py``);
- ``whisper14`` / ``whisper17``: ``.models/whisper_enc_op{14,17}.onnx`` (``export_whisper.py``);
- ``rec``: PP-OCRv4 rec as the ``rapidocr_onnxruntime`` wheel ships it, MatMuls only
  (``op_types_to_quantize=["MatMul"]``: its SVTR transformer blocks, the recipe for encoders);
- ``rec_all``: the same with the default operator list (its 38 Convs become ``ConvInteger``).
- ``*_pc``: ``per_channel=True`` (one weight scale per output channel) of minilm17/whisper17/rec.

The PP-OCRv4 rec file stores its weights as ``Constant`` nodes (paddle2onnx), which
``quantize_dynamic`` refuses ("Expected conv2d_157.w_0 to be an initializer");
:func:`constants_to_initializers` moves them to initializers first (bit-exact, same graph).

Run (after the two exports)::

    python -m benchmarks run quantize_zoo                 # all into .models/quantized/
    python3 benchmarks/quantize_zoo.py --models rec,minilm17

Writes ``.models/quantized/NAME.onnx`` and, per model, ONNX Runtime CPU FP32 of the quantized
model vs the float model on the real inputs (rel L2 = ||q - f|| / ||f|| per sample; rec: also
the share of time steps whose argmax character agrees; MiniLM: the pooled-embedding cosine)
into ``benchmarks/results/quantize_zoo_<date>_<machine>.json`` (``common.results_path``).
``tests/real_quantized.py`` imports :func:`quantize` and :func:`rec_source` from here (CI builds
the quantized rec in a tmp dir).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / ".models"
OUT = MODELS / "quantized"
SHARED = REPO.parent / "shared"
REC_IN_WHEEL = ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx")
REC_CROPS = ("data", "ocr", "rec_crops", "paddleocr")

# name -> (float source under .models or "rec", op_types_to_quantize, per_channel)
CASES: dict[str, tuple[str, tuple[str, ...] | None, bool]] = {
    "minilm14": ("minilm_op14.onnx", None, False),
    "minilm17": ("minilm_op17.onnx", None, False),
    "minilm17_pc": ("minilm_op17.onnx", None, True),
    "whisper14": ("whisper_enc_op14.onnx", None, False),
    "whisper17": ("whisper_enc_op17.onnx", None, False),
    "whisper17_pc": ("whisper_enc_op17.onnx", None, True),
    "rec": ("rec", ("MatMul",), False),
    "rec_pc": ("rec", ("MatMul",), True),
    "rec_all": ("rec", None, False),
}


def rec_source(shared: Path = SHARED) -> Path | None:
    """PP-OCRv4 rec (float32, opset 12): the file in the installed ``rapidocr_onnxruntime``
    wheel (1.4.4, byte-identical to ``shared/models/ppocrv4/rec.onnx``), else the shared copy;
    ``None`` when neither exists."""
    spec = importlib.util.find_spec(REC_IN_WHEEL[0])
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            path = Path(folder) / REC_IN_WHEEL[1]
            if path.is_file():
                return path
    path = shared / "models" / "ppocrv4" / "rec.onnx"
    return path if path.is_file() else None


def constants_to_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose top-level ``Constant`` nodes holding a tensor (``value``) are
    initializers of the same name and bytes (``quantize_dynamic`` quantizes initializers only).

    Args:
        model: Any ONNX model; subgraphs are left as they are.

    Returns:
        The new model; node order otherwise unchanged.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = []
    for node in out.graph.node:
        attrs = list(node.attribute)
        if node.op_type == "Constant" and len(attrs) == 1 and attrs[0].name == "value":
            tensor = onnx.TensorProto()
            tensor.CopyFrom(attrs[0].t)
            tensor.name = node.output[0]
            out.graph.initializer.append(tensor)
        else:
            keep.append(node)
    del out.graph.node[:]
    out.graph.node.extend(keep)
    return out


def quantize(source: Path, out: Path, op_types: Sequence[str] | None = None,
             per_channel: bool = False) -> Path:
    """``quantize_dynamic(source)`` written to ``out`` (QInt8 weights, no calibration).

    Args:
        source: A float32 ONNX model (weights as initializers or ``Constant`` nodes).
        out: Where to write the quantized model (parent folders are created).
        op_types: ``op_types_to_quantize`` (``None``: ONNX Runtime's default list).
        per_channel: One weight scale per output channel instead of per tensor.

    Returns:
        ``out``.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.getLogger().setLevel(logging.ERROR)  # "consider pre-processing": not what users do
    out.parent.mkdir(parents=True, exist_ok=True)
    model = constants_to_initializers(onnx.load(str(source)))
    quantize_dynamic(model, out, op_types_to_quantize=list(op_types) if op_types else None,
                     per_channel=per_channel, weight_type=QuantType.QInt8)
    return out


def real_feeds(name: str, shared: Path = SHARED, max_samples: int = 32) -> list[dict]:
    """The real inputs of case ``name``: MiniLM's 16 sentences (2 batches of 8, 128 tokens),
    Whisper's 9 log-mel clips, or the rec crops (``ppocr-rec`` preprocessing).

    Raises:
        FileNotFoundError: The export's data or the shared crops are missing.
    """
    if name.startswith("minilm"):
        files = sorted((MODELS / "minilm_data").glob("*.npz"))
    elif name.startswith("whisper"):
        files = sorted((MODELS / "whisper_data").glob("*.npz"))
    else:
        from precision_doctor.graph import input_metadata, load_model
        from precision_doctor.inputs import load_samples

        crops = shared.joinpath(*REC_CROPS)
        if not crops.is_dir():
            raise FileNotFoundError(f"{crops}: the rec crops of ../shared are missing")
        meta = input_metadata(load_model(rec_source(shared)))
        return [s.feeds for s in load_samples(crops, meta, "ppocr-rec", max_samples=max_samples)]
    if not files:
        raise FileNotFoundError(f"no samples for {name}: run benchmarks/export_*.py first")
    return [dict(np.load(f)) for f in files[:max_samples]]


def compare(float_path: Path, quant_path: Path, feeds: list[dict]) -> dict:
    """ONNX Runtime CPU FP32: the quantized model against the float model on ``feeds``.

    Returns:
        ``rel_l2`` (median, max over samples, first output), ``argmax_agree`` (mean share of
        positions whose last-axis argmax agrees: characters for rec), NaN count of the
        quantized outputs; with an ``attention_mask`` (MiniLM) also the cosine of the
        mask-mean-pooled sentence embeddings (what sentence-transformers' Pooling(mean)
        computes), min and mean over sentences.
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    ref = ort.InferenceSession(str(float_path), opts, providers=["CPUExecutionProvider"])
    run = ort.InferenceSession(str(quant_path), opts, providers=["CPUExecutionProvider"])
    rel, agree, cos, nans = [], [], [], 0
    for feed in feeds:
        a = ref.run(None, feed)[0].astype(np.float64)
        b = run.run(None, feed)[0].astype(np.float64)
        nans += int(np.isnan(b).sum())
        rel.append(float(np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-30)))
        agree.append(float((a.argmax(-1) == b.argmax(-1)).mean()))
        if "attention_mask" in feed:
            mask = feed["attention_mask"][..., None].astype(np.float64)
            pa, pb = (a * mask).sum(1), (b * mask).sum(1)
            cos += list((pa * pb).sum(1) / np.linalg.norm(pa, axis=1) / np.linalg.norm(pb, axis=1))
    row = {"samples": len(feeds), "rel_l2_median": float(np.median(rel)),
           "rel_l2_max": max(rel), "argmax_agree": float(np.mean(agree)), "nan": nans}
    if cos:
        row["pooled_cosine_min"], row["pooled_cosine_mean"] = float(min(cos)), float(np.mean(cos))
    return row


def source_path(name: str) -> Path | None:
    """The float model that case ``name`` quantizes, or ``None`` when it is not there."""
    src = CASES[name][0]
    if src == "rec":
        return rec_source()
    path = MODELS / src
    return path if path.is_file() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(CASES))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--results", type=Path)
    args = parser.parse_args()
    from common import results_path, write_results

    args.results = args.results or results_path("quantize_zoo")
    results: dict = {"models": {}}
    if args.results.is_file():  # --models re-runs some: keep the others' rows
        results["models"] = json.loads(args.results.read_text()).get("models", {})
    for name in args.models.split(","):
        src = source_path(name)
        if src is None:
            print(f"{name}: float source missing ({CASES[name][0]}), skipped")
            continue
        _, op_types, per_channel = CASES[name]
        dst = quantize(src, args.out / f"{name}.onnx", op_types, per_channel)
        ops = Counter(n.op_type for n in onnx.load(str(dst)).graph.node)
        row = {"source": (f".models/{src.name}" if src.parent == MODELS
                          else f"{src.parent.parent.name}/{src.parent.name}/{src.name}"),
               "op_types": op_types, "per_channel": per_channel,
               "mib": round(dst.stat().st_size / 2**20, 2),
               "float_mib": round(src.stat().st_size / 2**20, 2),
               "ops": {k: ops[k] for k in ("MatMulInteger", "ConvInteger",
                                           "DynamicQuantizeLinear", "Cast", "MatMul", "Conv")
                       if ops[k]},
               "vs_float_ort_cpu": compare(src, dst, real_feeds(name))}
        results["models"][name] = row
        print(name, json.dumps(row))
    print(f"wrote {write_results(args.results, results)}")


if __name__ == "__main__":
    main()
