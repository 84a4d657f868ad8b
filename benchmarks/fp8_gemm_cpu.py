"""The CPU side of ``benchmarks/fp8_gemm_gpu.py``: the emulation of one FP8 layer (``_emulate``),
the payload of MiniLM's weight MatMuls it prepares (``prepare``), and the models of the
tensor-core accumulator its ``accmodel`` step compares with the GPU's results. Only numpy is
imported at the top: the GPU machine's image has no onnxruntime (``prepare`` imports it)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / ".models"
PAYLOAD = "minilm_fp8_layers.npz"


def _short_name(node_name: str) -> str:
    """``/bert/encoder/layer.3/attention/self/query/MatMul`` -> ``L3.query``."""
    parts = node_name.strip("/").split("/")
    layer = next((p.split(".")[1] for p in parts if p.startswith("layer.")), "?")
    role = {"query": "q", "key": "k", "value": "v"}
    if "self" in parts:
        kind = role.get(parts[parts.index("self") + 1], parts[-2])
    elif "attention" in parts:
        kind = "attn_out"
    elif "intermediate" in parts:
        kind = "ffn_up"
    elif "output" in parts:
        kind = "ffn_down"
    else:
        kind = parts[-2]
    return f"L{layer}.{kind}"


def _emulate(x: np.ndarray, w: np.ndarray, per_channel: bool = True) -> dict[str, object]:
    """The emulation (``b``) and its FP8 storage bits, with ``precision_doctor.quant.qformats``."""
    from precision_doctor.quant.qformats import QUANT_FORMATS, fake_quant, quantize

    fmt = QUANT_FORMATS["fp8"]
    sx = fmt.scale_for(np.abs(x).max())
    amax_w = np.abs(w).max(axis=0) if per_channel else np.abs(w).max()
    sw = fmt.scale_for(amax_w)
    axis = 1 if per_channel else None
    y = (fake_quant(x, sx, fmt) @ fake_quant(w, sw, fmt, axis=axis)).astype(np.float16)
    qx = quantize(x, sx, fmt)
    qw = quantize(w, sw, fmt, axis=axis)
    return {"y": y, "sx": np.float32(sx), "sw": np.asarray(sw, dtype=np.float32),
            "qx": qx.view(np.uint8), "qw": qw.view(np.uint8)}


def _sha(bits: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(bits).tobytes()).hexdigest()[:16]


def _rel(y: np.ndarray, ref: np.ndarray) -> float:
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(np.asarray(y, dtype=np.float64) - ref) / np.linalg.norm(ref))


def prepare(dest: Path) -> Path:
    """Run MiniLM FP32 on ONNX Runtime CPU and save each weight MatMul's ``X`` and ``W``.

    Returns:
        The written ``dest/minilm_fp8_layers.npz``.

    Raises:
        FileNotFoundError: ``.models/minilm_op17.onnx`` or its inputs are missing (run
            ``benchmarks/export_minilm.py`` first).
    """
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    sys.path.insert(0, str(REPO / "src"))
    model_path = MODELS / "minilm_op17.onnx"
    feeds = dict(np.load(MODELS / "minilm_inputs.npz"))
    model = onnx.load(str(model_path))
    inits = {t.name: t for t in model.graph.initializer}
    layers, x_names = [], []
    for node in model.graph.node:
        weight = inits.get(node.input[1]) if node.op_type == "MatMul" else None
        if weight is not None and len(weight.dims) == 2:
            if node.input[0] not in x_names:
                x_names.append(node.input[0])
            layers.append({"node": node.name, "name": _short_name(node.name),
                           "x": f"x{x_names.index(node.input[0])}", "w": node.input[1]})
    graph_outputs = {o.name for o in model.graph.output}
    for name in x_names:
        if name not in graph_outputs:
            model.graph.output.append(onnx.helper.make_tensor_value_info(
                name, onnx.TensorProto.FLOAT, None))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    inputs = {i.name for i in sess.get_inputs()}
    outs = sess.run(x_names, {k: v for k, v in feeds.items() if k in inputs})
    keep = feeds["attention_mask"].astype(bool)  # [batch, seq]: the real tokens
    arrays: dict[str, np.ndarray] = {}
    for k, out in enumerate(outs):
        arrays[f"x{k}"] = np.ascontiguousarray(out[keep], dtype=np.float32)
    for k, layer in enumerate(layers):
        w = numpy_helper.to_array(inits[layer["w"]]).astype(np.float32)
        arrays[f"w{k}"] = w
        x = arrays[layer["x"]]
        exact = x.astype(np.float64) @ w.astype(np.float64)
        em = _emulate(x, w)
        layer.update(w=f"w{k}", M=int(x.shape[0]), K=int(w.shape[0]), N=int(w.shape[1]),
                     local_emul_rel=_rel(em["y"], exact), local_qx_sha=_sha(em["qx"]),
                     local_qw_sha=_sha(em["qw"]))
    import onnxruntime

    meta = {"model": model_path.name, "samples": int(keep.shape[0]),
            "rows": int(keep.sum()), "layers": layers,
            "prepared_with": {"onnxruntime": onnxruntime.__version__,
                              "numpy": np.__version__}}
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / PAYLOAD
    np.savez_compressed(path, meta=np.array(json.dumps(meta)), **arrays)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB): {len(layers)} layers, "
          f"{len(x_names)} inputs, {meta['rows']} rows")
    return path


def _accumulate(qx: np.ndarray, qw: np.ndarray, frac_bits: int, chunk: int,
                promote: bool) -> np.ndarray:
    """A model of the FP8 tensor-core accumulator: ``qx @ qw`` (FP8 values as float64) where,
    per ``chunk`` of the K axis, the exact products (and, without ``promote``, the running
    accumulator) are aligned to the largest exponent among them and truncated toward zero to
    ``frac_bits`` bits below it, then summed; with ``promote`` each chunk's sum is added to an
    FP32 accumulator (cuBLAS's promotion, ``use_fast_accum=False``)."""
    m, k = qx.shape
    acc = np.zeros((m, qw.shape[1]))
    for c0 in range(0, k, chunk):
        p = qx[:, c0:c0 + chunk, None] * qw[None, c0:c0 + chunk, :]
        if not promote:
            p = np.concatenate([acc[:, None, :], p], axis=1)
        top = np.abs(p).max(axis=1)
        lsb = np.exp2(np.floor(np.log2(np.where(top > 0, top, 1.0))) - frac_bits)[:, None, :]
        part = (np.trunc(p / lsb) * lsb).sum(axis=1)
        acc = (acc + part).astype(np.float32).astype(np.float64) if promote else part
    return acc


# (name, fraction bits, K chunk, promotion to FP32 after each chunk)
ACC_MODELS = (("fp32_exact_fp16_out", None, None, None),
              ("trunc13_k32_nopromote", 13, 32, False),
              ("trunc13_k128_promote", 13, 128, True),
              ("trunc14_k128_promote", 14, 128, True))


def accmodel(payload: Path, results: Path) -> dict[str, object]:
    """Compare the GPU's deviation from the exact FP8 product (``rel_real*_vs_q64`` in a ``run``
    results file) with models of the accumulator (``_accumulate``), per layer, on the CPU."""
    from precision_doctor.quant.qformats import QUANT_FORMATS, quantize

    sys.path.insert(0, str(REPO / "src"))
    fmt = QUANT_FORMATS["fp8"]
    data = np.load(payload / PAYLOAD)
    meta = json.loads(str(data["meta"]))
    measured = {r["layer"]: r for r in json.loads(results.read_text())["layers"]}
    rows = []
    for layer in meta["layers"]:
        x, w = data[layer["x"]], data[layer["w"]]
        sx = fmt.scale_for(np.abs(x).max())
        sw = fmt.scale_for(np.abs(w).max(axis=0)).astype(np.float64)
        qx = quantize(x, sx, fmt).astype(np.float64)
        qw = quantize(w, sw.astype(np.float32), fmt, axis=1).astype(np.float64)
        q64 = (qx @ qw) * np.float64(sx) * sw[None, :]
        got = measured[layer["name"]]
        row = {"layer": layer["name"], "gpu_real_vs_q64": got.get("rel_real_vs_q64"),
               "gpu_real_fast_vs_q64": got.get("rel_real_fast_vs_q64"),
               "emul_vs_q64": got.get("rel_emul_vs_q64")}
        for name, bits, chunk, promote in ACC_MODELS:
            acc = qx @ qw if bits is None else _accumulate(qx, qw, bits, chunk, promote)
            y = (acc * np.float64(sx) * sw[None, :]).astype(np.float16)
            row[name] = _rel(y, q64)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {"payload": {k: meta[k] for k in ("model", "samples", "rows")},
            "gpu_results": results.name,
            "models": [dict(zip(("name", "frac_bits", "k_chunk", "promote"), m))
                       for m in ACC_MODELS], "layers": rows}
