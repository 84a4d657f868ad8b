"""INT8/FP8 quantization: precision-doctor ``fix --target int8|fp8`` against two anchor tools,
ONNX Runtime ``quantize_static`` and NVIDIA ModelOpt ONNX PTQ, on the same models, the same
calibration samples and the same evaluation.

The protocol (models, samples, metrics): ``quant_anchors_protocol.py``; the tools and how each
is called: ``quant_anchors_runners.py``; the evaluation: ``quant_anchors_eval.py``; the table:
``quant_anchors_table.py``.

Each tool runs in a fresh subprocess (this script with ``--worker``); wall time, CPU time and
peak RSS of that process come from ``common.measure_process`` (interpreter start and imports
included), plus the tool's own in-process seconds.

Usage (repository root; ``../shared`` present)::

    python -m benchmarks run quant_anchors                       # cls, rec, det, minilm; int8, fp8
    python -m benchmarks run quant_anchors --models cls --formats int8 --tools pd,ort-minmax
    python -m benchmarks run quant_anchors --models yolo --merge  # add rows to today's file
    python -m benchmarks run quant_anchors --models det --merge --pd-commit HEAD  # pd from a
                                                    # git archive of a commit, not the tree

On a shared 2-core machine run one model at a time with ``--merge`` (cls, rec, det are the
cheap ones; MiniLM's search is the longest).

Prints a table and writes ``benchmarks/results/quant_anchors_<date>_<machine>.json`` (``--merge``:
rows of an existing file for other (model, format, tool) are kept). Output models and logs go
to ``--work`` (default: a temporary folder, kept with ``--keep``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent)]

from common import measure_process, results_path, write_results  # noqa: E402
from quant_anchors_eval import evaluate, references  # noqa: E402
from quant_anchors_protocol import DEFAULT_MODELS, MODELS, REPO, prepare  # noqa: E402
from quant_anchors_runners import EXTRA_TOOLS, ORT_FORMATS, TOOLS, worker  # noqa: E402
from quant_anchors_table import order, table  # noqa: E402

MODELOPT_PYTHON = REPO / ".venv-anchors" / "bin" / "python"


def source_version() -> str:
    """This checkout's commit, ``+dirty`` when ``src/`` has uncommitted changes (the code ``pd``
    ran is under active development)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                              capture_output=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "src"], cwd=REPO, text=True,
                               capture_output=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}{'+dirty' if dirty else ''}" if head else "unknown"


def export_source(commit: str, work: Path) -> tuple[Path, str]:
    """``src/`` at ``commit`` (``git archive``) under ``work``, for ``pd`` to run from: figures
    of a named commit, whatever the checkout holds uncommitted. Returns (its ``src``, the
    commit's short hash)."""
    short = subprocess.run(["git", "rev-parse", "--short", commit], cwd=REPO, text=True,
                           capture_output=True, timeout=30, check=True).stdout.strip()
    dest = work / f"src_{short}"
    if not (dest / "src").is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", short, "src"], cwd=REPO,
                                 capture_output=True, timeout=120, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True, timeout=120)
    return dest / "src", short


def launch(tool: str, fmt: str, spec: dict, work: Path, modelopt_python: Path,
           timeout: float, pd_source: tuple[Path, str] | None = None) -> dict:
    """Run one tool in a fresh process; its output model is ``work/<fmt>_<tool>.onnx``;
    ``pd`` runs from ``pd_source`` (``export_source``) when given, else this checkout."""
    dest = work / f"{fmt}_{tool}.onnx"
    info = dest.with_suffix(".json")
    log = dest.with_suffix(".log")
    for p in (dest, info):
        p.unlink(missing_ok=True)
    row = {"model": spec["name"], "format": fmt, "tool": tool,
           "ran_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if tool.startswith("pd"):
        row["source"] = source_version() if pd_source is None else pd_source[1]
    if tool.startswith("modelopt"):
        if not modelopt_python.is_file():
            return {**row, "error": f"ModelOpt environment missing: {modelopt_python} (see the "
                                    "module docstring)"}
        python, env = str(modelopt_python), dict(os.environ, PYTHONPATH="")
    else:
        src = REPO / "src" if pd_source is None or not tool.startswith("pd") else pd_source[0]
        python, env = sys.executable, dict(os.environ, PYTHONPATH=str(src))
    cmd = [python, str(Path(__file__).resolve()), "--worker", tool, "--format", fmt,
           "--spec", json.dumps(spec), "--dest", str(dest)]
    run = measure_process(cmd, env=env, timeout=timeout, log=log)
    row.update(wall_s=run["wall_s"], cpu_s=run["cpu_s"], peak_rss_mb=run["peak_rss_mb"],
               exit=run["returncode"], timed_out=run["timed_out"], log=str(log))
    if info.is_file():
        row.update(json.loads(info.read_text()))
    if tool.startswith("modelopt") and log.is_file():  # what its own rules left out, and why
        keys = ("unsupported", "exclud", "GEMV", "non-quantizable", "nodes to quantize",
                "quantized nodes", "Quantizable op types", "fp16", "ERROR")
        row["tool_notes"] = [line.split(" - ", 3)[-1].strip() for line in
                             log.read_text(errors="replace").splitlines()
                             if "[modelopt]" in line and any(k in line for k in keys)]
    if run["returncode"] != 0 or not dest.is_file():
        tail = log.read_text(errors="replace").strip().splitlines() if log.is_file() else []
        errors = [line for line in tail if "Error" in line or "error" in line]
        row["error"] = (errors[-1] if errors else (tail[-1] if tail else "no output")).strip()
        if run["timed_out"]:
            row["error"] = f"timed out after {timeout:g} s"
        row["log_tail"] = tail[-15:]
        return row
    row["output"] = str(dest)
    return row



def modelopt_info(python: Path) -> dict:
    if not python.is_file():
        return {"python": str(python), "installed": False}
    code = ("import importlib.metadata as m, json\nout = {}\n"
            "for p in ('nvidia-modelopt', 'onnx', 'onnxruntime-gpu', 'onnxruntime', 'torch', "
            "'onnx-graphsurgeon', 'cppimport', 'numpy'):\n"
            "    try: out[p] = m.version(p)\n    except Exception: pass\n"
            "try:\n    import modelopt.onnx.quantization\n    out['import'] = 'ok'\n"
            "except Exception as e:\n    out['import'] = f'{type(e).__name__}: {e}'\n"
            "print(json.dumps(out))")
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=""))
    try:
        return {"python": str(python), "installed": True,
                **json.loads(done.stdout.strip().splitlines()[-1])}
    except (IndexError, json.JSONDecodeError):
        return {"python": str(python), "installed": True, "error": done.stderr[-800:]}


def reevaluate(path: Path, work: Path | None, models: list[str]) -> None:
    """Evaluate again the output models that the rows of ``path`` name (tool runs kept)."""
    if work is None:
        sys.exit("--evaluate-only needs --work (the folder of the earlier run)")
    record = json.loads(path.read_text())
    rows = record["rows"]
    for name in models:
        spec = prepare(name, work / name)
        refs = references(spec)
        for row in rows:
            if row["model"] == name and Path(row.get("output", "")).is_file():
                row.update(evaluate(row["output"], spec, refs))
    record["rows"] = order(rows)
    payload = {k: v for k, v in record.items() if k not in ("date", "machine", "versions")}
    write_results(path, payload)
    print(table(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--formats", default="int8,fp8")
    parser.add_argument("--tools", default=",".join(TOOLS),
                        help=f"comma-separated, of {', '.join(TOOLS + EXTRA_TOOLS)}")
    parser.add_argument("--modelopt-python", type=Path, default=MODELOPT_PYTHON)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per tool run")
    parser.add_argument("--work", type=Path, help="folder for models and logs (default: temp)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary work folder")
    parser.add_argument("--merge", action="store_true",
                        help="keep the rows of today's results file for other runs")
    parser.add_argument("--suffix", default="", help="results file name suffix")
    parser.add_argument("--pd-commit", help="run pd from src/ at this commit (git archive), "
                                            "not from the checkout's working tree")
    parser.add_argument("--evaluate-only", action="store_true",
                        help="re-evaluate the output models of today's rows in --work (no tool "
                             "runs), e.g. after the evaluation changed")
    parser.add_argument("--table-only", action="store_true",
                        help="print the table of today's results file and exit")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--format", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--dest", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        out = worker(args.worker, args.format, json.loads(args.spec), args.dest)
        args.dest.with_suffix(".json").write_text(json.dumps(out, indent=1, default=str))
        return

    path = results_path("quant_anchors", suffix=args.suffix)
    if args.table_only:
        print(table(json.loads(path.read_text())["rows"]))
        return
    if args.evaluate_only:
        reevaluate(path, args.work, [m for m in args.models.split(",") if m])
        return
    work = args.work or Path(tempfile.mkdtemp(prefix="quant_anchors_"))
    rows: list[dict] = []
    record: dict = {}
    if args.merge and path.is_file():
        record = json.loads(path.read_text())
        rows = record.get("rows", [])
    tools = [t for t in args.tools.split(",") if t]
    formats = [f for f in args.formats.split(",") if f]
    failures = dict(record.get("model_failures", {}))
    anchors = modelopt_info(args.modelopt_python)
    pd_source = export_source(args.pd_commit, work) if args.pd_commit else None
    for name in [m for m in args.models.split(",") if m]:
        try:
            spec = prepare(name, work / name)
        except Exception as exc:  # noqa: BLE001 - a missing model is recorded, not fatal
            failures[name] = f"{type(exc).__name__}: {exc}"
            print(f"{name}: skipped: {failures[name]}", flush=True)
            continue
        failures.pop(name, None)
        refs = references(spec)
        for fmt in formats:
            for tool in tools:
                if fmt not in ORT_FORMATS.get(tool, (fmt,)):
                    continue
                row = launch(tool, fmt, spec, work / name, args.modelopt_python, args.timeout,
                             pd_source)
                if "output" in row:
                    row.update(evaluate(row["output"], spec, refs))
                row.update(samples=len(spec["samples"]),
                           calibration_samples=len(spec["calibration"]), objective=
                           f"{spec['metric'].split('/')[-1]} threshold {spec['threshold']}")
                rows = [r for r in rows if (r["model"], r["format"], r["tool"])
                        != (name, fmt, tool)] + [row]
                print(json.dumps({k: v for k, v in row.items()
                                  if k not in ("report", "log_tail", "rel_l2", "metric")}
                                 | {"metric_worst": (row.get("metric") or {}).get("worst")},
                                 default=str), flush=True)
                write_results(path, {
                    "command": " ".join(sys.argv), "work": str(work),
                    "modelopt": anchors,
                    "evaluation": "ONNX Runtime CPU, ORT_ENABLE_BASIC, every evaluation "
                                  "sample vs FP32 on the same options; unquantized = weighted "
                                  "nodes with no DequantizeLinear input; compute.mac_share = "
                                  "MACs of weighted nodes with both operands dequantized / "
                                  "MACs of every weighted node (quant_anchors_macs)",
                    "protocol": "calibration and evaluation samples disjoint (split per "
                                "model); every tool sees the calibration samples only (pd "
                                "calibrates and searches on them); models.<name>.split",
                    "models": {**record.get("models", {}), name: {
                        k: spec[k] for k in ("source", "metric", "threshold", "split")}},
                    "model_failures": failures, "rows": order(rows)})
                record = json.loads(path.read_text())
    print(table(rows))
    print(f"\nwrote {path}")
    if not args.keep and args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
