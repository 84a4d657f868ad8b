"""``fix``: rewrites, then the smallest FP32 set that meets the target, then a strongly typed
mixed-precision model, verified with ONNX Runtime against the FP32 reference.

A pipeline of named stages (``repair.stages``, ``repair.verify``), each a function from frozen
dataclasses to a frozen dataclass:

    baseline -> rewrite -> start plan -> search (rank inside) -> write -> verify -> recheck
    -> FixResult

``recheck`` (``repair.recheck``) searches again, judged by the verifying runner, where the
written model fails its verification: where every candidate in FP32 passes, ``fix`` passes.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import replace
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.compare.metrics import compute_metrics
from precision_doctor.formats import Precision
from precision_doctor.graph.random_ops import determinize, determinized_note, restore_random_ops
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.precision.writer.report import WriterReport
from precision_doctor.repair.holdout import HoldoutSplit, check_written
from precision_doctor.repair.range_bound import (
    bf16_alternative,
    is_range_bound,
    range_bound_report,
)
from precision_doctor.repair.recheck import Rechecked, recheck
from precision_doctor.repair.result import FixResult
from precision_doctor.repair.stages import (
    Baseline,
    FixRequest,
    Progress,
    Rewritten,
    Searched,
    measure_baseline,
    plan_start,
    rewrite,
    search,
)
from precision_doctor.repair.verify import Verification, Written, verify, write
from precision_doctor.runners.base import Runner
from precision_doctor.runners.kernels.engines import conv_bias_of
from precision_doctor.runners.sessions.cpu_arena import shared_cpu
from precision_doctor.search.bisection import SearchResult
from precision_doctor.search.cost import compute_nodes, fp32_share, node_costs
from precision_doctor.search.invariant import check_all_fp32
from precision_doctor.search.objective import Objective, Outputs

__all__ = ["FixResult", "fix", "rewrite_engine_notes"]


def fix(model: onnx.ModelProto, samples: Sequence, target: Precision, objective: Objective,
        keep: Sequence[str] = (), force_low: Sequence[str] = (), rewrites: Sequence[str] | None
        = None, keep_io_types: bool = True, runner: Callable[..., Runner] | None = None,
        max_evals: int = 150, progress: Progress | None = None,
        jobs: int = 1, accuracy: Callable[[dict[str, Outputs]], dict] | None = None,
        engine: str | None = None, holdout: HoldoutSplit | None = None,
        holdout_objective: Objective | None = None) -> FixResult:
    """Find and write a mixed-precision model meeting ``objective``.

    Args:
        model: FP32 model (nodes named).
        samples: Calibration samples (``.name``, ``.feeds``); every evaluation uses all. With
            ``holdout``, its ``search`` samples.
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
        engine: The deployment engine (``ort-cuda``, ``runners.kernels.engines``): nodes it
            has no kernel for in ``target`` are kept FP32 (reason ``engine``). None: a model
            for an engine with every kernel.
        holdout: The split of the samples given (``repair.holdout.split_holdout``): after
            writing, the model is scored on ``holdout.held`` (``FixResult.holdout``; the
            verdict is ``overfits`` when they fail and ``samples`` pass). None: no check.
        holdout_objective: ``objective`` for the held-out samples
            (``HoldoutSplit.held_objective``); default ``objective``.

    Returns:
        ``FixResult``.

    Raises:
        TargetNotMetError: Not even all-FP32 meets the target.
        InvariantError: The plan with every candidate in FP32 still rounds some node (a tool
            defect: ``search.invariant``).
        PlanError: ``target`` is not FP16/BF16; ``keep``/``force_low`` name nothing;
            ``engine`` is not a known engine.
        BackendError: A runner fails.
    """
    t_start = time.perf_counter()
    model, originals = determinize(model)  # the same draws in every run it compares
    request = FixRequest(model, samples, target, objective, keep, force_low, rewrites,
                         keep_io_types, runner, max_evals, progress, jobs, engine)
    # every CPU session of this process (reference, baseline, search, verification) takes its
    # memory from one arena and does not spin (runners.sessions.cpu_arena); with --jobs > 1 the
    # search's forked workers keep their own sessions, so the scope stays out of their way
    with shared_cpu() if jobs <= 1 else nullcontext():
        baseline = measure_baseline(request)
        rewritten = rewrite(request, baseline)
        start = plan_start(request, rewritten)
        if runner is None:  # the emulator's candidates reach every rounding (search.invariant)
            check_all_fp32(rewritten.model, start.plan, conv_bias=conv_bias_of(engine))
        searched = search(request, baseline, rewritten, start)
        written = write(request, rewritten, searched)
        verified = verify(written, request, baseline, searched)
        rechecked = recheck(request, baseline, rewritten, start, searched, written, verified)
        searched, written, verified = rechecked.searched, rechecked.written, rechecked.verified
        t_held = time.perf_counter()
        held = None if holdout is None else check_written(
            request, written, verified, holdout, holdout_objective or objective)
        t_held = time.perf_counter() - t_held
    result = _result(request, baseline, rewritten, searched, written, verified, t_start,
                     rechecked)
    if held is not None:
        result = replace(result, holdout=held.to_dict(),
                         seconds={**result.seconds, "holdout": round(t_held, 3)})
    if originals:  # the written model draws fresh numbers again, as the user's did
        result = replace(result, model=restore_random_ops(result.model, originals),
                         notes=(*result.notes, determinized_note(originals)))
    if accuracy is None:
        return result
    return replace(result, accuracy=accuracy({"fp32": baseline.reference,
                                              target.value: baseline.naive,
                                              "fixed": verified.outputs}))


def _result(request: FixRequest, baseline: Baseline, rewritten: Rewritten, searched: Searched,
            written: Written, verified: Verification, t_start: float,
            rechecked: Rechecked) -> FixResult:
    """The ``FixResult`` of the stages: metrics, FP32 share, warnings and notes."""
    result, objective = searched.result, baseline.objective
    seconds = {"reference": baseline.seconds, "rewrites": rewritten.seconds}
    if searched.ranking is not None:
        seconds["ranking"] = searched.ranking.seconds
    seconds["search"] = searched.seconds
    seconds["write_verify"] = written.seconds + verified.seconds
    if rechecked.seconds:
        seconds["recheck"] = rechecked.seconds
    shapes = {k: v.shape for k, v in request.samples[0].feeds.items()}
    final_fp32 = [n.name for n in compute_nodes(written.model)
                  if _is_fp32_node(n.name, written.plan, written.report)]
    source = rewritten.model
    share = fp32_share(source, final_fp32, node_costs(source, shapes))
    warnings = list(rechecked.warnings)  # the written model failed its first verification
    last = [t for t in result.trials if t.stage.startswith("verified-")] or result.trials
    if len(last) >= request.max_evals:  # the budget of the last search
        warnings.append(f"the search used its whole budget of {request.max_evals} evaluations: "
                        f"the {len(result.kept)} nodes it kept in FP32 meet the target but may "
                        "not all be needed; raise --max-evals for a smaller set")
    warnings.extend(noise_warnings(request, baseline, searched, share))
    bound = range_bound(request, baseline, rewritten, searched, share)
    notes = []
    if any(r.rule == "fuse-layernorm" and r.applied for r in rewritten.report.records):
        low = request.target.value.upper()
        notes.append(f"decomposed LayerNorms were fused into LayerNormalization; its {low} "
                     "emulation assumes FP32 statistics inside the op (what TensorRT and ONNX "
                     "Runtime CUDA compute). If your engine computes LayerNormalization in "
                     f"{low}, add --keep LayerNormalization.")
    rewrites = rewritten.report.to_dict()
    notes.extend(rewrite_engine_notes(rewrites))
    reference = baseline.reference
    return FixResult(written.model, source, written.plan, result,
                     _metrics(reference, baseline.naive), _metrics(reference, verified.outputs),
                     _metrics(reference, verified.emulated), baseline.score_before,
                     verified.score, share, rewrites, written.report.to_dict(),
                     request.target.value, objective.describe(),
                     {k: round(v, 3) for k, v in seconds.items()}, tuple(warnings),
                     tuple(notes), baseline.near_ties, objective.score_label(),
                     objective.pass_mark(),
                     _resources(result, time.perf_counter() - t_start, request.jobs),
                     verified.verified_by.to_dict(), engine=request.engine or "",
                     range_bound=bound)


def range_bound(request: FixRequest, baseline: Baseline, rewritten: Rewritten,
                searched: Searched, share: Mapping[str, float]) -> dict:
    """The ``range_bound`` section (``repair.range_bound``): {} unless the FP16 cure keeps many
    nodes in FP32 for range; then BF16's emulated error on every sample, measured here.

    Raises:
        BackendError: ONNX Runtime fails on the rewritten model.
    """
    ranking, kept = searched.ranking, searched.result.kept
    if ranking is None or not is_range_bound(request.target, ranking.peak, kept,
                                             ranking.overflow, share["flops"]):
        return {}
    bf16 = bf16_alternative(rewritten.model, request.samples, baseline.reference,
                            baseline.objective, conv_bias_of(request.engine))
    return range_bound_report(int(share["fp32_nodes"]), sum(n in ranking.overflow for n in kept),
                              share["flops"], ranking.peak, bf16)


def noise_warnings(request: FixRequest, baseline: Baseline, searched: Searched,
                   share: Mapping[str, float]) -> list[str]:
    """Where the search struggled (it used its whole budget, or kept more than half the
    compute nodes in FP32), the FP32 noise floor of each output with a relative L2 tolerance
    (``diagnosis.noise``: the same FP32 model under other ONNX Runtime optimizations), and a
    warning for each whose floor is at least half its tolerance: no precision plan can be told
    apart from noise there (a dynamically quantized MiniLM: floor 0.10 against 1e-2, from
    ONNX Runtime's own SkipLayerNorm fusion flipping 8-bit roundings)."""
    tolerances = baseline.objective.tolerances or {}
    fp32_nodes = int(share["fp32_nodes"])  # of the report's compute nodes (``fp32_share``)
    struggled = (searched.result.evaluations >= request.max_evals
                 or fp32_nodes > share["compute_nodes"] / 2 or not searched.result.score.passed)
    if not struggled or not any(t.rel_l2 for t in tolerances.values()):
        return []
    from precision_doctor.diagnosis.noise import measure_noise_floor

    floor = measure_noise_floor(request.model, [s.feeds for s in request.samples],
                                baseline.reference)
    out = []
    for name, nf in floor.per_output.items():
        tol = tolerances.get(name) or tolerances.get("*")
        if tol is not None and tol.rel_l2 and nf >= tol.rel_l2 / 2:
            out.append(f"output {name!r}: its FP32 noise floor is {nf:.3g} relative L2 (the same "
                       "FP32 model under other ONNX Runtime graph optimizations differs that "
                       f"much), {nf / tol.rel_l2:.2g}x the tolerance {tol.rel_l2:.3g}: no "
                       "precision plan can be told apart from that noise, which is why the "
                       f"search kept {fp32_nodes} nodes in FP32. Set --tolerance at least "
                       f"{2 * nf:.2g}, or judge the model by its task (--metric)")
    return out


def _metrics(ref: Outputs, cand: Outputs) -> dict:
    return {k: compute_metrics(ref[k], cand[k]).to_dict() for k in ref
            if np.asarray(ref[k][0]).dtype.kind == "f"}


def rewrite_engine_notes(rewrites: dict) -> list[str]:
    """The engine settings the applied transformer rewrites rely on, one note per rule."""
    applied = {r["rule"] for r in rewrites.get("records", ()) if r.get("applied")}
    notes = []
    if "prescale-attention" in applied:
        notes.append("prescale-attention moved the 1/sqrt(d) attention scale onto Q before QK^T "
                     "(folded into the Q projection where possible): no engine setting needed; "
                     "the scores are never stored unscaled")
    if "saturate-constants" in applied:
        notes.append("saturate-constants clamped mask constants beyond the target's range "
                     "(-FLT_MAX) to its lowest finite value, as TensorRT's weight conversion "
                     "does, after checking the FP32 outputs do not move: no engine setting "
                     "needed; the written model stores the clamped value")
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


def _is_fp32_node(name: str, plan: PrecisionPlan, writer_report: WriterReport) -> bool:
    return (plan.precision_of(name) is Precision.FP32
            or name in {k.node for k in writer_report.kept_fp32})
