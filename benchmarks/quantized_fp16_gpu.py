"""Real FP16 on the GPU for the dynamically quantized encoders (ONNX Runtime CUDA vs CPU FP32).

What a user does next after ``quantize_dynamic`` (``benchmarks/quantize_zoo.py``): convert the
quantized model to FP16 with ``onnxconverter_common.float16.convert_float_to_float16``
(``keep_io_types=True``) and run it with ONNX Runtime's CUDA EP. This measures, per model and
real sample, the rel L2 (``||y - ref|| / ||ref||``, first output, float64) and the NaN/Inf
counts of:

- ``cuda_fp32``: the quantized model as written (FP32 float side) on CUDA;
- ``cuda_fp16``: the converter's default (its ``DEFAULT_OP_BLOCK_LIST``);
- ``cuda_fp16_block_dql``: the converter with ``DynamicQuantizeLinear``, ``MatMulInteger``,
  ``ConvInteger`` and ``DequantizeLinear`` added to ``op_block_list`` (what one tries when the
  default model does not load: ``DynamicQuantizeLinear`` takes float32 only, and opset 17's
  ``DequantizeLinear``, which MiniLM's quantized embedding Gather uses, a float32 scale);
- ``cuda_fp16_cast_half``: that model made valid: the converter types the int32 -> float Casts'
  outputs float16 but leaves their ``to`` at float (ONNX Runtime: "Type (tensor(float16)) of
  output arg ... does not match"); here ``to`` becomes float16, so the int32 accumulator is cast
  straight to FP16, as a strongly typed FP16 model does; also run with all ONNX Runtime graph
  optimizations off (``_noopt``: no fusion of MatMulInteger/Cast/Mul) and on the CPU EP
  (``cpu_fp16_cast_half``);

each against ONNX Runtime CPU FP32 of the quantized model on the same inputs. A variant that
ONNX Runtime refuses to load or run is recorded with its error.

Two steps. Here (CPU; after ``quantize_zoo.py``)::

    python3 benchmarks/quantized_fp16_gpu.py prepare .gpu/qpayload

writes ``minilm17.onnx``, ``whisper17.onnx``, ``rec.onnx`` (the quantized models), their real
inputs (``NAME.sK.npz``: MiniLM's 2 batches of 8 sentences, Whisper's first 2 clips, rec's first
6 paddleocr crops in ``ppocr-rec`` preprocessing) and a copy of the pure-Python
``onnxconverter_common`` package (the GPU image lacks it), 42.3 MiB. On the lent GPU machine:
``onnxruntime-gpu`` 1.31.1 unpacked into /tmp/site (its xz stream as ``benchmarks/gpu_setup.sh``
packs it, 193.3 MiB, cut with ``dd bs=1M count=59`` into ``.gpu/qo0..3/part``; one ``run`` per
part, back to back while the machine stays warm, each ``cat``-ing its part onto /tmp/ort.tar.xz;
the last one carries ``.gpu/qo3`` and ``.gpu/qpayload``, checks the stream's sha256, unpacks it
with ``xz -dc | tar x -C /tmp/site`` and runs)::

    PYTHONPATH=/tmp/site:.gpu/qpayload/site python3 benchmarks/quantized_fp16_gpu.py \
        run .gpu/qpayload --out $OUT/quantized_fp16_gpu.json

Results: ``benchmarks/results/quantized_fp16_gpu_<date>_<gpu>.json`` (``common.write_results``:
date, machine, versions first).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / ".models"
NAMES = ("minilm17", "whisper17", "rec")
QUANT_OPS = ["DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "DequantizeLinear"]


def prepare(dest: Path) -> None:
    """Copy the quantized models, their real inputs and ``onnxconverter_common`` into ``dest``.

    Raises:
        FileNotFoundError: ``.models/quantized`` or an export's data is missing (run
            ``export_minilm.py``, ``export_whisper.py`` and ``quantize_zoo.py`` first).
    """
    import onnxconverter_common

    sys.path.insert(0, str(REPO / "benchmarks"))
    from quantize_zoo import real_feeds

    dest.mkdir(parents=True, exist_ok=True)
    limits = {"minilm17": 2, "whisper17": 2, "rec": 6}
    for name in NAMES:
        shutil.copy(MODELS / "quantized" / f"{name}.onnx", dest / f"{name}.onnx")
        for k, feed in enumerate(real_feeds(name, max_samples=limits[name])):
            np.savez(dest / f"{name}.s{k}.npz", **feed)
    site = dest / "site" / "onnxconverter_common"
    shutil.rmtree(site, ignore_errors=True)
    shutil.copytree(Path(onnxconverter_common.__file__).parent, site,
                    ignore=shutil.ignore_patterns("__pycache__"))
    total = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    print(f"{dest}: {total / 2**20:.1f} MiB")


def _stats(ref: np.ndarray, out: np.ndarray) -> dict:
    ref64, out64 = ref.astype(np.float64), out.astype(np.float64)
    finite = np.isfinite(out64)
    rel = (float(np.linalg.norm(out64 - ref64) / max(np.linalg.norm(ref64), 1e-30))
           if finite.all() else float("inf"))
    return {"rel_l2": rel, "nan": int(np.isnan(out64).sum()), "inf": int(np.isinf(out64).sum()),
            "size": int(out64.size)}


def _cast_half(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose Casts to float, with an output the converter typed float16, cast to
    float16 (``to`` = 10)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    half = {v.name for v in out.graph.value_info
            if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16}
    for node in out.graph.node:
        if node.op_type == "Cast" and node.output[0] in half:
            for attr in node.attribute:
                if attr.name == "to" and attr.i == onnx.TensorProto.FLOAT:
                    attr.i = onnx.TensorProto.FLOAT16
    return out


def _variants(model: onnx.ModelProto) -> dict[str, onnx.ModelProto | Exception]:
    from onnxconverter_common import float16

    out: dict[str, onnx.ModelProto | Exception] = {"cuda_fp32": model}
    for name, block in (("cuda_fp16", None),
                        ("cuda_fp16_block_dql", list(float16.DEFAULT_OP_BLOCK_LIST) + QUANT_OPS)):
        try:
            out[name] = float16.convert_float_to_float16(model, keep_io_types=True,
                                                         op_block_list=block)
        except Exception as exc:  # noqa: BLE001 - the converter's failure is a result
            out[name] = exc
    blocked = out["cuda_fp16_block_dql"]
    if isinstance(blocked, onnx.ModelProto):
        half = _cast_half(blocked)
        out.update({"cuda_fp16_cast_half": half, "cuda_fp16_cast_half_noopt": half,
                    "cpu_fp16_cast_half": half})
    return out


def run(payload: Path) -> dict:
    """Every model of ``payload``: ORT CPU FP32 reference, then each variant on ORT CUDA."""
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    result: dict = {"onnxruntime": ort.__version__, "providers": ort.get_available_providers(),
                    "models": {}}
    cuda = [("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"]
    for name in NAMES:
        model = onnx.load(str(payload / f"{name}.onnx"))
        feeds = [dict(np.load(p)) for p in sorted(payload.glob(f"{name}.s*.npz"))]
        cpu = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        refs = [cpu.run(None, f)[0] for f in feeds]
        rows: dict = {}
        for variant, proto in _variants(model).items():
            if isinstance(proto, Exception):
                rows[variant] = {"error": f"convert: {type(proto).__name__}: {proto}"[:500]}
                continue
            opts = ort.SessionOptions()
            if variant.endswith("_noopt"):
                opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            try:
                sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=(
                    ["CPUExecutionProvider"] if variant.startswith("cpu") else cuda))
                t0 = time.perf_counter()
                outs = [sess.run(None, f)[0] for f in feeds]
                wall = time.perf_counter() - t0
            except Exception as exc:  # noqa: BLE001 - ORT's refusal is a result
                rows[variant] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                continue
            per = [_stats(r, o) for r, o in zip(refs, outs, strict=True)]
            rels = [p["rel_l2"] for p in per]
            rows[variant] = {
                "providers": sess.get_providers(), "samples": len(per),
                "rel_l2_median": float(np.median(rels)), "rel_l2_max": max(rels),
                "nan": sum(p["nan"] for p in per), "inf": sum(p["inf"] for p in per),
                "elements": sum(p["size"] for p in per), "per_sample_rel_l2": rels,
                "casts_to_fp16": sum(1 for n in proto.graph.node
                                  for a in n.attribute if a.name == "to" and a.i == 10),
                "run_s": round(wall, 3)}
        result["models"][name] = rows
        print(name, json.dumps({k: {kk: v.get(kk) for kk in ("rel_l2_max", "nan", "inf", "error")}
                                for k, v in rows.items()}), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("step", choices=("prepare", "run"))
    parser.add_argument("payload", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.payload)
        return
    result = run(args.payload)
    if args.out:
        from common import write_results

        write_results(args.out, result)


if __name__ == "__main__":
    main()
