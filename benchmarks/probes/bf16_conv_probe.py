"""How ONNX Runtime CUDA computes a BF16 / FP16 convolution with a bias, layer by layer, on the
real activations of a written model (it explained a measurement of 2026-11-25: "CUDA's BF16
convolutions are 2-5x less exact than FP32 accumulation rounded once" on some layers of PP-OCRv4 cls
and PP-LCNet).

Two models of the kernel, both from the same rounded input, weights and bias:

* ``once``: the FP32 convolution plus the bias, rounded once to the format (what the emulator
  assumes: ``precision.emulate``).
* ``twice``: the convolution without the bias rounded to the format, then the bias added and
  the sum rounded again (a convolution kernel that writes its output in the format and a
  separate bias-add kernel, e.g. ``cudnnAddTensor``).

For every Conv of the written model whose input is BF16: its real input (the written model on
ONNX Runtime CUDA, that tensor marked as an output), then the node alone on CUDA in BF16 and in
FP16 (the same values; FP16 holds every BF16 value in its range), compared with ``once`` and
``twice`` computed with ONNX Runtime CPU FP32 and ``ml_dtypes`` rounding: the share of elements
equal to each model, and each one's relative L2 error against the unrounded FP32 result.

There (GPU machine, after ``benchmarks/gpu_setup.sh``), on folders packed by
``benchmarks/bf16_gpu.py pack --engine ort-cuda``::

    export PYTHONPATH=/tmp/site:$PWD/src
    python3 -P benchmarks/probes/bf16_conv_probe.py .gpu/bf16cuda/cls --samples 2 \\
        --out $OUT/probe.json

``--provider cpu`` is a dry run here (ONNX Runtime CPU has no BF16 Conv: the BF16 rows fail
and say so).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from precision_doctor.graph.outputs import mark_outputs  # noqa: E402
from precision_doctor.runners.emulator import WrittenEmulatorRunner  # noqa: E402
from precision_doctor.runners.ort import OrtRunner  # noqa: E402

FORMATS = {"bf16": (TensorProto.BFLOAT16, ml_dtypes.bfloat16),
           "fp16": (TensorProto.FLOAT16, np.float16)}


def _runner(model: onnx.ModelProto, provider: str) -> OrtRunner:
    if provider == "cuda":
        return OrtRunner(model, ["CUDAExecutionProvider"],
                         [{"use_tf32": "0", "cudnn_conv_algo_search": "HEURISTIC"}],
                         strict_providers=True)
    return OrtRunner(model, ["CPUExecutionProvider"])


def _single(node: onnx.NodeProto, x_shape, weights: dict[str, np.ndarray], fmt: str,
            bias: bool = True) -> onnx.ModelProto:
    """``node`` alone: float32 input x, Cast to ``fmt``, Conv, Cast back (fmt 'fp32': none)."""
    inits, nodes = [], []
    x = "x"
    if fmt != "fp32":
        nodes.append(helper.make_node("Cast", ["x"], ["x_low"], to=FORMATS[fmt][0]))
        x = "x_low"
    ins = [x]
    for i, name in enumerate(node.input[1:], start=1):
        if i == 2 and not bias:
            break
        w = weights[name].astype(np.float32)
        t = numpy_helper.from_array(w, f"w{i}")
        if fmt != "fp32":
            t = helper.make_tensor(f"w{i}", FORMATS[fmt][0], w.shape,
                                   w.astype(FORMATS[fmt][1]).tobytes(), raw=True)
        inits.append(t)
        ins.append(f"w{i}")
    nodes.append(helper.make_node("Conv", ins, ["y_low"], **{
        a.name: helper.get_attribute_value(a) for a in node.attribute}))
    out = "y_low"
    if fmt != "fp32":
        nodes.append(helper.make_node("Cast", ["y_low"], ["y"], to=TensorProto.FLOAT))
        out = "y"
    graph = helper.make_graph(nodes, "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)], ir_version=10)


def _run(model: onnx.ModelProto, provider: str, x: np.ndarray) -> np.ndarray:
    with _runner(model, provider) as r:
        return next(iter(r.run({"x": x}).values())).astype(np.float32)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    d = np.linalg.norm((a.astype(np.float64) - b).ravel())
    return float(d / max(np.linalg.norm(b.astype(np.float64).ravel()), 1e-30))


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    out = {}
    for t in model.graph.initializer:
        a = numpy_helper.to_array(t)
        if t.data_type == TensorProto.BFLOAT16:
            a = a.view(ml_dtypes.bfloat16) if a.dtype == np.uint16 else a
        out[t.name] = np.asarray(a).astype(np.float32)
    return out


def probe(folder: Path, provider: str, samples: int, limit: int) -> dict:
    model = onnx.load(folder / "model.onnx")
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in
             [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    weights = _weights(model)
    convs = [n for n in model.graph.node if n.op_type == "Conv"
             and types.get(n.input[0]) == TensorProto.BFLOAT16 and len(n.input) == 3
             and n.input[1] in weights and n.input[2] in weights][:limit]
    data = np.load(folder / "inputs.npz")
    keys = sorted(data.files)
    names = sorted({k.split("/", 1)[1] if "/" in k else k for k in keys})
    feeds = []
    for i in range(samples):
        f = {n: data[f"{i}/{n}"] for n in names if f"{i}/{n}" in data.files}
        if f:
            feeds.append(f)
    marked = mark_outputs(model, [n.input[0] for n in convs])
    for name in dict.fromkeys(n.input[0] for n in convs):  # BF16 outputs: as float32 (exact)
        marked.graph.node.append(helper.make_node("Cast", [name], [f"{name}__f32"],
                                                  to=TensorProto.FLOAT))
        marked.graph.output.append(helper.make_tensor_value_info(f"{name}__f32",
                                                                 TensorProto.FLOAT, None))
    keep = {f"{n.input[0]}__f32" for n in convs} | {o.name for o in model.graph.output}
    outputs = [o for o in marked.graph.output if o.name in keep]
    del marked.graph.output[:]
    marked.graph.output.extend(outputs)
    # the real inputs on CUDA; on the CPU (dry run) the exact emulation of the written model
    with (_runner(marked, provider) if provider == "cuda"
          else WrittenEmulatorRunner(marked)) as r:
        acts = [r.run(f) for f in feeds]
    rows = []
    for node in convs:
        row: dict = {"node": node.name, "weights": list(weights[node.input[1]].shape)}
        for fmt in ("bf16", "fp16"):
            agg = {"n": 0, "eq_once": 0, "eq_twice": 0, "real": 0.0, "once": 0.0, "twice": 0.0,
                   "ref2": 0.0}
            try:
                for a in acts:
                    x = np.asarray(a[f"{node.input[0]}__f32"]).astype(np.float32)
                    real = _run(_single(node, x.shape, weights, fmt), provider, x)
                    z = _run(_single(node, x.shape, weights, "fp32", bias=False), "cpu", x)
                    b = weights[node.input[2]].reshape(1, -1, *([1] * (z.ndim - 2)))
                    low = FORMATS[fmt][1]
                    exact = z + b
                    once = exact.astype(low).astype(np.float32)
                    twice = (z.astype(low).astype(np.float32) + b).astype(low).astype(np.float32)
                    agg["n"] += real.size
                    agg["eq_once"] += int(np.count_nonzero(real == once))
                    agg["eq_twice"] += int(np.count_nonzero(real == twice))
                    e64 = exact.astype(np.float64)
                    agg["ref2"] += float(np.sum(e64 * e64))
                    for k, v in (("real", real), ("once", once), ("twice", twice)):
                        agg[k] += float(np.sum((v.astype(np.float64) - e64) ** 2))
            except Exception as exc:  # noqa: BLE001 - e.g. no BF16 Conv on the CPU
                row[fmt] = {"error": str(exc).splitlines()[0][:200]}
                continue
            ref = max(agg.pop("ref2"), 1e-300) ** 0.5
            n = agg["n"]
            row[fmt] = {"share_equal_once": agg["eq_once"] / n, "share_equal_twice":
                        agg["eq_twice"] / n, **{f"rel_l2_{k}": agg[k] ** 0.5 / ref
                                                for k in ("real", "once", "twice")}}
        rows.append(row)
        b, f = row.get("bf16", {}), row.get("fp16", {})
        print(f"{node.name:28s} bf16 eq once {b.get('share_equal_once', float('nan')):.3f} "
              f"twice {b.get('share_equal_twice', float('nan')):.3f} err real/once/twice "
              f"{b.get('rel_l2_real', float('nan')):.2e} {b.get('rel_l2_once', float('nan')):.2e} "
              f"{b.get('rel_l2_twice', float('nan')):.2e} | fp16 eq once "
              f"{f.get('share_equal_once', float('nan')):.3f} twice "
              f"{f.get('share_equal_twice', float('nan')):.3f}", flush=True)
    return {"folder": folder.name, "convs": len(rows), "samples": len(acts), "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--provider", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--limit", type=int, default=80, help="Conv nodes per model at most")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.provider == "cuda":
        import onnxruntime

        onnxruntime.preload_dlls()
    t = time.perf_counter()
    results = [probe(f, args.provider, args.samples, args.limit) for f in args.folders]
    out = {"date": time.strftime("%Y-%m-%d"), "seconds": time.perf_counter() - t,
           "provider": args.provider, "results": results}
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))
    print(f"{out['seconds']:.1f} s")


if __name__ == "__main__":
    main()
