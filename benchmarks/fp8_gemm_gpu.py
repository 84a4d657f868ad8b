"""The FP8 Q/DQ emulation vs real H100 FP8 GEMMs (``torch._scaled_mm``), per MiniLM layer.

The emulation of one quantized GEMM layer (a MatMul whose weight ``W[K, N]`` is an initializer,
activation ``X[..., K]``), as ``precision_doctor.quant`` computes it: ``X`` quantized per tensor
(``scale_x = amax_x / 448``, ``amax_x`` = max ``|X|`` over the calibration rows), ``W`` per output
channel (``scale_w[n] = max_k |W[k, n]| / 448``), both to E4M3FN with round-to-nearest-even and
saturation (``qformats.fake_quant``: bit-identical to ONNX QuantizeLinear/DequantizeLinear),
dequantized, multiplied in FP32 (numpy), the output rounded to FP16 (the engine's float
precision between Q/DQ pairs).

Per layer, on the same rows (the real tokens, padding dropped, of MiniLM's 8 real sentences:
180 rows), this measures the rel L2 ``||y - a|| / ||a||`` (float64) against

- ``a``: the exact ``X @ W`` in float64 (FP32 ``X`` and ``W``);

of

- ``b`` (``emul``): the emulation above;
- ``c`` (``real``): the real FP8 GEMM on the GPU: ``X`` and ``W`` cast with
  ``x.div(scale).clamp(-448, 448).to(torch.float8_e4m3fn)``, then
  ``torch._scaled_mm(A [M, K] row-major, B [K, N] column-major, scale_a=[M, 1] float32 all
  scale_x, scale_b=[1, N] float32 scale_w, out_dtype=float16)`` (rowwise scaling: cuBLASLt's
  FP8 kernel, products of FP8 values exact, accumulated in FP32 with the default
  ``use_fast_accum=False``, scaled and rounded to FP16 in its epilogue). Variants, each recorded
  with its error if the installed torch refuses it: the same with ``use_fast_accum=True``
  (``real_fast``: Hopper's FP8 tensor-core accumulator without periodic promotion to FP32);
  per-tensor scales ``scale_a = scale_x, scale_b = 1`` with an FP32 output, then ``* scale_w``
  and rounded to FP16 (``real_epi32``: the rowwise epilogue done by hand); and, like for like,
  per-tensor weight scales in both the emulation and ``_scaled_mm`` (``emul_pt``, ``real_pt``);
- ``q64``: the FP8 values' exact product in float64, ``(Xq @ Wq) * scale_x * scale_w``, which
  splits each result's error into the FP8 rounding of the inputs (shared by ``b`` and ``c``)
  and what each adds (accumulation, FP16 output).

It reports per layer the rel L2 of ``b`` and ``c`` vs ``a``, their ratio ``c / b`` (the
acceptance item: within 1.5x, or explained), the rel L2 between ``b`` and ``c``, the share of
FP16 outputs that are bit-identical and the largest difference in FP16 ulps; and the bit
mismatches between torch's FP8 cast on the GPU and ``qformats.quantize`` (ml_dtypes) on ``X``
and ``W``, and between ``qformats.quantize`` on the GPU machine and on the machine that
prepared the payload (sha256 of the bits).

Two steps. Here (CPU; after ``export_minilm.py``)::

    python3 benchmarks/fp8_gemm_gpu.py prepare .gpu/fp8gemm

runs the FP32 model with ONNX Runtime CPU on ``.models/minilm_inputs.npz`` with every weight
MatMul's input marked as a graph output, and writes ``.gpu/fp8gemm/minilm_fp8_layers.npz``
(compressed, 47.9 MiB: the 36 layers' ``W`` and the 24 distinct inputs ``X`` on the 180 real-token
rows, float32; the local emulation's rel L2 and FP8 bit hashes for the cross-check). ``.gpu/``
is git-ignored, so carry it. On the lent GPU machine (its image has torch, numpy, onnx and
ml_dtypes, which is all this needs; no onnxruntime, no network), one ``run`` call::

    run carry=[".gpu/fp8gemm"] command="PYTHONPATH=src python3 benchmarks/fp8_gemm_gpu.py \\
        run .gpu/fp8gemm --out $OUT"

(the tracked ``src`` travels with the working tree: the emulation on the GPU machine is this
checkout's ``qformats``). Locally the run step also works with ``--device cpu`` where the
installed torch has a CPU ``_scaled_mm`` (a check of the script, not of the hardware).

Then, here again (CPU, ~4 min on 2 cores), the explanation of what differs::

    python3 benchmarks/fp8_gemm_gpu.py accmodel .gpu/fp8gemm \
        --results benchmarks/results/fp8_gemm_gpu_<date>_h100.json

puts the GPU's deviation from the exact FP8 product (``rel_real*_vs_q64``) beside models of the
tensor-core accumulator (``fp8_gemm_cpu._accumulate``: per K chunk, the products aligned to
the largest exponent and truncated to a number of fraction bits; promoted to FP32 per chunk or
not) and writes ``benchmarks/results/fp8_gemm_gpu_accmodel_<date>_<cpu>.json``.

Measured (H100 80GB HBM3, torch 2.11.0+cu130, CUDA 13.0, cuBLASLt 130100, 2026-11-28): the
ratio ``rel(real) / rel(emul)`` is 0.986 to 1.0003 over the 36 layers (median 1.00002); the
FP8 casts agree bit for bit (0 mismatches in 3.7 M activation and 10.6 M weight values). ``b``
and ``c`` differ by ~2.5e-4 rel L2 (at most 7.1e-4), 100x below the FP8 quantization error:
the FP16 rounding of outputs that the accumulator moved. ``use_fast_accum=True`` deviates from
the exact FP8 product exactly as a 13-bit aligned, truncating accumulator over 32-deep K steps
without promotion predicts (within a few % on every layer, up to 2.9e-3 at K=1536).

Results: ``benchmarks/results/fp8_gemm_gpu_<date>_<gpu>.json`` (``common.write_results``:
date, machine, versions first; ``--out DIR`` names the file with ``common.results_path``).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fp8_gemm_cpu import (  # noqa: E402
    PAYLOAD,
    REPO,
    _emulate,
    _rel,
    _sha,
    accmodel,
    prepare,
)

E4M3_MAX = 448.0
RATIO_LIMIT = 1.5


def _ulp_ordered(y: np.ndarray) -> np.ndarray:
    """FP16 bit patterns as integers ordered like the values (difference = ulps apart)."""
    bits = np.asarray(y, dtype=np.float16).view(np.int16).astype(np.int32)
    return np.where(bits < 0, -(bits & 0x7FFF), bits)


def _compare(b: np.ndarray, c: np.ndarray) -> dict[str, float]:
    d = np.abs(_ulp_ordered(b) - _ulp_ordered(c))
    return {"rel_b_c": _rel(c, b.astype(np.float64)) if np.any(b) else float("nan"),
            "share_identical": float(np.mean(d == 0)), "max_ulp": int(d.max()),
            "share_over_1ulp": float(np.mean(d > 1))}


def run(payload: Path, device: str = "cuda") -> dict[str, object]:
    """Measure every layer of the payload (see the module docstring)."""
    import torch

    sys.path.insert(0, str(REPO / "src"))
    data = np.load(payload / PAYLOAD)
    meta = json.loads(str(data["meta"]))
    dev = torch.device(device)
    f8 = torch.float8_e4m3fn
    env: dict[str, object] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                              "device": device}
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        env.update(gpu=props.name, capability=f"{props.major}.{props.minor}")
    torch.backends.cuda.matmul.allow_tf32 = False

    def cast(t: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return t.div(scale).clamp(-E4M3_MAX, E4M3_MAX).to(f8)

    def scaled_mm(a8, b8, sa, sb, out_dtype, fast=False):
        return torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, out_dtype=out_dtype,
                                use_fast_accum=fast)

    rows, errors = [], {}
    start = time.perf_counter()
    for layer in meta["layers"]:
        x, w = data[layer["x"]], data[layer["w"]]
        m, k = x.shape
        n = w.shape[1]
        mp = -(-m // 16) * 16  # FP8 GEMMs want dims divisible by 16: zero rows, dropped after
        exact = x.astype(np.float64) @ w.astype(np.float64)
        em = _emulate(x, w)
        em_pt = _emulate(x, w, per_channel=False)
        q64 = ((em["qx"].view(_fp8_np()).astype(np.float64)
                @ em["qw"].view(_fp8_np()).astype(np.float64))
               * np.float64(em["sx"]) * em["sw"].astype(np.float64)[None, :])

        xt = torch.zeros((mp, k), dtype=torch.float32, device=dev)
        xt[:m] = torch.from_numpy(x).to(dev)
        wt = torch.from_numpy(w).to(dev)
        sx = torch.tensor(float(em["sx"]), dtype=torch.float32, device=dev)
        sw = torch.from_numpy(em["sw"]).to(dev)
        sw_pt = torch.tensor(float(em_pt["sw"]), dtype=torch.float32, device=dev)
        one = torch.ones((), dtype=torch.float32, device=dev)
        a8 = cast(xt, sx)
        b8 = cast(wt, sw[None, :]).t().contiguous().t()  # [K, N] column-major
        b8_pt = cast(wt, sw_pt).t().contiguous().t()
        qx_t = a8[:m].view(torch.uint8).cpu().numpy()
        qw_t = b8.contiguous().view(torch.uint8).cpu().numpy()
        qw_pt_t = b8_pt.contiguous().view(torch.uint8).cpu().numpy()
        row = {"layer": layer["name"], "node": layer["node"], "M": m, "K": k, "N": n,
               "scale_x": float(em["sx"]),
               "scale_w_min": float(em["sw"].min()), "scale_w_max": float(em["sw"].max()),
               "cast_mismatch_x": int(np.count_nonzero(qx_t != em["qx"])),
               "cast_mismatch_w": int(np.count_nonzero(qw_t != em["qw"])),
               "cast_mismatch_w_pt": int(np.count_nonzero(qw_pt_t != em_pt["qw"])),
               "qformats_bits_same_as_local": (_sha(em["qx"]) == layer["local_qx_sha"]
                                               and _sha(em["qw"]) == layer["local_qw_sha"]),
               "rel_emul": _rel(em["y"], exact), "rel_emul_local": layer["local_emul_rel"],
               "rel_emul_pt": _rel(em_pt["y"], exact), "rel_q64": _rel(q64, exact),
               "rel_emul_vs_q64": _rel(em["y"], q64)}
        for key in ("real", "real_fast", "real_epi32", "real_pt"):
            try:
                if key == "real_epi32":  # the rowwise epilogue by hand, from an FP32 output
                    y = scaled_mm(a8, b8, sx, one, torch.float32) * sw[None, :]
                elif key == "real_pt":  # per-tensor weight scale, like emul_pt
                    y = scaled_mm(a8, b8_pt, sx, sw_pt, torch.float16)
                else:  # rowwise: scale_a [M, 1], scale_b [1, N]
                    y = scaled_mm(a8, b8, sx.expand(mp, 1).contiguous(), sw[None, :],
                                  torch.float16, fast=key == "real_fast")
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                y = y[:m].float().cpu().numpy().astype(np.float16)
            except Exception as exc:  # noqa: BLE001 - recorded: which variants torch refuses
                errors.setdefault(key, f"{type(exc).__name__}: {exc}"[:400])
                continue
            base = em_pt["y"] if key == "real_pt" else em["y"]
            row[f"rel_{key}"] = _rel(y, exact)
            row[f"rel_{key}_vs_q64"] = _rel(y, q64) if key != "real_pt" else None
            row[f"ratio_{key}"] = row[f"rel_{key}"] / row["rel_emul_pt" if key == "real_pt"
                                                         else "rel_emul"]
            for name, value in _compare(base, y).items():
                row[f"{name}_{key}"] = value
        rows.append(row)
    elapsed = time.perf_counter() - start
    env["cublaslt"] = _cublaslt_version()
    return {"env": env, "payload": {k: meta[k] for k in ("model", "samples", "rows",
                                                         "prepared_with")},
            "ratio_limit": RATIO_LIMIT, "errors": errors, "layers": rows,
            "summary": summarize(rows), "elapsed_s": round(elapsed, 2)}


def _cublaslt_version() -> int | None:
    """``cublasLtGetVersion()`` of the cuBLASLt this process loaded (None where none is)."""
    import ctypes

    try:
        maps = Path("/proc/self/maps").read_text().split()
        lib = next(p for p in maps if "libcublasLt.so" in p)
        return int(ctypes.CDLL(lib).cublasLtGetVersion())
    except (OSError, StopIteration, AttributeError):
        return None


def _fp8_np():
    import ml_dtypes

    return ml_dtypes.float8_e4m3fn


def summarize(rows: list[dict]) -> dict[str, object]:
    """Ratio statistics over layers for each real variant, and the layers beyond the limit."""
    out: dict[str, object] = {}
    for key in ("real", "real_fast", "real_epi32", "real_pt"):
        ratios = [r[f"ratio_{key}"] for r in rows if f"ratio_{key}" in r]
        if not ratios:
            continue
        out[key] = {
            "layers": len(ratios), "ratio_max": max(ratios), "ratio_median":
            float(np.median(ratios)), "ratio_min": min(ratios),
            "beyond_limit": [r["layer"] for r in rows
                             if not 1 / RATIO_LIMIT <= r.get(f"ratio_{key}", 1) <= RATIO_LIMIT],
            "rel_b_c_max": max(r[f"rel_b_c_{key}"] for r in rows if f"rel_b_c_{key}" in r),
            "share_identical_min": min(r[f"share_identical_{key}"] for r in rows
                                       if f"share_identical_{key}" in r),
            "max_ulp": max(r[f"max_ulp_{key}"] for r in rows if f"max_ulp_{key}" in r)}
    out["cast_mismatch_x"] = sum(r["cast_mismatch_x"] for r in rows)
    out["cast_mismatch_w"] = sum(r["cast_mismatch_w"] for r in rows)
    out["cast_mismatch_w_pt"] = sum(r["cast_mismatch_w_pt"] for r in rows)
    out["cast_elements_x"] = sum(r["M"] * r["K"] for r in rows)
    out["cast_elements_w"] = sum(r["K"] * r["N"] for r in rows)
    out["qformats_bits_same_as_local"] = all(r["qformats_bits_same_as_local"] for r in rows)
    return out


def print_table(result: dict) -> None:
    print(json.dumps(result["env"]))
    if result["errors"]:
        print("refused:", json.dumps(result["errors"], indent=1))
    head = (f"{'layer':<12} {'M':>4} {'K':>5} {'N':>5} {'rel_emul':>9} {'rel_real':>9} "
            f"{'ratio':>6} {'rel_b_c':>9} {'ident':>6} {'ulp':>4} {'fast':>6} {'pt':>6} "
            f"{'misX':>4} {'misW':>4}")
    print(head)
    def cell(r: dict, key: str, fmt: str = ".4g") -> str:
        v = r.get(key)
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    for r in result["layers"]:
        g = functools.partial(cell, r)
        print(f"{r['layer']:<12} {r['M']:>4} {r['K']:>5} {r['N']:>5} {g('rel_emul'):>9} "
              f"{g('rel_real'):>9} {g('ratio_real', '.4f'):>6} {g('rel_b_c_real'):>9} "
              f"{g('share_identical_real', '.3f'):>6} {g('max_ulp_real', 'd'):>4} "
              f"{g('ratio_real_fast', '.4f'):>6} {g('ratio_real_pt', '.4f'):>6} "
              f"{r['cast_mismatch_x']:>4} {r['cast_mismatch_w']:>4}")
    print(json.dumps(result["summary"], indent=1))
    print(f"elapsed {result['elapsed_s']} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("step", choices=("prepare", "run", "accmodel"))
    parser.add_argument("payload", type=Path, help="the folder prepare writes and run reads")
    parser.add_argument("--out", type=Path,
                        help="results folder (file named by common.results_path) or .json file")
    parser.add_argument("--device", default="cuda", help="torch device for run (default cuda)")
    parser.add_argument("--results", type=Path, help="accmodel: the GPU run's results file")
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.payload)
        return
    if args.step == "accmodel":
        sys.path.insert(0, str(REPO / "benchmarks"))
        from common import results_path, write_results

        result = accmodel(args.payload, args.results)
        out = args.out if args.out and args.out.suffix == ".json" else results_path(
            "fp8_gemm_gpu_accmodel", args.out or REPO / "benchmarks" / "results")
        print("wrote", write_results(out, result))
        return
    result = run(args.payload, args.device)
    print_table(result)
    if args.out:
        sys.path.insert(0, str(REPO / "benchmarks"))
        from common import results_path, write_results

        out = args.out if args.out.suffix == ".json" else results_path("fp8_gemm_gpu", args.out)
        print("wrote", write_results(out, result))


if __name__ == "__main__":
    main()
