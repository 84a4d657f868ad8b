"""The stages of ``fix`` before the model is written: baseline, rewrite, start plan, rank,
search. Each is a function from frozen dataclasses to a frozen dataclass; ``repair.pipeline``
chains them, and ``repair.verify`` writes and verifies what the search found.

    FixRequest -> measure_baseline -> Baseline   (FP32 reference, naive low-precision score)
    FixRequest -> rewrite          -> Rewritten  (numerically safe rewrites)
    Rewritten  -> plan_start       -> StartPlan  (user keeps, hazards, rounded lengths near a
                                                  boundary, LayerNorm statistics)
    StartPlan  -> rank             -> Ranking    (nodes by measured sensitivity; called by the
                                                  search only when the start plan fails)
    StartPlan  -> search           -> Searched   (the smallest FP32 set meeting the objective)

With a deployment engine (``--engine ort-cuda``), the start plan also keeps FP32 the nodes that
engine has no kernel for in the target precision (reason ``engine``), at the written opset.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import onnx
import onnx_ir as ir

from precision_doctor.diagnosis.causes.hazards import Hazard, scan_hazards
from precision_doctor.diagnosis.headroom.probe import fp32_statistics_nodes
from precision_doctor.diagnosis.lengths.guard import length_guard
from precision_doctor.errors import PlanError
from precision_doctor.formats import Precision
from precision_doctor.graph.external import small_in_memory
from precision_doctor.layerwise.candidates import (
    check_finite_reference,
    reference_factory,
    run_samples,
)
from precision_doctor.precision.conv_bias import FUSED
from precision_doctor.precision.plan import NodeDecision, PrecisionPlan, select_nodes
from precision_doctor.precision.rewrites import RewriteReport, apply_rewrites
from precision_doctor.precision.writer import PlanWriter, written_opset
from precision_doctor.precision.writer.validate import inferred_dtypes
from precision_doctor.repair.ranking import Ranker, Ranking
from precision_doctor.repair.rewrites_proof import prove_rewrites
from precision_doctor.runners.base import Runner
from precision_doctor.runners.emulator import EmulatorRunner
from precision_doctor.runners.kernels.engines import (
    Engine,
    conv_bias_of,
    engine_fp32_nodes,
    parse_engine,
)
from precision_doctor.runners.sessions import switched
from precision_doctor.runners.sessions.cpu_arena import shared_cpu
from precision_doctor.search.bisection import SearchResult, search_fp32_set
from precision_doctor.search.cost import compute_nodes
from precision_doctor.search.incremental import IncrementalEmulation, incremental_scope
from precision_doctor.search.near_ties import NearTie, at_risk_samples, find_near_ties
from precision_doctor.search.objective import Objective, Outputs, Score

Progress = Callable[[str, int, int], None]
REWRITE_HINT = "(after rewrites: folded BatchNorms and fused LayerNorms are gone)"

# The emulated search's sessions use ONNX Runtime's CPU memory arena: without it every large
# activation is a fresh mmap and half the CPU time is page faults. Measured 2026-11-24 on the
# idle 2-core machine, `fix det.onnx` (3 full images, default tolerance): 256 s wall (495 s CPU,
# 147M minor page faults), peak RSS 1.26 GB without; 133 s (253 s CPU, 20M faults), 1.97 GB
# with; the same 9 FP32 nodes. In this process (--jobs 1) the search's sessions share one arena
# instead (runners.sessions.cpu_arena: 1.2 GB peak); this per-session arena serves the --jobs
# workers.
SEARCH_ARENA = True
# Evaluate each plan on the CPU from the first segment it changes (``search.incremental``).
SEARCH_INCREMENTAL = True


@dataclass(frozen=True)
class FixRequest:
    """What ``fix`` was asked (the arguments of ``repair.pipeline.fix``, checked).

    Raises:
        PlanError: ``target`` is not FP16 or BF16.
    """

    model: onnx.ModelProto
    samples: Sequence
    target: Precision
    objective: Objective
    keep: Sequence[str] = ()
    force_low: Sequence[str] = ()
    rewrites: Sequence[str] | None = None
    keep_io_types: bool = True
    runner: Callable[..., Runner] | None = None
    max_evals: int = 150
    progress: Progress | None = None
    jobs: int = 1
    engine: str | None = None

    def __post_init__(self) -> None:
        if self.target not in (Precision.FP16, Precision.BF16):
            raise PlanError(f"fix writes FP16 or BF16 models; {self.target.value} is an engine "
                            "setting (TF32: check it with `diagnose --target tf32`)")
        parse_engine(self.engine)  # an unknown engine fails before any work

    @property
    def output_names(self) -> list[str]:
        """The graph outputs of the original model, in order."""
        return [o.name for o in self.model.graph.output]


@dataclass(frozen=True)
class Baseline:
    """The FP32 reference and the naive all-low model's score.

    Attributes:
        reference: ONNX Runtime CPU FP32 outputs, per output a list over samples (float32).
        objective: The objective with the samples' contexts and without near-tie samples.
        near_ties: Samples whose FP32 decision is within FP32 noise of flipping.
        naive: Outputs of the emulated all-low model.
        score_before: ``objective`` on ``naive``.
        seconds: Wall time of this stage.
    """

    reference: Outputs
    objective: Objective
    near_ties: tuple[NearTie, ...]
    naive: Outputs
    score_before: Score
    seconds: float


def measure_baseline(request: FixRequest) -> Baseline:
    """Run the FP32 reference and the naive all-low emulation on every sample.

    Raises:
        ReferenceError_: The FP32 reference produces NaN/Inf (nothing to meet).
        BackendError: ONNX Runtime fails on the model.
    """
    t0 = time.perf_counter()
    model, samples, names = request.model, request.samples, request.output_names
    reference = run_samples(reference_factory(model), samples, names)
    check_finite_reference(reference, [getattr(s, "name", str(i)) for i, s in enumerate(samples)])
    objective = request.objective.with_samples(samples)
    near_ties = find_near_ties(model, samples, reference, objective)
    if near_ties:
        objective = replace(objective, exclude=frozenset(t.index for t in near_ties))
    # one plan of the model as given; the search runs the rewritten copy (``rewrite``), whose
    # switched session this one would only delay
    with switched.one_plan():
        naive = run_samples(EmulatorRunner(model, PrecisionPlan(request.target),
                                           conv_bias=conv_bias_of(request.engine)),
                            samples, names)
    return Baseline(reference, objective, tuple(near_ties), naive,
                    objective.score(reference, naive), time.perf_counter() - t0)


@dataclass(frozen=True)
class Rewritten:
    """The FP32 model after the numerically safe rewrites (folded BatchNorms, fused
    LayerNorms), with the report of every rule; the search names this model's nodes."""

    model: onnx.ModelProto
    report: RewriteReport
    seconds: float


def rewrite(request: FixRequest, baseline: Baseline | None = None) -> Rewritten:
    """Apply the requested rewrites (``request.rewrites``; None = all) to a copy of the model,
    for ``request.target``; the rewrites that are not exact in FP32 (``saturate-constants``)
    are kept only when measured harmless (``repair.rewrites_proof``: the rewritten model in
    FP32 against ``baseline.reference``, run here when no baseline is given).

    Raises:
        BackendError: ONNX Runtime fails on the rewritten model.
    """
    t0 = time.perf_counter()
    model, report = apply_rewrites(request.model, request.rewrites, target=request.target)
    model, report = prove_rewrites(request.model, model, report, request.samples,
                                   request.output_names, request.target, request.rewrites,
                                   baseline.reference if baseline is not None else None)
    return Rewritten(model, report, time.perf_counter() - t0)


@dataclass(frozen=True)
class StartPlan:
    """The plan the search starts from and the nodes it may move to FP32.

    Attributes:
        plan: All-low with the nodes kept in FP32 before any evaluation: ``--keep`` (reason
            ``user``), parameters out of the format's range (``hazard``), the statistics of
            decomposed LayerNorms left unfused (``rewrite``) and the nodes the deployment
            engine has no kernel for (``engine``).
        hazards: The static hazards of the rewritten model.
        candidates: Compute nodes neither in ``plan``'s overrides nor in ``--force-low``.
    """

    plan: PrecisionPlan
    hazards: tuple[Hazard, ...]
    candidates: tuple[str, ...]


def plan_start(request: FixRequest, rewritten: Rewritten) -> StartPlan:
    """The start plan on the rewritten model.

    Raises:
        PlanError: ``keep``/``force_low`` name nothing in the rewritten model.
    """
    model = rewritten.model
    base = PrecisionPlan(request.target, rewritten.report.fp32_decisions())  # rewrites' FP32
    base = base.keep_fp32(select_nodes(model, request.keep, "--keep", REWRITE_HINT), "user",
                          "--keep")
    hazards = scan_hazards(model, request.target)
    for h in (h for h in hazards if h.kind == "parameter-out-of-range"):
        base = base.keep_fp32([h.node], "hazard", h.detail)
    for cone, detail in length_guard(model, request.samples, base):
        base = base.keep_fp32(cone, "length", detail)
    # layernorm-fp32-stats for a LayerNorm left unfused: FP32 statistics via the plan
    if request.rewrites is None or "layernorm-fp32-stats" in request.rewrites:
        feeds = [s.feeds for s in request.samples]
        for ln, stats in fp32_statistics_nodes(model, feeds).items():
            base = base.keep_fp32(stats, "rewrite", f"FP32 statistics of the decomposed "
                                  f"LayerNorm '{ln}' ((x - mean)^2 overflows FP16; not fused)")
    engine = parse_engine(request.engine)
    if engine is not None:
        base = keep_for_engine(model, base, engine, request.target, request.keep_io_types)
    out = set(select_nodes(model, request.force_low, "--force-low", REWRITE_HINT)) | set(
        base.overrides)  # forced low, or decided already
    candidates = tuple(n.name for n in compute_nodes(model) if n.name not in out)
    return StartPlan(base, tuple(hazards), candidates)


def keep_for_engine(model: onnx.ModelProto, plan: PrecisionPlan, engine: Engine,
                    target: Precision, keep_io_types: bool = True) -> PrecisionPlan:
    """``plan`` with the nodes ``engine`` has no ``target`` kernel for kept FP32 (reason
    ``engine``), judged at the opset the writer emits for the plan (keeping nodes FP32 can
    lower it, which changes the schema versions judged: repeated until nothing changes).

    Raises:
        UnsupportedModelError: Shape inference fails.
    """
    floats = {name for name, dtype in inferred_dtypes(model).items()
              if dtype == ir.DataType.FLOAT}
    for _ in range(4):
        opset = written_opset(model, plan, keep_io_types)
        new = {name: NodeDecision(Precision.FP32, "engine", detail)
               for name, detail in engine_fp32_nodes(model, engine, target, opset,
                                                     floats).items()
               if plan.precision_of(name) is not Precision.FP32}
        if not new:
            break
        plan = plan.with_overrides(new)
    return plan


@dataclass(frozen=True)
class Searched:
    """What the search found.

    Attributes:
        result: The smallest FP32 set found, its plan, score, trials and the final outputs.
        ranking: The ranking it searched (None when the start plan already passed).
        seconds: Wall time of the search without the ranking.
    """

    result: SearchResult
    ranking: Ranking | None
    seconds: float


@dataclass(frozen=True)
class PlanOpener:
    """Plan -> the runner (not entered) that evaluates it on the rewritten model: the CPU
    emulator, or ``runner`` on the written mixed-precision model. A module-level object (not a
    closure over the request, whose progress callback does not pickle), so that the spawned
    workers of a GPU pool receive it (``search.evalpool``).

    Attributes:
        model: The rewritten model.
        runner: Real-engine factory (``request.runner``); None for the emulator.
        keep_io_types: Writer option of the written model.
        conv_bias: The deployment engine's convolution bias model for the emulator
            (``precision.conv_bias``; ``separate`` for ``--engine ort-cuda``).
    """

    model: onnx.ModelProto
    runner: Callable[..., Runner] | None = None
    keep_io_types: bool = True
    conv_bias: str = FUSED
    incremental: IncrementalEmulation | None = field(default=None, compare=False)
    writer: PlanWriter | None = field(default=None, compare=False)  # one model per plan

    def __call__(self, plan: PrecisionPlan, threads: int = 0) -> Runner:
        if self.runner is None and self.incremental is not None and not threads:
            return self.incremental.runner(plan)
        if self.runner is None:  # the arena pays here: each evaluation runs every sample
            return EmulatorRunner(self.model, plan, intra_op_threads=threads,
                                  cpu_mem_arena=SEARCH_ARENA, conv_bias=self.conv_bias)
        written = (self.writer or PlanWriter(self.model))(plan, self.keep_io_types,
                                                          validate=False)[0]
        return self.runner(written, intra_op_threads=threads) if threads \
            else self.runner(written)


def open_plan(request: FixRequest, model: onnx.ModelProto, plan: PrecisionPlan,
              threads: int = 0) -> Runner:
    """The runner (not entered) that evaluates ``plan`` on the rewritten ``model``
    (``PlanOpener``)."""
    return PlanOpener(model, request.runner, request.keep_io_types,
                      conv_bias_of(request.engine))(plan, threads)


def search(request: FixRequest, baseline: Baseline, rewritten: Rewritten,
           start: StartPlan) -> Searched:
    """Search the smallest set of candidates to keep in FP32 (``search.bisection``).

    Raises:
        TargetNotMetError: Not even all-FP32 meets the objective.
        BackendError: A runner fails.
    """
    t0 = time.perf_counter()
    ranker = Ranker(rewritten.model, request.samples, baseline.objective, request.target,
                    request.engine, start.plan, start.hazards, start.candidates,
                    request.output_names)

    def screen(start_outputs: Outputs) -> list[int] | None:
        return at_risk_samples(baseline.reference, start_outputs, baseline.objective)

    # in this process, the evaluations' sessions reuse each other's memory (cpu_arena), and the
    # next evaluation's runner opens while one runs, where two of them fit in memory
    jobs = request.jobs
    prefetch = jobs <= 1 and small_in_memory(rewritten.model)
    conv_bias = conv_bias_of(request.engine)
    on = SEARCH_INCREMENTAL and request.runner is None and jobs <= 1  # the emulator, here
    with shared_cpu() if jobs <= 1 else nullcontext(), \
            incremental_scope(rewritten.model, request.target, request.samples, conv_bias,
                              SEARCH_ARENA, on) as incremental:
        writer = PlanWriter(rewritten.model) if request.runner is not None else None
        result = search_fp32_set(PlanOpener(rewritten.model, request.runner,
                                            request.keep_io_types, conv_bias, incremental,
                                            writer), request.samples,
                                 baseline.reference, baseline.objective, start.plan, ranker,
                                 request.max_evals, request.progress, jobs, screen, prefetch,
                                 regions=ranker.regions)
    first = replace(ranker.done[0], seconds=ranker.seconds) if ranker.done else None
    return Searched(result, first, time.perf_counter() - t0 - ranker.seconds)
