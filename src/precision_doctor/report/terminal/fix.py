"""Terminal rendering of a ``fix`` result: the objective the user set first, then before/after.

The headline is the fixed model against *the fix's objective* (the task metric and threshold, or
the tolerance), with the original model's naive low-precision score beside it; every number goes
through ``numbers.fmt3`` and every table through ``tables`` (readable at 80 columns).
"""

from __future__ import annotations

from typing import Any, Mapping

from rich.console import Console
from rich.text import Text

from precision_doctor.compare.tasks.accuracy import accuracy_line
from precision_doctor.formats import Precision
from precision_doctor.graph.source import group_by_module, node_modules
from precision_doctor.numbers import fmt3, fmt_vs
from precision_doctor.repair.result import FixResult
from precision_doctor.report.terminal.diagnosis import verdict_tag
from precision_doctor.report.terminal.tables import Col, MetricTable, metric_table
from precision_doctor.runners.verify import VerifiedBy

MAX_PLAN_LINES = 30  # the plan's lines in the terminal; the plan JSON lists every node
BEFORE_AFTER_COLUMNS = (Col("output", "key"), Col("before"), Col("after"),
                        Col("after emu", label="after (emulated)"))
BEFORE_AFTER_CAPTION = ("before = original model, naive {target} (emulated); after = the written "
                        "model run by {runner}; after emu = its plan, emulated")


def objective_line(result: FixResult) -> Text:
    """``<score label>: original in FP16 <v> (fail) -> fixed <v> (pass)``, each value printed
    with the digits that keep it on its side of the threshold (``numbers.fmt_vs``)."""
    threshold, higher = result.pass_mark
    before = fmt_vs(result.score_before.value, threshold, higher)
    after = fmt_vs(result.score_after.value, threshold, higher)
    op = ">=" if higher else "<="
    return Text.assemble(
        f"{result.score_label} (passes {op} {threshold:g}): ",
        f"original in {result.target.upper()} {before} (", verdict_tag(result.score_before.passed),
        f") -> fixed {after} (", verdict_tag(result.score_after.passed), ")")


def holdout_lines(holdout: Mapping[str, Any] | None) -> list[Text]:
    """The held-out check beside the search score (``repair.holdout.HoldoutCheck``): the
    written model's score on the samples the search never saw, or why it was not checked;
    with an overfitting plan, what to do."""
    if not holdout:
        return []
    if not holdout.get("samples"):
        return [Text(f"  {holdout.get('message', '')}", style="yellow")]
    names = list(holdout.get("names") or [])
    which = ", ".join(names[:3]) + (f" +{len(names) - 3}" if len(names) > 3 else "")
    how = " (held out by default; --holdout N to choose)" \
        if holdout.get("chosen") == "default" else ""
    lines = [Text.assemble(
        f"  held out: {holdout.get('score_label', 'score')} {fmt3(holdout.get('score'))} (",
        verdict_tag(bool(holdout.get("passed"))), f") on {holdout['samples']} sample"
        f"{'s' if holdout['samples'] > 1 else ''} the search never saw ({which}){how}; "
        f"search samples ({holdout.get('search_samples')}) {fmt3(holdout.get('search_score'))}")]
    if holdout.get("overfits"):
        lines.append(Text("  " + str(holdout.get("message", "")).split(". ", 1)[-1],
                          style="bold red"))
    return lines


def before_after_table(result: FixResult) -> MetricTable:
    """Relative L2 error per output: naive low precision, fixed (the runner that verified it),
    fixed (emulated)."""
    rows = [[name, fmt3(result.before[name].get("rel_l2")),
             fmt3(result.after.get(name, {}).get("rel_l2")),
             fmt3(result.after_emulated.get(name, {}).get("rel_l2"))] for name in result.before]
    return metric_table("Before / after (rel L2 vs the FP32 reference)", BEFORE_AFTER_COLUMNS,
                        rows, caption=BEFORE_AFTER_CAPTION.format(
                            target=result.target.upper(), runner=verifier_name(result)))


def render_fix(result: FixResult, console: Console) -> None:
    """Print the fix: verdict against the objective, before/after, FP32 share, kept nodes."""
    ok = result.passed
    console.print(Text.assemble(
        (result.verdict.upper(), f"bold {'green' if ok else 'red'}"),
        f" {result.target.upper()} fix against the objective: {result.objective}"))
    console.print(Text("  ") + objective_line(result))
    for held in holdout_lines(result.holdout):
        console.print(held)
    if result.accuracy:
        console.print(Text(f"Accuracy against labels: {accuracy_line(result.accuracy)}"))
    console.print(before_after_table(result))
    line = verification_line(result)
    if line:
        console.print(Text(line))
    s = result.share
    console.print(f"FP32: {s['fp32_nodes']} of {s['compute_nodes']} compute nodes "
                  f"({s['nodes']:.1%}), {s['flops']:.1%} of FLOPs, {s['params']:.1%} of "
                  f"parameters")
    console.print(Text(resources_line(result.resources)))
    applied = applied_rewrites(result)
    if applied:
        console.print("rewrites: " + ", ".join(f"{k} x{v}" for k, v in sorted(applied.items())))
    if result.search.regions is not None:
        console.print(Text(regions_line(result.search.regions.to_dict())))
    if result.range_bound:
        console.print(Text(result.range_bound["message"], style="yellow"))
    for line in plan_lines(result):
        console.print(Text(line))
    for t in result.near_ties:
        console.print(Text(f"near-tie (left out of the target): {t.sample}: FP32 top-1 vs top-2 "
                           f"margin {fmt3(t.margin)} < 2 x FP32 noise {fmt3(t.noise)}"))
    for note in result.notes:
        console.print(Text(f"note: {note}"))
    for w in result.warnings:
        console.print(Text.assemble(("warning:", "yellow"), f" {w}"))


def verifier_name(result: FixResult) -> str:
    """The runner that verified the written model, in words (``FixResult.verification``)."""
    v = result.verification
    return VerifiedBy.from_dict(v).title if v else "ONNX Runtime CPU"


def verification_line(result: FixResult) -> str:
    """``verified with <runner>: <why>; not <other>: <why not>``, or "" when not recorded."""
    v = result.verification
    return f"verified with {VerifiedBy.from_dict(v).describe()}" if v else ""


def applied_rewrites(result: FixResult) -> dict[str, int]:
    """How many times each numerically safe rewrite rule was applied, by rule name."""
    applied: dict[str, int] = {}
    for r in result.rewrites.get("records", []):
        if r.get("applied"):
            applied[r["rule"]] = applied.get(r["rule"], 0) + 1
    return applied


def resources_line(r: dict) -> str:
    """``12 evaluations (40 sample runs), 95.2 s wall (150.1 s CPU), peak RSS 812 MiB``."""
    if not r:
        return ""
    workers = (f", {r['jobs']} jobs (largest worker {r['peak_rss_workers_mb']:.0f} MiB)"
               if r.get("jobs", 1) > 1 else "")
    return (f"{r['evaluations']} evaluations ({r['samples_run']} sample runs), "
            f"{r['wall_s']:.1f} s wall ({r['cpu_s']:.1f} s CPU), peak RSS "
            f"{r['peak_rss_mb']:.0f} MiB{workers}")


def fp32_groups(result: FixResult) -> list[dict]:
    """The plan's FP32 nodes grouped by the module regions that hold them
    (``graph.source.group_by_module``: ``output_blocks.*.out_layers`` where every such module
    is kept); nodes without a module path grouped by op type.

    Returns:
        ``[{"region", "nodes", "reasons": {reason: n}, "ops": {op_type: n}}]`` in plan
        order; ``region`` is ``""`` for the top-level module, ``"(op) Conv"`` for unplaced
        nodes.
    """
    fp32 = {n: d for n, d in result.plan.overrides.items() if d.precision is Precision.FP32}
    modules = node_modules(result.rewritten)
    op_of = {n.name: n.op_type for n in result.rewritten.graph.node}
    groups = dict(group_by_module(fp32, modules))
    placed = {n for names in groups.values() for n in names}
    for name in fp32:
        if name not in placed:
            groups.setdefault(f"(op) {op_of.get(name, '?')}", []).append(name)
    order = {n: i for i, n in enumerate(fp32)}
    out = []
    for region, names in sorted(groups.items(), key=lambda kv: min(order[n] for n in kv[1])):
        reasons: dict[str, int] = {}
        ops: dict[str, int] = {}
        for n in names:
            reasons[fp32[n].reason] = reasons.get(fp32[n].reason, 0) + 1
            ops[op_of.get(n, "?")] = ops.get(op_of.get(n, "?"), 0) + 1
        out.append({"region": region, "nodes": names, "reasons": reasons, "ops": ops})
    return out


def plan_lines(result: FixResult, limit: int = MAX_PLAN_LINES) -> list[str]:
    """The plan in at most ``limit`` lines: one per override when they fit, else the FP32
    nodes by region (``fp32_groups``), the regions that do not fit counted on the last line."""
    overrides = result.plan.overrides
    if len(overrides) <= limit:
        return [f"  {d.precision.value.upper()} {name}: {d.reason} {d.detail}".rstrip()
                for name, d in overrides.items()]
    groups = fp32_groups(result)
    others = len(overrides) - sum(len(g["nodes"]) for g in groups)
    lines = [f"FP32 nodes by region ({sum(len(g['nodes']) for g in groups)}; every node with "
             "its reason in the plan JSON):"]
    room = limit - 1 - (others > 0)
    shown = groups if len(groups) <= room else groups[:room - 1]
    for g in shown:
        reasons = ", ".join(f"{r} {k}" for r, k in g["reasons"].items())
        ops = ", ".join(f"{op} x{k}" for op, k in sorted(g["ops"].items(),
                                                          key=lambda kv: (-kv[1], kv[0]))[:3])
        lines.append(f"  {g['region'] or '(top level)'}: {len(g['nodes'])} ({reasons}; {ops})")
    if len(shown) < len(groups):
        rest = groups[len(shown):]
        lines.append(f"  ... {len(rest)} more regions, {sum(len(g['nodes']) for g in rest)} "
                     "nodes")
    if others:
        lines.append(f"  {others} nodes with another explicit precision (plan JSON)")
    return lines


def regions_line(regions: dict) -> str:
    """``searched by regions first (...): 16 top regions, refined over 2 levels to 12 kept``
    (``search.regions``), after the range floor where it kept nodes (``range floor: the 246
    nodes of values over 32752 on any sample kept in FP32``, alone when the search ended
    there), with the regions kept whole where a level ran out of its budget
    share."""
    line = (f"searched by regions first (range needs many FP32 nodes): {regions['regions']} "
            f"top regions, refined over {regions['levels']} levels to {len(regions['kept'])} "
            "kept")
    if regions.get("floor"):
        floor = (f"range floor: the {regions['floor']} nodes of values over "
                 f"{regions['floor_threshold']:g} on any sample kept in FP32")
        if not regions["levels"] and not regions["kept"]:
            return floor + "; the search ended there"
        line = f"{floor}, then {line}"
    stopped = regions.get("stopped") or []
    if stopped:
        line += (f"; {len(stopped)} kept whole (their level's budget share was spent; "
                 "--max-evals refines them)")
    return line
