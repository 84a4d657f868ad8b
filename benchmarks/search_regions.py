"""Region-first search vs node-first search vs ModelOpt AutoCast on a range-bound real model.

Model: ``terrain_unet`` (``benchmarks/zoo_unet.py``, ``benchmarks/MODELS.md``): a trained
consistency-model diffusion UNet (2103 nodes, dynamo exporter: module paths in
``pkg.torch.onnx.name_scopes``), fed as its package's sampler feeds it at the first step: noise
x 80 and sigma 80 (samples ``difficulty*``; ``--samples`` picks others). In FP16 its residual
streams exceed 65504 before the GroupNorms that remove their scale.

Tools, each in a fresh subprocess (wall, CPU, peak RSS from ``common.measure_process``,
interpreter start and imports included), FP16 with FP32 graph inputs/outputs, the same samples:

* ``nodes``: ``precision_doctor.fix`` (default tolerance rel L2 <= 1e-2, budget 150) with
  ``repair.ranking.REGION_SEARCH = False``: the node search (grow + ddmin over nodes);
* ``regions``: the same call with the region-first search (``search.regions``), as shipped;
* ``autocast``: NVIDIA ModelOpt AutoCast ``convert_to_mixed_precision(low_precision_type=
  "fp16", keep_io_types=True, calibration_data=<folder of .npz>, providers=["cpu"])``, its
  defaults otherwise (``data_max`` 512, ``init_max`` 65504; no accuracy target), in its own
  virtual environment (``--modelopt-python``, default ``.venv-anchors/bin/python``, made by
  ``python3 -m venv .venv-anchors && .venv-anchors/bin/pip install "nvidia-modelopt[onnx]"``).

Each written model is then run here by ONNX Runtime CPU on every sample: worst output relative
L2 against FP32, compute nodes left FP32 (float32 outputs by ONNX type inference) and their
share of FLOPs (``search.cost``). ``fix``'s own figures (evaluations, kept nodes, the
``range_bound`` line with BF16's measured error) come from its report.

    python -m benchmarks run search_regions                       # all three, results saved
    python -m benchmarks run search_regions --tools nodes,regions --max-samples 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from common import ensure_src_on_path, measure_process, results_path, write_results  # noqa: E402

TOOLS = ("nodes", "regions", "autocast")


def _samples(folder: Path, pattern: str, limit: int | None) -> list[Path]:
    files = sorted((folder / "inputs").glob(pattern))
    return files[:limit] if limit else files


def worker(tool: str, args: argparse.Namespace) -> int:
    """Run one tool, write ``TOOL.onnx`` and ``TOOL.json`` into ``args.out``."""
    import numpy as np
    import onnx

    files = _samples(args.root / args.model, args.samples, args.max_samples)
    out = args.out / f"{tool}.onnx"
    if tool == "autocast":
        from modelopt.onnx.autocast import convert_to_mixed_precision

        fixed = convert_to_mixed_precision(
            onnx_path=str(args.root / args.model / "model.onnx"), low_precision_type="fp16",
            keep_io_types=True, calibration_data=str(args.out / "calib"), providers=["cpu"])
        onnx.save(fixed, str(out))
        info: dict = {"evaluations": 1, "note": "magnitude rules on the calibration data"}
    else:
        import precision_doctor as pd
        from precision_doctor.repair import ranking

        ranking.REGION_SEARCH = tool == "regions"
        feeds = [dict(np.load(f)) for f in files]
        fixed = pd.fix(str(args.root / args.model / "model.onnx"), feeds, target="fp16",
                       quiet=True, max_evals=args.max_evals)
        onnx.save(fixed.model, str(out))
        report = dict(fixed.report)
        info = {"evaluations": report["resources"]["evaluations"],
                "fix_wall_s": report["resources"]["wall_s"],
                "kept": len(report["search"]["kept"]),
                "fp32_share": report["fp32_share"], "regions": report["search"].get("regions"),
                "range_bound": report.get("range_bound"), "warnings": report["warnings"],
                "verdict": report["verdict"], "seconds": report["seconds"]}
    (args.out / f"{tool}.json").write_text(json.dumps(info, indent=1, default=str))
    return 0


def measure(path: Path, files: list[Path], reference: dict) -> dict:
    """ONNX Runtime CPU on every sample: worst rel L2, FP32 compute nodes, FLOP share."""
    import numpy as np
    import onnx

    from precision_doctor.compare.metrics import compute_metrics
    from precision_doctor.runners.ort import OrtRunner
    from precision_doctor.search.cost import fp32_share, node_costs

    sys.path.insert(0, str(REPO / "benchmarks"))
    from search import fp32_compute_nodes

    from precision_doctor.errors import BackendError

    model = onnx.load(str(path))
    fp32 = fp32_compute_nodes(model)  # counted first: a model that fails to run has them too
    shapes = {k: v.shape for k, v in np.load(files[0]).items()}
    share = fp32_share(model, fp32, node_costs(model, shapes))
    row = {"fp32_nodes": len(fp32), "compute_nodes": int(share["compute_nodes"]),
           "fp32_flops": share["flops"]}
    names = list(reference)
    outs: dict[str, list] = {n: [] for n in names}
    try:
        with OrtRunner(model, name=path.stem) as runner:
            for f in files:
                res = runner.run(dict(np.load(f)))
                for n in names:
                    outs[n].append(np.asarray(res[n], np.float32))
    except BackendError as exc:  # a written model ONNX Runtime cannot run
        return {**row, "error": f"its written model fails on ONNX Runtime CPU: {exc}"}
    return {**row, "rel_l2": max(compute_metrics(reference[n], outs[n]).rel_l2 for n in names)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="terrain_unet")
    parser.add_argument("--root", type=Path, default=REPO / ".models" / "zoo")
    parser.add_argument("--samples", default="difficulty*.npz", help="glob under inputs/")
    parser.add_argument("--max-samples", type=int, default=None)
    parser.add_argument("--max-evals", type=int, default=150)
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--modelopt-python", type=Path,
                        default=REPO / ".venv-anchors" / "bin" / "python")
    parser.add_argument("--modelopt-path", default="",
                        help="PYTHONPATH for the AutoCast worker (a folder holding modelopt "
                             "and its pure-Python dependencies, for a machine without its venv)")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--worker", default=None)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="search_regions_"))
    if args.worker:
        return worker(args.worker, args)
    ensure_src_on_path()
    import numpy as np

    from precision_doctor.layerwise.candidates import reference_factory

    print("command: python -m benchmarks run search_regions " + " ".join(sys.argv[1:]),
          flush=True)
    files = _samples(args.root / args.model, args.samples, args.max_samples)
    if not files:
        print(f"no samples {args.samples} under {args.root / args.model}: run "
              "benchmarks/zoo_unet.py first")
        return 2
    (args.out / "calib").mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(files):  # AutoCast's multi-batch calibration folder
        np.savez(args.out / "calib" / f"{i:03d}.npz", **dict(np.load(f)))
    import onnx

    model = onnx.load(str(args.root / args.model / "model.onnx"))
    names = [o.name for o in model.graph.output]
    reference: dict[str, list] = {n: [] for n in names}
    with reference_factory(model) as runner:
        for f in files:
            res = runner.run(dict(np.load(f)))
            for n in names:
                reference[n].append(np.asarray(res[n], np.float32))
    rows = []
    for tool in args.tools.split(","):
        python = args.modelopt_python if tool == "autocast" else Path(sys.executable)
        cmd = [str(python), str(Path(__file__).resolve()), "--worker", tool, "--model",
               args.model, "--root", str(args.root), "--samples", args.samples,
               "--max-evals", str(args.max_evals), "--out", str(args.out)]
        if args.max_samples:
            cmd += ["--max-samples", str(args.max_samples)]
        env = dict(os.environ, PYTHONPATH=args.modelopt_path if tool == "autocast"
                   else str(REPO / "src"))
        if tool == "autocast" and not python.exists():
            rows.append({"tool": tool, "error": f"{python} missing: create it as the module "
                                                "docstring says"})
            print(json.dumps(rows[-1]), flush=True)
            continue
        print(f"running {tool} ...", flush=True)
        run = measure_process(cmd, env=env, timeout=args.timeout, log=args.out / f"{tool}.log")
        row = {"tool": tool, **run}
        info = args.out / f"{tool}.json"
        if run["returncode"] == 0 and info.exists():
            row.update(json.loads(info.read_text()))
            row.update(measure(args.out / f"{tool}.onnx", files, reference))
        else:
            log = (args.out / f"{tool}.log").read_text(errors="replace").splitlines()
            row["error"] = "\n".join(log[-15:])
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("regions", "seconds")},
                         default=str), flush=True)
        if not args.no_save:  # after each tool: a run cut short keeps the rows it finished
            saved = write_results(results_path("search_regions"),
                                  {"command": sys.argv, "model": args.model,
                                   "samples": [f.name for f in files], "rows": rows})
    print(f"\n{args.model}: FP16, keep_io_types, {len(files)} samples ({args.samples})")
    print("tool | evals | wall s | CPU s | peak RSS MB | FP32 nodes | FP32 FLOPs | rel L2 (ORT)")
    for r in rows:
        if "fp32_nodes" not in r:
            print(f"{r['tool']} | failed: {r.get('error', '')[-300:]}")
            continue
        error = f"{r['rel_l2']:.3g}" if "rel_l2" in r else "fails to run: " + r["error"][-120:]
        print(f"{r['tool']} | {r.get('evaluations', '-')} | {r['wall_s']} | {r['cpu_s']} | "
              f"{r['peak_rss_mb']} | {r['fp32_nodes']}/{r['compute_nodes']} | "
              f"{r['fp32_flops']:.1%} | {error}")
        if r.get("range_bound"):
            print(f"    {r['range_bound']['message']}")
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on "
          f"{os.cpu_count()} cores")
    if not args.no_save:
        print(f"results: {saved.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
