"""``fix``: rewrites, then the smallest FP32 set that meets the target, then a strongly typed
mixed-precision model, verified with ONNX Runtime against the FP32 reference.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np
import onnx

from precision_doctor import __version__
from precision_doctor.compare.metrics import compute_metrics
from precision_doctor.diagnosis.hazards import scan_hazards
from precision_doctor.diagnosis.headroom.probe import fp32_statistics_nodes
from precision_doctor.errors import PlanError
from precision_doctor.formats import Precision
from precision_doctor.graph.external import small_in_memory
from precision_doctor.graph.outputs import producer_inputs
from precision_doctor.layerwise.candidates import emulated, reference_factory, run_samples
from precision_doctor.layerwise.compare import compare_layerwise
from precision_doctor.precision.plan import PrecisionPlan, select_nodes
from precision_doctor.precision.rewrites import apply_rewrites
from precision_doctor.precision.writer import write_mixed_precision
from precision_doctor.precision.writer.report import WriterReport
from precision_doctor.runners.base import Runner
from precision_doctor.runners.emulator import EmulatorRunner
from precision_doctor.runners.ort import OrtRunner
from precision_doctor.runners.ort_shared import shared_cpu
from precision_doctor.search.bisection import SearchResult, search_fp32_set
from precision_doctor.search.cost import compute_nodes, fp32_share, node_costs
from precision_doctor.search.near_ties import (
    DECISION_METRICS,
    NearTie,
    at_risk_samples,
    decision_output,
    find_near_ties,
)
from precision_doctor.search.objective import Objective, Outputs, Score
from precision_doctor.search.ranking import rank_by_sensitivity, upstream_first

Progress = Callable[[str, int, int], None]
REWRITE_HINT = "(after rewrites: folded BatchNorms and fused LayerNorms are gone)"
RANKING_SAMPLES = 2  # layerwise ranking uses the worst samples; every evaluation uses all


@dataclass(frozen=True)
class FixResult:
    """Everything ``fix`` did; ``to_dict`` is the JSON report (schema ``precision-doctor/fix``).

    Attributes:
        model: The fixed strongly typed model.
        rewritten: The FP32 model after the numerically safe rewrites (the plan's node names).
        plan: The final precision plan (every override with its reason).
        search: The search result (evaluations, trials).
        before / after: Output metrics (dicts) of the naive all-low model (emulated) and of the
            fixed model run by ONNX Runtime CPU.
        after_emulated: Output metrics of the emulated final plan.
        score_before / score_after: Objective scores.
        share: FP32 share by nodes / FLOPs / params.
        rewrites / writer: Reports of the rewrites and the writer (dicts).
        target / objective: What was asked.
        seconds: Wall time per stage.
        warnings / notes: What the user should know (emulator vs ORT gap, assumptions).
        near_ties: Samples left out of a decision-metric target (see ``search.near_ties``).
        score_label: What the scores measure (``Objective.score_label``).
        pass_mark: ``(threshold, higher_is_better)`` the scores are compared with
            (``Objective.pass_mark``).
        resources: What the run cost: ``evaluations``, ``samples_run`` (sample runs of the
            search), ``wall_s`` (whole ``fix``), ``peak_rss_mb`` (this process, MiB, from
            ``resource.getrusage`` ``ru_maxrss``), ``peak_rss_workers_mb`` (largest worker of
            ``--jobs``, 0 without), ``jobs``.
        accuracy: With labels: the task accuracy of the FP32 reference, the naive low
            precision model and the fixed model (``compare.tasks.accuracy.task_accuracy``).
    """

    model: onnx.ModelProto
    rewritten: onnx.ModelProto
    plan: PrecisionPlan
    search: SearchResult
    before: dict
    after: dict
    after_emulated: dict
    score_before: Score
    score_after: Score
    share: dict
    rewrites: dict
    writer: dict
    target: str
    objective: str
    seconds: dict = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    near_ties: tuple[NearTie, ...] = ()
    score_label: str = "score"
    pass_mark: tuple[float, bool] = (1.0, False)
    resources: dict = field(default_factory=dict)
    accuracy: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.score_after.passed

    def to_dict(self) -> dict:
        return {
            "schema": "precision-doctor/fix", "schema_version": 1, "tool_version": __version__,
            "verdict": "pass" if self.passed else "fail", "target": self.target,
            "objective": self.objective, "plan": self.plan.to_dict(),
            "fp32_share": self.share, "before": self.before, "after": self.after,
            "after_emulated": self.after_emulated,
            "score_before": _score_dict(self.score_before),
            "score_after": _score_dict(self.score_after),
            "search": {"evaluations": self.search.evaluations, "kept": list(self.search.kept),
                       "ranking_head": list(self.search.ranking[:20]),
                       "samples_run": sum(t.samples for t in self.search.trials),
                       "trials": [t.__dict__ for t in self.search.trials]},
            "rewrites": self.rewrites, "writer": self.writer, "seconds": self.seconds,
            "warnings": list(self.warnings), "notes": list(self.notes),
            "near_ties": [t.to_dict() for t in self.near_ties],
            "resources": self.resources, "accuracy": self.accuracy,
        }


def _score_dict(s: Score) -> dict:
    return {"passed": s.passed, "value": s.value, "detail": s.detail}


def _metrics(ref: Outputs, cand: Outputs) -> dict:
    return {k: compute_metrics(ref[k], cand[k]).to_dict() for k in ref
            if np.asarray(ref[k][0]).dtype.kind == "f"}


# The emulated search's sessions use ONNX Runtime's CPU memory arena: without it every large
# activation is a fresh mmap and half the CPU time is page faults. Measured 2026-11-24 on the
# idle 2-core machine, `fix det.onnx` (3 full images, default tolerance): 256 s wall (495 s CPU,
# 147M minor page faults), peak RSS 1.26 GB without; 133 s (253 s CPU, 20M faults), 1.97 GB
# with; the same 9 FP32 nodes. In this process (--jobs 1) the search's sessions share one arena
# instead (runners.ort_shared: 1.2 GB peak); this per-session arena serves the --jobs workers.
SEARCH_ARENA = True


def fix(model: onnx.ModelProto, samples: Sequence, target: Precision, objective: Objective,
        keep: Sequence[str] = (), force_low: Sequence[str] = (), rewrites: Sequence[str] | None
        = None, keep_io_types: bool = True, runner: Callable[..., Runner] | None = None,
        max_evals: int = 150, progress: Progress | None = None,
        jobs: int = 1, accuracy: Callable[[dict[str, Outputs]], dict] | None = None
        ) -> FixResult:
    """Find and write a mixed-precision model meeting ``objective``.

    Args:
        model: FP32 model (nodes named).
        samples: Calibration samples (``.name``, ``.feeds``); every evaluation uses all.
        target: FP16 or BF16 (TF32 is an engine switch: use ``diagnose --target tf32``).
        objective: Tolerance or task metric.
        keep: Node names/op types forced to FP32 (reason ``user``).
        force_low: Node names/op types never put in FP32 by the search.
        rewrites: Rewrite rules to apply (None = all; ``[]`` = none).
        keep_io_types: Keep graph inputs/outputs FP32.
        runner: Evaluate written models with this runner factory (e.g. ORT CUDA) instead of
            the CPU emulator.
        max_evals: Search evaluation budget.
        progress: ``progress(stage, done, total)``.
        jobs: Worker processes for the search's sample runs (``search.evalpool``); the
            result is the same for any value. A ``runner`` factory is then called as
            ``runner(model, intra_op_threads=t)``.
        accuracy: Called once with ``{"fp32": reference, "<target>": naive, "fixed": after}``
            outputs; its dict (task accuracy against labels) goes into the result.

    Returns:
        ``FixResult``.

    Raises:
        TargetNotMetError: Not even all-FP32 meets the target.
        PlanError: ``keep``/``force_low`` name nothing.
        BackendError: A runner fails.
    """
    if target not in (Precision.FP16, Precision.BF16):
        raise PlanError(f"fix writes FP16 or BF16 models; {target.value} is an engine setting "
                        "(TF32: check it with `diagnose --target tf32`)")
    seconds: dict[str, float] = {}
    t_start = t0 = time.perf_counter()
    names = [o.name for o in model.graph.output]
    reference = run_samples(reference_factory(model), samples, names)
    objective = objective.with_samples(samples)
    near_ties = find_near_ties(model, samples, reference, objective)
    if near_ties:
        objective = replace(objective, exclude=frozenset(t.index for t in near_ties))
    naive = run_samples(EmulatorRunner(model, PrecisionPlan(target)), samples, names)
    score_before = objective.score(reference, naive)
    seconds["reference"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    fixed_src, rw_report = apply_rewrites(model, rewrites)
    seconds["rewrites"] = time.perf_counter() - t0
    base = PrecisionPlan(target)
    user = select_nodes(fixed_src, keep, "--keep", REWRITE_HINT)
    if user:
        base = base.keep_fp32(user, "user", "--keep")
    hazards = scan_hazards(fixed_src, target)
    for h in hazards:
        if h.kind == "parameter-out-of-range":
            base = base.keep_fp32([h.node], "hazard", h.detail)
    # layernorm-fp32-stats for a LayerNorm left unfused: FP32 statistics via the plan
    stats_fp32 = rewrites is None or "layernorm-fp32-stats" in rewrites
    for ln, stats in (fp32_statistics_nodes(fixed_src, [s.feeds for s in samples]).items()
                      if stats_fp32 else ()):
        base = base.keep_fp32(stats, "rewrite", f"FP32 statistics of the decomposed LayerNorm "
                              f"'{ln}' ((x - mean)^2 overflows FP16; not fused)")
    low = set(select_nodes(fixed_src, force_low, "--force-low", REWRITE_HINT))
    fixed_nodes = set(base.overrides)
    candidates = [n.name for n in compute_nodes(fixed_src)
                  if n.name not in fixed_nodes and n.name not in low]

    def open_plan(plan: PrecisionPlan, threads: int = 0) -> Runner:
        if runner is None:  # the arena pays here: each evaluation session runs every sample
            return EmulatorRunner(fixed_src, plan, intra_op_threads=threads,
                                  cpu_mem_arena=SEARCH_ARENA)
        written = write_mixed_precision(fixed_src, plan, keep_io_types, validate=False)[0]
        return runner(written, intra_op_threads=threads) if threads else runner(written)

    def ranking(start: Score) -> list[str]:
        t = time.perf_counter()
        # metric objectives: the worst-scored samples; tolerance objectives: the first ones
        # (choosing them by error share per element gave det a ranking whose search kept 14
        # FP32 nodes instead of 9 and a 4x longer layerwise pass, measured 2026-11-24)
        worst = (objective.worst_samples(start, RANKING_SAMPLES, len(samples))
                 if objective.metric is not None
                 else list(range(min(RANKING_SAMPLES, len(samples)))))
        cand = emulated(base)
        lw = compare_layerwise(fixed_src, [samples[i].feeds for i in worst],
                               reference_factory, cand.factory, target, threshold=1e-2,
                               candidate_graph=cand.graph)
        seconds["ranking"] = time.perf_counter() - t
        hazard_nodes = [n for h in hazards if h.kind == "decomposed-layernorm" for n in h.nodes]
        ranked = rank_by_sensitivity(lw, candidates, producer_inputs(fixed_src), hazard_nodes)
        if objective.metric is not None and objective.metric.name in DECISION_METRICS:
            # nodes feeding the decision output first (others cannot flip it)
            ranked = upstream_first(ranked, fixed_src, decision_output(objective, names))
        return ranked

    t0 = time.perf_counter()
    def screen(start_outputs: Outputs) -> list[int] | None:
        return at_risk_samples(reference, start_outputs, objective)

    # in this process, the evaluations' sessions reuse each other's memory (runners.ort_shared)
    # and the next evaluation's runner opens while one runs, where two of them fit in memory
    prefetch = jobs <= 1 and small_in_memory(fixed_src)
    with shared_cpu() if jobs <= 1 else nullcontext():
        result = search_fp32_set(open_plan, samples, reference, objective, base, ranking,
                                 max_evals, progress, jobs, screen, prefetch)
    seconds["search"] = time.perf_counter() - t0 - seconds.get("ranking", 0.0)

    t0 = time.perf_counter()
    written, writer_report = write_mixed_precision(fixed_src, result.plan, keep_io_types)
    if runner is not None and result.final_outputs is not None \
            and _is_plain_ort_cpu(runner(written)):
        after = result.final_outputs  # the search's final evaluation ran this very model
    else:
        after = run_samples(OrtRunner(written, name="ort-cpu-fixed"), samples, names)
    effective = writer_report.effective_plan()
    if (runner is None and result.final_outputs is not None
            and effective.fp32_nodes() == result.plan.fp32_nodes()):
        after_emulated = result.final_outputs  # the search's final evaluation ran this plan
    else:
        after_emulated = run_samples(EmulatorRunner(fixed_src, effective), samples, names)
    score_after = objective.score(reference, after)
    seconds["write_verify"] = time.perf_counter() - t0
    shapes = {k: v.shape for k, v in samples[0].feeds.items()}
    final_fp32 = [n.name for n in compute_nodes(written)
                  if _is_fp32_node(n.name, result.plan, writer_report)]
    share = fp32_share(fixed_src, final_fp32, node_costs(fixed_src, shapes))
    warnings = []
    if not score_after.passed and result.score.passed:
        warnings.append("the emulated plan meets the target but ONNX Runtime CPU on the written "
                        f"model scores {score_after.value:.4g}: its FP16 kernels compute "
                        "differently from the engine model the emulator assumes. Decision "
                        "metrics at exact thresholds (identical strings, boxes) depend on the "
                        "engine's exact rounding: search with the engine you deploy on "
                        "(--runner ort:cpu, ort:cuda)")
    if result.evaluations >= max_evals:
        warnings.append(f"the search used its whole budget of {max_evals} evaluations: the "
                        f"{len(result.kept)} nodes it kept in FP32 meet the target but may not "
                        "all be needed; raise --max-evals for a smaller set")
    notes = []
    if any(r.rule == "fuse-layernorm" and r.applied for r in rw_report.records):
        notes.append("decomposed LayerNorms were fused into LayerNormalization; its FP16 "
                     "emulation assumes FP32 statistics inside the op (what TensorRT and ONNX "
                     "Runtime CUDA compute). If your engine computes LayerNormalization in "
                     "FP16, add --keep LayerNormalization.")
    notes.extend(rewrite_engine_notes(rw_report.to_dict()))
    acc = (accuracy({"fp32": reference, target.value: naive, "fixed": after})
           if accuracy is not None else {})
    return FixResult(written, fixed_src, result.plan, result, _metrics(reference, naive),
                     _metrics(reference, after), _metrics(reference, after_emulated),
                     score_before, score_after, share,
                     rw_report.to_dict(), writer_report.to_dict(), target.value,
                     objective.describe(), {k: round(v, 3) for k, v in seconds.items()},
                     tuple(warnings), tuple(notes), tuple(near_ties), objective.score_label(),
                     objective.pass_mark(),
                     _resources(result, time.perf_counter() - t_start, jobs), acc)


def rewrite_engine_notes(rewrites: dict) -> list[str]:
    """The engine settings the applied transformer rewrites rely on, one note per rule."""
    applied = {r["rule"] for r in rewrites.get("records", ()) if r.get("applied")}
    notes = []
    if "prescale-attention" in applied:
        notes.append("prescale-attention moved the 1/sqrt(d) attention scale onto Q before QK^T "
                     "(folded into the Q projection where possible): no engine setting needed; "
                     "the scores are never stored unscaled")
    if "layernorm-fp32-stats" in applied:
        notes.append("layernorm-fp32-stats set stash_type=1 on LayerNormalization: relies on the "
                     "engine computing the statistics in FP32 as ONNX specifies (ONNX Runtime "
                     "CPU/CUDA do); on TensorRT check the layer's precision in the built "
                     "engine's layer information")
    return notes


def _resources(result: SearchResult, wall_s: float, jobs: int) -> dict:
    """Evaluations, sample runs, wall time and peak RSS (``ru_maxrss`` is KiB on Linux,
    bytes on macOS: getrusage(2))."""
    import resource
    import sys

    scale = 1 / 1024 / 1024 if sys.platform == "darwin" else 1 / 1024
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    workers = kids.ru_maxrss * scale if jobs > 1 else 0
    cpu = me.ru_utime + me.ru_stime + (kids.ru_utime + kids.ru_stime if jobs > 1 else 0.0)
    return {"evaluations": result.evaluations,
            "samples_run": sum(t.samples for t in result.trials),
            "wall_s": round(wall_s, 2), "cpu_s": round(cpu, 2),
            "peak_rss_mb": round(me.ru_maxrss * scale, 1),
            "peak_rss_workers_mb": round(workers, 1), "jobs": jobs}


def _is_plain_ort_cpu(runner: Runner) -> bool:
    """Whether ``runner`` (not entered) is ONNX Runtime CPU with default options, i.e. what
    ``fix`` verifies the written model with."""
    return (isinstance(runner, OrtRunner) and runner.providers == ["CPUExecutionProvider"]
            and runner.provider_options == [{}] and runner.graph_optimization == "all")


def _is_fp32_node(name: str, plan: PrecisionPlan, writer_report: WriterReport) -> bool:
    return (plan.precision_of(name) is Precision.FP32
            or name in {k.node for k in writer_report.kept_fp32})
