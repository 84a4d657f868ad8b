"""Emulator fidelity against real FP16/BF16/TF32 hardware (ONNX Runtime CUDA), and the
FP32-vs-FP32 mismatch of ONNX Runtime CUDA (TF32 on by default) against the CPU.

For every model: relative L2 error of the output vs ONNX Runtime CPU FP32, for
  * emulate   : precision-doctor's CPU emulation of the same precision plan,
  * emulate-f : the emulation of the rewritten model (BatchNorm folded, LayerNorm fused), i.e.
                what an engine that fuses those ops computes,
  * real      : ONNX Runtime CUDA running the strongly typed model written by precision-doctor
                (FP16/BF16), or the FP32 model with use_tf32=1 (TF32) / 0 (FP32),
plus the pass/fail verdict of each at the default tolerance and per-layer agreement.

GPU machine setup (see benchmarks/gpu_setup.sh): carry .gpu/c0..c4 in five back-to-back calls
(`bash benchmarks/gpu_setup.sh part N`, the last adds `install`), the assets (PP-OCRv4 models,
real images, MiniLM) under /tmp/assets, then:

    PYTHONPATH=/tmp/site:$PWD/src python benchmarks/gpu_fidelity.py --out $OUT

Without a GPU, ``--provider cpu`` runs the same script with ORT CPU as the "real" engine (a dry
run of the script, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import default_assets, load_cases  # noqa: E402

from precision_doctor.compare.metrics import relative_l2  # noqa: E402
from precision_doctor.compare.tolerance import default_tolerance  # noqa: E402
from precision_doctor.diagnosis.diagnose import diagnose  # noqa: E402
from precision_doctor.errors import PrecisionDoctorError  # noqa: E402
from precision_doctor.formats import Precision  # noqa: E402
from precision_doctor.layerwise.candidates import emulated, onnxruntime, run_samples  # noqa: E402,E501
from precision_doctor.layerwise.compare import compare_layerwise  # noqa: E402
from precision_doctor.precision.plan import PrecisionPlan  # noqa: E402
from precision_doctor.precision.rewrites import apply_rewrites  # noqa: E402
from precision_doctor.precision.writer import write_mixed_precision  # noqa: E402
from precision_doctor.runners.emulator import EmulatorRunner  # noqa: E402
from precision_doctor.runners.ort import OrtRunner  # noqa: E402


def run_all(runner, samples) -> dict[str, list[np.ndarray]]:
    """All outputs of ``runner`` on ``samples`` (the project's ``run_samples``)."""
    names = [o.name for o in runner.model.graph.output]
    return run_samples(runner, samples, names)


def err(ref, out) -> float:
    return max(relative_l2(ref[k], out[k]) for k in ref)


def effective_plan(model, precision):
    """Write the all-low model; the plan the writer really applied (params kept FP32)."""
    written, report = write_mixed_precision(model, PrecisionPlan(precision))
    return written, report.effective_plan()


def fidelity(case, provider: str) -> dict:
    gpu = [provider] if provider != "cpu" else ["cpu"]
    ref = run_all(OrtRunner(case.model), case.samples)
    row: dict = {"model": case.name, "samples": len(case.samples)}
    opts = (lambda tf32: [{"use_tf32": tf32}, {}]) if provider == "cuda" else (lambda tf32: None)
    prov = gpu + (["cpu"] if provider == "cuda" else [])
    row["fp32_real"] = err(ref, run_all(OrtRunner(case.model, prov, opts("0")), case.samples))
    row["tf32_emulate"] = err(ref, run_all(EmulatorRunner(case.model, PrecisionPlan(
        Precision.TF32)), case.samples))
    row["tf32_real"] = err(ref, run_all(OrtRunner(case.model, prov, opts("1")), case.samples))
    rewritten, _ = apply_rewrites(case.model)
    for p in (Precision.FP16, Precision.BF16):
        key = p.value
        try:
            written, plan = effective_plan(case.model, p)
            row[f"{key}_kept_fp32"] = plan.fp32_nodes()
            row[f"{key}_emulate"] = err(ref, run_all(EmulatorRunner(case.model, plan),
                                                     case.samples))
            _, fplan = effective_plan(rewritten, p)
            row[f"{key}_emulate_fused"] = err(ref, run_all(EmulatorRunner(rewritten, fplan),
                                                           case.samples))
            row[f"{key}_real"] = err(ref, run_all(OrtRunner(written, prov, opts("0")),
                                                  case.samples))
        except PrecisionDoctorError as exc:
            row[f"{key}_error"] = str(exc).splitlines()[0][:200]
    for p in ("fp16", "bf16", "tf32"):
        tol = default_tolerance(Precision(p)).rel_l2
        real, emu = row.get(f"{p}_real"), row.get(f"{p}_emulate")
        if real is None or emu is None:
            continue
        row[f"{p}_verdict_same"] = (real <= tol) == (emu <= tol)
        floor = max(row["fp32_real"], 1e-6)
        if real > 10 * floor and math.isfinite(real) and math.isfinite(emu):
            row[f"{p}_ratio"] = emu / real
    return row


def per_layer(case, provider: str) -> dict:
    """Per-tensor FP16 error: emulation vs real, on the first sample."""
    written, plan = effective_plan(case.model, Precision.FP16)
    prov = [provider, "cpu"] if provider == "cuda" else ["cpu"]
    opts = [{"use_tf32": "0"}, {}] if provider == "cuda" else None
    samples = [s.feeds for s in case.samples[:1]]
    ref_f = lambda m: OrtRunner(m)  # noqa: E731
    real = compare_layerwise(case.model, samples, ref_f,
                             onnxruntime(prov, opts, written).factory, Precision.FP16, 1e-2,
                             segments=False)  # the written FP16 model: marked outputs
    emu = compare_layerwise(case.model, samples, ref_f, emulated(plan).factory,
                            Precision.FP16, 1e-2)
    e = {r.tensor: r.rel_l2 for r in emu.records}
    pairs = [(e[r.tensor], r.rel_l2) for r in real.records if r.tensor in e
             and math.isfinite(r.rel_l2) and math.isfinite(e[r.tensor]) and r.rel_l2 > 1e-5]
    ratios = np.array([a / b for a, b in pairs]) if pairs else np.array([1.0])
    return {"model": case.name, "tensors": len(pairs),
            "median_ratio": float(np.median(ratios)),
            "within_2x": float(np.mean((ratios >= 0.5) & (ratios <= 2))),
            "first_divergence_real": real.first_divergence,
            "first_divergence_emulated": emu.first_divergence}


def fp32_mismatch(case, provider: str) -> list[dict]:
    """diagnose: ORT CPU FP32 vs the GPU engine in FP32, TF32 off and on."""
    rows = []
    for tf32 in ("0", "1"):
        prov = [provider, "cpu"] if provider == "cuda" else ["cpu"]
        opts = [{"use_tf32": tf32}, {}] if provider == "cuda" else None
        report = diagnose(case.model, case.samples, Precision.FP32,
                          onnxruntime(prov, opts, name=f"ort-{provider}-tf32={tf32}"),
                          measure_impact=False)
        rows.append({"model": case.name, "tf32": tf32, "verdict": report.verdict,
                     "rel_l2": report.outputs[0].metrics.rel_l2,
                     "first_divergence": report.layerwise.first_divergence,
                     "findings": [{"kind": f.kind, "node": f.node, "op": f.op_type,
                                   "cause": f.evidence.get("cause"), "summary": f.summary}
                                  for f in report.findings[:5]]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--assets", type=Path, default=default_assets())
    ap.add_argument("--models", default="det,rec,cls,minilm14,minilm17")
    ap.add_argument("--provider", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--skip-layers", action="store_true")
    args = ap.parse_args()
    if args.provider == "cuda":
        import onnxruntime

        onnxruntime.preload_dlls()
    t0 = time.time()
    cases = load_cases(args.assets, args.models.split(","))
    result = {"fidelity": [], "layers": [], "fp32_mismatch": []}
    for case in cases:
        row = fidelity(case, args.provider)
        result["fidelity"].append(row)
        print(json.dumps(row), flush=True)
        if not args.skip_layers:
            lay = per_layer(case, args.provider)
            result["layers"].append(lay)
            print(json.dumps(lay), flush=True)
    det = [c for c in cases if c.name == "det"]
    if det:
        result["fp32_mismatch"] = fp32_mismatch(det[0], args.provider)
        print(json.dumps(result["fp32_mismatch"], indent=1), flush=True)
    result["seconds"] = time.time() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fidelity.json").write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
