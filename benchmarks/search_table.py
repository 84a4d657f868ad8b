"""The table of ``benchmarks/search.py``: one line per tool (evaluations, wall and CPU time, peak
RSS, nodes and FLOPs left FP32, error, task metric), and each precision-doctor row's wall-time
and peak-RSS ratios against the other tools with the load average at the end."""

from __future__ import annotations

import os


def print_table(model: str, spec: dict, n: int, rows: list[dict]) -> None:
    target = (f"{spec['metric'].split(':')[0]} >= {spec['threshold']} on every one of {n} "
              "samples" if spec["metric"] else f"rel_l2 <= {spec['rel_l2']:g} over {n} samples")
    print(f"\n{model}: FP16, keep_io_types, target {target} (ORT CPU)")
    head = ("tool", "evals", "wall s", "CPU s", "peak RSS MB", "FP32 nodes", "FP32 FLOPs", "rel L2",
            "worst metric", "target met", "OCR identical")
    print(" | ".join(head))
    for r in rows:
        if "fp32_nodes" not in r:
            why = (f"did not finish in {r['wall_s'] / 60:.0f} min" if r["timed_out"]
                   else f"failed (exit {r['exit']}, see {r['tool']}.log)")
            print(f"{r['tool']} | - | {r['wall_s']} | {r['cpu_s']} | {r['peak_rss_mb']} | {why}")
            continue
        print(" | ".join(str(x) for x in (
            r["tool"], r.get("evaluations", "-"), r["wall_s"], r["cpu_s"], r["peak_rss_mb"],
            f"{r['fp32_nodes']}/{r['compute_nodes']} ({r['fp32_nodes'] / r['compute_nodes']:.1%})",
            f"{r['fp32_flops']:.1%}", f"{r['rel_l2']:.3g}", f"{r['metric_min']:.4f}",
            r["met_on_all"], r.get("ocr_identical", "-"))))
        for f in r.get("flips", []):
            print(f"    flip: {f}")
    print_ratios(rows)


def print_ratios(rows: list[dict]) -> None:
    """Wall-time and peak-RSS ratios of each precision-doctor row against the other tools,
    plus the load average, so a re-run on an idle machine can be compared line by line."""
    ours = [r for r in rows if r["tool"].startswith("precision-doctor")]
    others = [r for r in rows if not r["tool"].startswith("precision-doctor")]
    for a in ours:
        res = a.get("resources") or {}
        if res:
            print(f"{a['tool']}: self-reported {res.get('evaluations')} evaluations, "
                  f"{res.get('samples_run')} sample runs, {res.get('wall_s')} s in fix(), "
                  f"peak RSS {res.get('peak_rss_mb')} MiB, jobs {res.get('jobs')}")
        for b in others:
            if a["exit"] == 0 and b["exit"] == 0 and b["wall_s"]:
                print(f"ratio {a['tool']} / {b['tool']}: wall {a['wall_s'] / b['wall_s']:.2f}x, "
                      f"CPU {a['cpu_s'] / max(b['cpu_s'], 0.1):.2f}x, "
                      f"peak RSS {a['peak_rss_mb'] / max(b['peak_rss_mb'], 1):.2f}x")
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    if load:
        print(f"load average (1/5/15 min) at the end: {load[0]:.1f} / {load[1]:.1f} / "
              f"{load[2]:.1f} on {os.cpu_count()} cores (> cores: timings are contended)")
