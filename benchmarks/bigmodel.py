"""A model larger than 2 GiB with external data: ``diagnose`` and ``fix`` on it.

The model is generated from a seeded numpy generator: ``--blocks`` (default 18) transformer-like
blocks, each a decomposed LayerNorm (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add)
followed by an MLP ``hidden -> ffn -> hidden`` (2048 -> 8192 -> 2048: MatMul, Add, Relu, MatMul,
Add) and a residual Add. 18 blocks hold 18 x 2 x 2048 x 8192 float32 weights = 2.25 GiB, above
protobuf's 2 GiB limit, so the model only exists as ``model.onnx`` + ``model.onnx.data``
(written one tensor at a time; the generator never holds more than one weight matrix). Weights
are N(0, 1/fan_in) (MLP output scaled by 0.5) so activations stay O(1) through the depth.

Then, each in a fresh subprocess (wall time and peak RSS from ``os.wait4``'s rusage of that
process, interpreter start and imports included):

1. ``precision-doctor diagnose model.onnx --data random:... --target fp16 --json`` (layerwise on);
2. ``precision-doctor fix model.onnx -o fixed/fixed.onnx --data random:...`` (default FP16
   tolerance);
3. ONNX Runtime CPU opens ``fixed/fixed.onnx`` from its path and runs one sample.

The files go to a temporary folder (``--dir`` to choose one; it is deleted at the end unless
``--keep``). Never commit them. Usage (repo root)::

    PYTHONPATH=src python benchmarks/bigmodel.py            # about 2.3 GB on disk, x3 with fix
    PYTHONPATH=src python benchmarks/bigmodel.py --blocks 2  # a quick 256 MiB check
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper
from onnx.external_data_helper import set_external_data

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import machine, measure_process, write_results  # noqa: E402


def _external(name: str, array: np.ndarray, out, location: str) -> TensorProto:
    """Append ``array`` to the open data file ``out`` (4096-aligned) and reference it."""
    pad = -out.tell() % 4096
    out.write(b"\0" * pad)
    offset = out.tell()
    out.write(np.ascontiguousarray(array).tobytes())
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(array.shape))
    tensor.raw_data = b""  # set_external_data requires the field; the data is in the file
    set_external_data(tensor, location, offset, array.nbytes)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    return tensor


def build(folder: Path, blocks: int, hidden: int, ffn: int, seq: int, seed: int) -> Path:
    """Write ``folder/model.onnx`` + ``model.onnx.data``; returns the model path."""
    rng = np.random.default_rng(seed)
    location = "model.onnx.data"
    nodes, inits = [], []
    inits.append(helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]))
    inits.append(helper.make_tensor("eps", TensorProto.FLOAT, [], [1e-5]))
    x = "x"
    with open(folder / location, "wb") as out:
        for b in range(blocks):
            p = f"b{b}"

            def node(op, ins, outs, name, p=p, **attrs):
                nodes.append(helper.make_node(op, ins, outs, name=f"{p}/{name}", **attrs))

            node("ReduceMean", [x], [f"{p}/mean"], "ln/mean", axes=[-1])
            node("Sub", [x, f"{p}/mean"], [f"{p}/d"], "ln/sub")
            node("Pow", [f"{p}/d", "two"], [f"{p}/d2"], "ln/pow")
            node("ReduceMean", [f"{p}/d2"], [f"{p}/var"], "ln/var", axes=[-1])
            node("Add", [f"{p}/var", "eps"], [f"{p}/ve"], "ln/add_eps")
            node("Sqrt", [f"{p}/ve"], [f"{p}/std"], "ln/sqrt")
            node("Div", [f"{p}/d", f"{p}/std"], [f"{p}/n"], "ln/div")
            node("Mul", [f"{p}/n", f"{p}/gamma"], [f"{p}/ng"], "ln/scale")
            node("Add", [f"{p}/ng", f"{p}/beta"], [f"{p}/ln"], "ln/shift")
            node("MatMul", [f"{p}/ln", f"{p}/w1"], [f"{p}/h0"], "fc1/matmul")
            node("Add", [f"{p}/h0", f"{p}/b1"], [f"{p}/h1"], "fc1/add")
            node("Relu", [f"{p}/h1"], [f"{p}/h"], "relu")
            node("MatMul", [f"{p}/h", f"{p}/w2"], [f"{p}/o0"], "fc2/matmul")
            node("Add", [f"{p}/o0", f"{p}/b2"], [f"{p}/o"], "fc2/add")
            node("Add", [x, f"{p}/o"], [f"{p}/y"], "residual")
            params = {
                "gamma": 1.0 + 0.1 * rng.standard_normal(hidden, dtype=np.float32),
                "beta": 0.1 * rng.standard_normal(hidden, dtype=np.float32),
                "w1": rng.standard_normal((hidden, ffn), dtype=np.float32) / np.sqrt(hidden),
                "b1": 0.02 * rng.standard_normal(ffn, dtype=np.float32),
                "w2": 0.5 * rng.standard_normal((ffn, hidden), dtype=np.float32) / np.sqrt(ffn),
                "b2": 0.02 * rng.standard_normal(hidden, dtype=np.float32),
            }
            for key, value in params.items():
                inits.append(_external(f"{p}/{key}", value.astype(np.float32), out, location))
            x = f"{p}/y"
    nodes.append(helper.make_node("Identity", [x], ["y"], name="output"))
    shape = [1, seq, hidden]
    graph = helper.make_graph(
        nodes, "bigmodel", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="precision-doctor benchmarks/bigmodel.py")
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def measured(cmd: list[str], log: Path, timeout_s: float) -> dict:
    """Run ``cmd``: wall time, peak RSS (MiB, ``ru_maxrss`` from ``os.wait4`` of exactly that
    process) and exit code."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    run = measure_process(cmd, env=env, timeout=timeout_s, log=log)
    return {"wall_s": round(run["wall_s"], 1), "peak_rss_mib": run["peak_rss_mb"],
            "exit": run["returncode"]}


LOAD_FIXED = """
import sys, numpy as np, onnxruntime as ort
s = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
x = np.random.default_rng(0).uniform(-1, 1, s.get_inputs()[0].shape).astype(np.float32)
y = s.run(None, {"x": x})[0]
print("ok", y.shape, y.dtype, bool(np.isfinite(y).all()))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=18)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-evals", type=int, default=40)
    ap.add_argument("--timeout", type=float, default=1800.0, help="per step, seconds")
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args(argv)

    folder = args.dir or Path(tempfile.mkdtemp(prefix="pd-bigmodel-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        model = build(folder, args.blocks, args.hidden, args.ffn, args.seq, args.seed)
        data_bytes = (folder / "model.onnx.data").stat().st_size
        print(f"generated {model} + model.onnx.data: {data_bytes / 2**30:.2f} GiB of weights, "
              f"{model.stat().st_size} bytes of graph, in {time.perf_counter() - t0:.1f} s")
        data = f"random:seed={args.seed},low=-1,high=1,count={args.samples}," \
               f"shape=x:1x{args.seq}x{args.hidden}"
        cli = [sys.executable, "-m", "precision_doctor"]
        results: dict = {"blocks": args.blocks, "weights_gib": round(data_bytes / 2**30, 3),
                         "samples": args.samples, "machine": machine()}
        diag = measured([*cli, "diagnose", str(model), "--data", data, "--target", "fp16",
                       "--json", str(folder / "diagnosis.json"), "-q"],
                      folder / "diagnose.log", args.timeout)
        report = json.loads((folder / "diagnosis.json").read_text()) \
            if (folder / "diagnosis.json").exists() else {}
        diag |= {"verdict": report.get("verdict"), "timings_s": report.get("timings_s"),
                 "layers": len((report.get("layerwise") or {}).get("records", [])),
                 "log_tail": (folder / "diagnose.log").read_text()[-400:]}
        results["diagnose"] = diag
        print("diagnose:", json.dumps(diag, indent=1))

        out = folder / "fixed" / "fixed.onnx"
        out.parent.mkdir(exist_ok=True)
        fix = measured([*cli, "fix", str(model), "-o", str(out), "--data", data, "--target",
                      "fp16", "--max-evals", str(args.max_evals), "-q"],
                     folder / "fix.log", args.timeout)
        fixed_report = out.with_name("fixed.report.json")
        rep = json.loads(fixed_report.read_text()) if fixed_report.exists() else {}
        files = {p.name: p.stat().st_size for p in sorted(out.parent.iterdir())}
        fix |= {"verdict": rep.get("verdict"), "seconds": rep.get("seconds"),
                "evaluations": (rep.get("search") or {}).get("evaluations"),
                "fp32_nodes": len((rep.get("plan") or {}).get("overrides", {})),
                "writer_ort_validated": (rep.get("writer") or {}).get("ort_validated"),
                "writer_warnings": (rep.get("writer") or {}).get("warnings"),
                "files": files, "log_tail": (folder / "fix.log").read_text()[-400:]}
        results["fix"] = fix
        print("fix:", json.dumps(fix, indent=1))

        load = measured([sys.executable, "-c", LOAD_FIXED, str(out)], folder / "load.log",
                      args.timeout)
        load["output"] = (folder / "load.log").read_text().strip()[-300:]
        results["load_fixed"] = load
        print("ONNX Runtime on the fixed model:", json.dumps(load))
        if args.json:
            write_results(args.json, results)
        ok = diag["exit"] in (0, 1) and fix["exit"] == 0 and load["exit"] == 0 \
            and "fixed.onnx.data" in files
        print("RESULT:", "diagnose and fix completed; fixed model written with external data "
              "and loaded in ONNX Runtime" if ok else "FAILED (see the logs above)")
        return 0 if ok else 1
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            print(f"kept {folder}")


if __name__ == "__main__":
    sys.exit(main())
