"""Probe: where FP16 breaks the terrain diffusion UNet (sigma 80) and what keeping only its
overflow regions in FP32 gives: naive FP16/BF16 error, the layerwise peak, the overflow regions,
and the emulated score of the start plan plus those regions."""
import json
import sys
import time
from pathlib import Path

from precision_doctor.compare.metrics import compute_metrics
from precision_doctor.compare.tolerance import default_tolerance
from precision_doctor.formats import Precision
from precision_doctor.graph import input_metadata, load_model
from precision_doctor.inputs import load_samples
from precision_doctor.layerwise.candidates import run_samples
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.repair import stages
from precision_doctor.repair.ranking import rank
from precision_doctor.runners.emulator import EmulatorRunner
from precision_doctor.search.objective import Objective

root = Path(sys.argv[1] if len(sys.argv) > 1 else ".models/zoo/terrain_unet")
n = int(sys.argv[2]) if len(sys.argv) > 2 else 3
model = load_model(root / "model.onnx")
samples = load_samples(root / "inputs", input_metadata(model), max_samples=n)
samples = [s for s in samples if s.name.startswith("difficulty")][:n]
objective = Objective(tolerances={"*": default_tolerance(Precision.FP16)})
req = stages.FixRequest(model, samples, Precision.FP16, objective)
t = time.time()
base = stages.measure_baseline(req)
rw = stages.rewrite(req, base)
start = stages.plan_start(req, rw)
out = {"naive_fp16": base.score_before.value}
names = req.output_names


def err(plan, m=rw.model):
    o = run_samples(EmulatorRunner(m, plan), samples, names)
    return max(compute_metrics(base.reference[k], o[k]).rel_l2 for k in names), o


out["bf16_rewritten"] = err(PrecisionPlan(Precision.BF16))[0]
out["start_plan"], so = err(start.plan)
out["start_fp32_nodes"] = len(start.plan.fp32_nodes())
out["applied_rewrites"] = [r.rule for r in rw.report.records if r.applied]
out["rewrite_reasons"] = sorted({f"{r.rule}: {r.reason}"[:160] for r in rw.report.records
                                 if not r.applied})[:12]
score = base.objective.score(base.reference, so)
r = rank(rw.model, samples, base.objective, Precision.FP16, None, start.plan, start.hazards,
         start.candidates, names, score)
out["peak"] = r.peak
out["overflow_nodes"] = r.overflow_nodes
out["regions"] = [(x.name, len(x.nodes)) for x in r.regions]
out["candidates"] = len(start.candidates)
plan = start.plan.keep_fp32(list(r.overflow), "search")
out["start_plus_overflow"] = err(plan)[0]
ranked = list(r.nodes)
for k in (50, 100, 200, 400, 800):
    out[f"top{k}"] = err(start.plan.keep_fp32(ranked[:k], "search"))[0]
out["seconds"] = time.time() - t
print(json.dumps(out, indent=1, default=str))
