"""When the written model fails its verification: search again, judging each plan by the runner
that would verify it, on the model the writer writes for it.

The search evaluates plans with the CPU emulator, on segments of the graph where the cuts alone
change nothing in the all-FP32 plan (``search.incremental``). Neither is the written model on
the verifying engine: ONNX Runtime fuses the whole written graph by patterns that the plan's
own Casts make or break, and the cut check sees the all-FP32 plan only. On the graph
Q -> DQ -> MatMul <- DQ(int8 weights) (``tests/fuzz/test_regressions.py``) every node in FP32
runs as one ``MatMulIntegerToFloat``, exact on a CPU with AVX512-VNNI, so the cuts pass their
check there; with the activation's Q and DQ in FP16 the rounding Casts break that pattern and
``DQ(weights) -> MatMul`` becomes ``MatMulNBits``, which quantizes its float input to 8 bits per
block, while the segments (each node alone) run the MatMul in float. Measured 2026-12-06 on a
VNNI Xeon with ONNX Runtime 1.30 and 1.32 (relative L2, samples 0 and 1): the plan (w, y in
FP32) scores 0.0005 and 0.0016 on segments, 0.0037 and 0.0217 written, so ``fix`` failed at
tolerance 1e-2 where its own candidates dq, w, y pass at 0.

So ``fix`` keeps one invariant: where the plan with every candidate in FP32 passes
verification, its answer passes verification. ``recheck`` runs when the verification fails:

1. the same search (``search.bisection``: grow, then ddmin) from the start plan, each plan
   written (``precision.writer.PlanWriter``, the engine's nodes kept as ``write`` keeps them)
   and run by the runner ``verify`` chooses for that written model
   (``runners.verify.verifying_runner``: the choice depends on the model, ONNX Runtime CPU
   only where it has a kernel for every FP16 node, else the written model emulated exactly),
   the first plan's nodes ranked first; its answer passed on every sample of that runner;
2. that answer written and verified again (``repair.verify``);
3. where not even every candidate in FP32 passes that way (``TargetNotMetError``), or the
   answer's verification fails after all (an engine whose runs differ), the plan with
   every candidate node in FP32 (``search.invariant.all_fp32_plan``), written and verified:
   returned when it passes, else the first verification stands and ``fix`` fails.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import onnx

from precision_doctor.errors import TargetNotMetError
from precision_doctor.formats import Precision
from precision_doctor.precision.conv_bias import FUSED
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.precision.writer import PlanWriter
from precision_doctor.repair.stages import (
    Baseline,
    FixRequest,
    Progress,
    Rewritten,
    Searched,
    StartPlan,
    keep_for_engine,
)
from precision_doctor.repair.verify import Verification, Written, verify, write
from precision_doctor.runners.base import Runner
from precision_doctor.runners.kernels.engines import conv_bias_of, parse_engine
from precision_doctor.runners.verify import verifying_runner
from precision_doctor.search.bisection import SearchResult, search_fp32_set
from precision_doctor.search.invariant import all_fp32_plan

__all__ = ["Rechecked", "WrittenOpener", "recheck", "recheck_ranking"]


@dataclass(frozen=True)
class WrittenOpener:
    """Plan -> the runner (not entered) that ``repair.verify.verify`` would verify the model
    ``repair.verify.write`` writes for it with (``runners.verify.verifying_runner``).

    Attributes:
        model: The rewritten FP32 model (the plan's node names).
        target: The plan's low precision (FP16 or BF16).
        runner: The search's ``--runner`` factory (``FixRequest.runner``), the only verifier
            when given; None: the default choice.
        keep_io_types: Writer option.
        engine: The deployment engine (``--engine``; None: none): its nodes without a kernel
            in ``target`` are kept FP32 as ``write`` keeps them.
        conv_bias: The engine's convolution bias model (``precision.conv_bias``).
        writer: One ``PlanWriter`` of ``model`` for every plan (its inferred types and
            decisions are reused); None: a new one per plan.

    Calling it with ``threads`` (``search.evalpool``'s worker form) ignores them: the second
    search runs in this process (``jobs=1``). The call raises ``UnsupportedModelError`` where
    the writer cannot type the written model.
    """

    model: onnx.ModelProto
    target: Precision
    runner: Callable[..., Runner] | None = None
    keep_io_types: bool = True
    engine: str | None = None
    conv_bias: str = FUSED
    writer: PlanWriter | None = field(default=None, compare=False)

    def __call__(self, plan: PrecisionPlan, threads: int = 0) -> Runner:
        engine = parse_engine(self.engine)
        if engine is not None:
            plan = keep_for_engine(self.model, plan, engine, self.target, self.keep_io_types)
        written = (self.writer or PlanWriter(self.model))(plan, self.keep_io_types,
                                                          validate=False)[0]
        requested = self.runner(written) if self.runner is not None else None
        return verifying_runner(written, requested, conv_bias=self.conv_bias)


@dataclass(frozen=True)
class Rechecked:
    """What ``recheck`` did.

    Attributes:
        searched: The search whose plan is written (its trials follow the first search's,
            named ``verified-<stage>``); the first search where nothing better was found.
        written: Its written model.
        verified: Its verification (the first one where nothing better was found).
        first: The first verification, of the emulated search's plan.
        warnings: What the user should know: the first plan failed, and what replaced it.
        seconds: Wall time of the recheck (0 when verification passed at once).
    """

    searched: Searched
    written: Written
    verified: Verification
    first: Verification
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0


def recheck_ranking(kept: Sequence[str], ranked: Sequence[str], candidates: Sequence[str]
                    ) -> list[str]:
    """The ranking of the second search: the first plan's nodes, then the rest of the first
    ranking, then any candidate it left out (so the full prefix is every candidate)."""
    out = list(dict.fromkeys(kept))
    seen, allowed = set(out), set(candidates)
    for name in [*ranked, *candidates]:
        if name not in seen and name in allowed:
            out.append(name)
            seen.add(name)
    return out


def recheck(request: FixRequest, baseline: Baseline, rewritten: Rewritten, start: StartPlan,
            searched: Searched, written: Written, verified: Verification) -> Rechecked:
    """Search again, judged by the verifying runner, where the written model fails (module
    docstring); unchanged where it passes.

    Raises:
        BackendError: The verifying runner fails on a written model.
        UnsupportedModelError: The writer or shape inference fails on a written model.
    """
    if verified.score.passed:
        return Rechecked(searched, written, verified, verified)
    t0 = time.perf_counter()
    first = searched.result
    runner = verified.runner
    failed = (f"the search's plan ({len(first.kept)} nodes in FP32) meets the target as the "
              f"search evaluated it (score {first.score.value:.4g}), but {runner} on the "
              f"written model scores {verified.score.value:.4g}: the engine computes the "
              "written graph differently (its kernels, or fusions the plan's Casts make or "
              "break)")
    ranked = searched.ranking.nodes if searched.ranking is not None else ()
    opener = WrittenOpener(rewritten.model, request.target, request.runner,
                           request.keep_io_types, request.engine, conv_bias_of(request.engine),
                           PlanWriter(rewritten.model))
    try:
        again = search_fp32_set(opener, request.samples, baseline.reference,
                                baseline.objective, start.plan,
                                recheck_ranking(first.kept, ranked, start.candidates),
                                request.max_evals, _stage(request), jobs=1)
    except TargetNotMetError as exc:
        again = None
        best = exc.context.get("best")
        why = ("judged by the runner that verifies each written model, not even every "
               "candidate in FP32 meets the target" + (f" (best score {best:.4g})"
                                                        if isinstance(best, float) else ""))
    if again is not None:
        result = _merged(first, again)
        new = Searched(result, searched.ranking, searched.seconds)
        new_written = write(request, rewritten, new)
        new_verified = verify(new_written, request, baseline, new)
        if new_verified.score.passed:
            return Rechecked(new, new_written, new_verified, verified, (
                f"{failed}; searched again judging each plan by the runner that verifies its "
                f"written model: {len(again.kept)} nodes in FP32 pass, verified by "
                f"{new_verified.runner} at {new_verified.score.value:.4g}",),
                time.perf_counter() - t0)
        why = (f"the second search's plan scored {again.score.value:.4g} as it evaluated it "
               f"and {new_verified.score.value:.4g} when verified by {new_verified.runner}")
    return _every_candidate(request, baseline, rewritten, start, searched, written, verified,
                            f"{failed}; {why}", t0)


def _every_candidate(request: FixRequest, baseline: Baseline, rewritten: Rewritten,
                     start: StartPlan, searched: Searched, written: Written,
                     verified: Verification, why: str, t0: float) -> Rechecked:
    """The plan with every candidate in FP32, written and verified: returned where it passes,
    else the first verification."""
    plan = all_fp32_plan(rewritten.model, start.plan)
    kept = tuple(n for n in plan.fp32_nodes() if n not in set(start.plan.fp32_nodes()))
    first = searched.result
    result = replace(first, plan=plan, kept=kept, score=verified.score, final_outputs=None)
    full = Searched(result, searched.ranking, searched.seconds)
    full_written = write(request, rewritten, full)
    full_verified = verify(full_written, request, baseline, full)
    seconds = time.perf_counter() - t0
    if full_verified.score.passed:
        result = replace(result, score=full_verified.score)
        return Rechecked(replace(full, result=result), full_written, full_verified, verified, (
            f"{why}; every candidate node in FP32 ({len(kept)} nodes) passes, verified at "
            f"{full_verified.score.value:.4g}",), seconds)
    return Rechecked(searched, written, verified, verified, (
        f"{why}; with every candidate node in FP32 {full_verified.runner} scores "
        f"{full_verified.score.value:.4g}. Decision metrics at exact thresholds depend on the "
        "engine's exact rounding: search with the engine you deploy on (--runner ort:cpu, "
        "ort:cuda)",), seconds)


def _merged(first: SearchResult, again: SearchResult) -> SearchResult:
    """``again`` with the first search's trials before its own (``verified-<stage>``); its
    outputs are the verifying runner's, not the emulator's, so they are not passed on."""
    trials = (*first.trials, *(replace(t, stage=f"verified-{t.stage}") for t in again.trials))
    return replace(again, trials=trials, final_outputs=None)


def _stage(request: FixRequest) -> Progress | None:
    """``request.progress`` under the stage name ``verified-search`` (None without one)."""
    progress = request.progress
    if progress is None:
        return None
    return lambda stage, done, total: progress(f"verified-{stage}", done, total)
