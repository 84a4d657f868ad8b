"""The table of ``quant_anchors``: rows in a fixed order, what each tool decided in a few
words, and the printed table."""

from __future__ import annotations

from quant_anchors_protocol import MODELS
from quant_anchors_runners import EXTRA_TOOLS, TOOLS


def note(row: dict) -> str:
    """What the tool decided or ran into, in a few words."""
    report = row.get("report") or {}
    parts = []
    if row["tool"].startswith("pd") and report:
        parts.append(f"calib {report.get('calibrator')}")
        if report.get("smoothquant"):
            parts.append(f"SQ a={report['smoothquant'].get('alpha')}")
        parts.append(f"{report.get('evaluations')} evals")
        if report.get("float_fp32"):
            parts.append(f"{len(report['float_fp32'])} float nodes FP32")
        if not report.get("passed", True):
            parts.append("target not met")
    if report.get("workaround"):
        parts.append("Softmax excluded (ORT bug)")
    for line in row.get("tool_notes", []):
        if line.startswith("Found") and "unsupported" in line:
            parts.append(line.removeprefix("Found ").replace(" for quantization", ""))
    if row.get("bad_scales"):
        parts.append(f"{row['bad_scales']} NaN/0 scales")
    return "; ".join(parts)


def order(rows: list[dict]) -> list[dict]:
    """Rows by model, format and tool, in the order of ``MODELS`` and ``TOOLS``."""
    tools = [*TOOLS, *EXTRA_TOOLS]
    return sorted(rows, key=lambda r: (
        list(MODELS).index(r["model"]) if r["model"] in MODELS else len(MODELS),
        ("int8", "fp8").index(r["format"]) if r["format"] in ("int8", "fp8") else 2,
        tools.index(r["tool"]) if r["tool"] in tools else len(tools)))


def table(rows: list[dict]) -> str:
    head = ("model", "fmt", "tool", "metric worst", "met", "calib met", "max rel L2",
            "raw BASIC", "unquant", "MAC q", "wall s", "tool s", "note",
            "unquantized layers / error")
    # "met": evaluation samples meeting the threshold / evaluation samples (every metric here
    # is higher-is-better); "calib met": the same on the calibration samples the tools saw;
    # "MAC q": share of the weighted nodes' MACs with both operands dequantized
    lines = []
    for r in order(rows):
        m = r.get("metric") or {}
        what = r.get("error") or r.get("eval_error") or ", ".join(r.get("unquantized_layers",
                                                                        [])[:6])
        if len(r.get("unquantized_layers", [])) > 6:
            what += ", ..."
        lines.append((r["model"], r["format"], r["tool"],
                      f"{m['worst']:.4f}" if m else "-",
                      (f"{sum(v >= m['threshold'] for v in m['per_sample'])}/"
                       f"{len(m['per_sample'])}") if m else "-",
                      (f"{r['calibration_set']['met']}/{r['calibration_set']['samples']}"
                       if "calibration_set" in r else "-"),
                      f"{r['max_rel_l2']:.3g}" if "max_rel_l2" in r else "-",
                      (f"{r['raw_basic']['max_rel_l2']:.3g}/{r['raw_basic']['metric_worst']:.2f}"
                       if "raw_basic" in r else "-"),
                      f"{r['unquantized']}/{r['weighted_layers']}" if "unquantized" in r
                      else "-",
                      f"{r['compute']['mac_share']:.1%}" if "compute" in r else "-",
                      f"{r['wall_s']:.1f}" if "wall_s" in r else "-",
                      f"{r['tool_seconds']:.1f}" if "tool_seconds" in r else "-",
                      note(r), what[:70]))
    widths = [max(len(str(x[i])) for x in [head, *lines]) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths)),
                      *(fmt.format(*x) for x in lines)])

