"""Terminal rendering of an INT8/FP8 diagnosis and fix: the answer first (verdict, score),
then the causes with their measured cures, then the layers with the lowest output SQNR."""

from __future__ import annotations

import math

from rich.console import Console
from rich.text import Text

from precision_doctor.numbers import fmt3, fmt_share
from precision_doctor.quant.diagnose import QuantDiagnosis
from precision_doctor.quant.fix import QuantFix
from precision_doctor.report.terminal.fix import holdout_lines
from precision_doctor.report.terminal.tables import Col, metric_table

LAYER_COLUMNS = (Col("layer", "key"), Col("op", "name"), Col("in dB", label="input SQNR dB"),
                 Col("w dB", label="weight SQNR dB"), Col("out dB", label="output SQNR dB"),
                 Col("clipped"), Col("zeroed"), Col("spread", label="channel spread"),
                 Col("share", label="error share"), Col("cure", label="FP16 cure"))
LAYER_CAPTION = ("SQNR = 10 log10(signal / quantization noise); in/w: the layer's own inputs "
                 "and weights quantized; out: its output, everything upstream included; "
                 "share/cure: measured error power caused alone / removed by FP16")


def _db(v: float | None) -> str:
    if v is None:
        return "-"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.1f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else fmt_share(v, 1 if 0 < v < 0.01 else 0)


def samples_line(calibration: dict, evaluated: int) -> str:
    """``  calibrated on N samples (source), evaluated on M: disjoint | NOT disjoint``."""
    apart = "disjoint" if calibration.get("disjoint") else "NOT disjoint (the same samples)"
    return (f"  calibrated on {calibration.get('samples')} samples "
            f"({calibration.get('source')}), evaluated on {evaluated}: {apart}")


def render_quant_diagnosis(result: QuantDiagnosis, console: Console, layers: int = 10) -> None:
    """Print the verdict, outputs, causes and the ``layers`` layers with the lowest output
    SQNR."""
    ok = result.passed
    console.print(Text.assemble(("PASS" if ok else "FAIL", f"bold {'green' if ok else 'red'}"),
                                f" {result.verdict}"))
    console.print(Text(f"  Q/DQ by TensorRT's placement rules, {result.between.upper()} between;"
                       f" calibrator {result.calibration.get('method')}"))
    console.print(Text(samples_line(result.calibration, result.evaluation_samples)))
    outs = ", ".join(f"{k} rel L2 {fmt3(v.get('rel_l2'))}" for k, v in result.metrics.items())
    console.print(Text(f"  Outputs: {outs}"))
    if result.causes:
        console.print(Text(f"Causes (each by a measured cure; together "
                           f"{_pct(result.explained_share)} of the error):", style="bold"))
        for c in result.causes:
            units = ", ".join(c.units[:4]) + (f" +{len(c.units) - 4}" if len(c.units) > 4
                                                else "")
            console.print(Text(f"  {c.kind}: {units}", style="bold"))
            console.print(Text(f"    {c.evidence}"))
            console.print(Text(f"    remedy: {c.remedy}"))
    if result.blocks:
        top = sorted(result.blocks, key=lambda b: -float(b["share"]))[:3]
        where = "; ".join(f"{b['first']} .. {b['last']} ({b['layers']} layers) "
                          f"{_pct(float(b['share']))}" for b in top)
        console.print(Text(f"Where the error builds up (each run of layers quantized alone): "
                           f"{where}"))
    worst = sorted((m for m in result.layers if m.quantized),
                   key=lambda m: (m.output_sqnr_db, m.unit))[:layers]
    rows = [[m.unit, m.op_type, _db(m.input_sqnr_db), _db(m.weight_sqnr_db),
             _db(m.output_sqnr_db), _pct(m.clipped_share), _pct(m.zeroed_share),
             f"{m.channel_spread:.1f}", _pct(m.error_share), _pct(m.cure)] for m in worst]
    if rows and not ok:
        console.print(metric_table(f"Lowest output SQNR ({len(worst)} of "
                                   f"{sum(m.quantized for m in result.layers)} quantized layers)",
                                   LAYER_COLUMNS, rows, caption=LAYER_CAPTION))
    elif rows:
        m = worst[0]
        console.print(Text(f"  Lowest output SQNR: {m.unit} ({m.op_type}) {_db(m.output_sqnr_db)}"
                           f" dB of {sum(x.quantized for x in result.layers)} quantized layers"))
    if not ok:
        console.print(Text("Next: precision-doctor fix MODEL -o out.onnx --target "
                           f"{result.target} --data ... (fewest layers in FP16, SmoothQuant, "
                           "calibrator choice)"))


def render_quant_fix(result: QuantFix, console: Console, holdout: dict | None = None) -> None:
    """Print the fix: verdict, before/after, the held-out check (``holdout``:
    ``repair.holdout.HoldoutCheck.to_dict``), unquantized layers, rewrites, recipes."""
    overfits = bool((holdout or {}).get("overfits"))
    ok = result.passed and not overfits
    verdict = "OVERFITS" if overfits else "PASS" if ok else "FAIL"
    console.print(Text.assemble((verdict, f"bold {'green' if ok else 'red'}"),
                                f" {result.target.upper()} fix against the objective: "
                                f"{result.objective}"))
    console.print(Text(f"  score: every layer quantized {fmt3(result.score_before)} -> written "
                       f"model {fmt3(result.score_after)} (verified by {result.verified_by})"))
    for line in holdout_lines(holdout):
        console.print(line)
    console.print(Text(samples_line(result.calibration, result.evaluation_samples)))
    left = len(result.unquantized)
    console.print(Text(f"  {result.units - left} of {result.units} layers quantized; "
                       f"{left} left in {result.between.upper()}"
                       + (": " + ", ".join(result.unquantized[:8])
                          + (f" +{left - 8}" if left > 8 else "") if left else "")))
    share = result.quantized_share
    if share:
        console.print(Text(f"  in {result.target.upper()}: {_pct(share['macs'])} of the MACs, "
                           f"{_pct(share['params'])} of the parameters "
                           f"({share['quantized_layers']} of {share['mac_layers']} "
                           "Conv/MatMul/Gemm layers)"))
    if result.float_fp32:
        console.print(Text(f"  {len(result.float_fp32)} nodes kept FP32 between the pairs: the "
                           f"model fails the target in FP16 alone ({result.between})"))
    tried = ", ".join(f"{k} {fmt3(v)}" for k, v in result.calibrators.items())
    console.print(Text(f"  calibrator: {result.calibrator} (every layer quantized: {tried})"))
    if result.smoothquant:
        sq = result.smoothquant
        console.print(Text(f"  SmoothQuant alpha {sq['alpha']} on {len(sq['units'])} GEMMs "
                           f"(score {fmt3(sq['score'])})"))
    console.print(Text(f"  {result.evaluations} search evaluations, "
                       f"{result.seconds.get('total', 0):.1f} s"))
