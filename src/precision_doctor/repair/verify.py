"""The last stages of ``fix``: write the strongly typed model the search found, and verify it
against the FP32 reference.

    Searched -> write  -> Written       (the mixed-precision model, validated)
    Written  -> verify -> Verification  (the written model's outputs, what ran it and why, its
                                         score)

The runner that verifies is chosen by ``runners.verify``: the search's ``--runner``; for a BF16
model ONNX Runtime CUDA when present, ONNX Runtime CPU when it has the BF16 kernels, else the
exact emulation of the written model (ONNX Runtime CPU has no BF16 Conv/MatMul kernels); for
any other model ONNX Runtime CPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import onnx

from precision_doctor.layerwise.candidates import run_samples
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.precision.writer import write_mixed_precision
from precision_doctor.precision.writer.report import WriterReport
from precision_doctor.repair.stages import (
    Baseline,
    FixRequest,
    Rewritten,
    Searched,
    keep_for_engine,
)
from precision_doctor.runners.base import Runner
from precision_doctor.runners.emulator import EmulatorRunner
from precision_doctor.runners.kernels.engines import (
    conv_bias_of,
    describe_engine_nodes,
    parse_engine,
)
from precision_doctor.runners.verify import (
    VerifiedBy,
    VerifyingRunner,
    requested_verification,
    verifying_runner,
)
from precision_doctor.search.objective import Outputs, Score


@dataclass(frozen=True)
class Written:
    """The strongly typed mixed-precision model.

    Attributes:
        model: The written model (validated with ``onnx.checker``, shape inference and an ONNX
            Runtime session: ``precision.writer``).
        report: The writer's report (Casts, nodes it kept in FP32 beyond the plan).
        source: The rewritten FP32 model it was written from (the plan's node names).
        plan: The plan the search found, with any node the deployment engine has no kernel
            for at the written opset kept FP32 (the writer may keep more in FP32:
            ``report.effective_plan()``).
        seconds: Wall time of this stage.
    """

    model: onnx.ModelProto
    report: WriterReport
    source: onnx.ModelProto
    plan: PrecisionPlan
    seconds: float


def write(request: FixRequest, rewritten: Rewritten, searched: Searched) -> Written:
    """Write the rewritten model with the search's plan (``request.keep_io_types``).

    Raises:
        UnsupportedModelError: The written model fails shape inference or ``onnx.checker``.
        BackendError: ONNX Runtime CPU cannot load the written model.
    """
    t0 = time.perf_counter()
    plan = searched.result.plan
    engine = parse_engine(request.engine)
    if engine is not None:  # the search's FP32 nodes may have lowered the opset written
        plan = keep_for_engine(rewritten.model, plan, engine, request.target,
                               request.keep_io_types)
    model, report = write_mixed_precision(rewritten.model, plan, request.keep_io_types)
    return Written(model, report, rewritten.model, plan, time.perf_counter() - t0)


def engine_note(request: FixRequest, written: Written) -> str:
    """What writing for the deployment engine changed, in words ("" without ``--engine``)."""
    engine = parse_engine(request.engine)
    if engine is None:
        return ""
    ops = {n.name: n.op_type for n in written.source.graph.node}
    counts: dict[str, int] = {}
    for name, decision in written.plan.overrides.items():
        if decision.reason == "engine":
            counts[ops.get(name, "?")] = counts.get(ops.get(name, "?"), 0) + 1
    return describe_engine_nodes(engine, request.target, counts)


@dataclass(frozen=True)
class Verification:
    """What verified the written model, and what it measured.

    Attributes:
        runner: The runner whose outputs are ``outputs`` (``verified_by.runner``):
            ``ort-cpu-fixed``, ``ort-cuda-fixed``, ``emulate-written-bf16`` or the search's
            ``--runner``.
        verified_by: That runner, why it was chosen and why the others were not.
        reused_search: True when ``outputs`` are the search's final evaluation, which ran this
            very model with the search's ``--runner``, so it was not run again.
        outputs: The written model's outputs, per output a list over samples (float32).
        emulated: Outputs of the CPU emulation of the effective plan on the rewritten model
            (the gap to ``outputs`` is the engine's rounding against the emulator's).
        score: The objective on ``outputs``: the verdict of ``fix``.
        seconds: Wall time of this stage.
    """

    runner: str
    verified_by: VerifiedBy
    reused_search: bool
    outputs: Outputs
    emulated: Outputs
    score: Score
    seconds: float


def written_runner(written: Written, request: FixRequest
                   ) -> tuple[Runner | None, str, VerifyingRunner]:
    """The runner that verifies the written model (``runners.verify.verifying_runner``): the
    search's ``--runner`` on it when given (also returned first), with the deployment
    engine's note (``engine_note``); not yet entered. ``verify`` and the held-out check
    (``repair.holdout``) run the written model with it.

    Raises:
        UnsupportedModelError: Shape inference cannot type the written model.
    """
    requested = request.runner(written.model) if request.runner is not None else None
    note = engine_note(request, written)
    return requested, note, verifying_runner(written.model, requested, engine=note,
                                             conv_bias=conv_bias_of(request.engine))


def verify(written: Written, request: FixRequest, baseline: Baseline,
           searched: Searched) -> Verification:
    """Run the written model on every sample and score it against the FP32 reference
    (``baseline``); emulate the effective plan beside it.

    Outputs the search already has are reused: its final evaluation, when the search ran the
    written model with the ``--runner`` that verifies it, or the emulated plan, when it equals
    the effective plan.

    Raises:
        BackendError: The verifying runner fails on the written model.
        UnsupportedModelError: Shape inference cannot type the written model.
    """
    t0 = time.perf_counter()
    samples, names, final = request.samples, request.output_names, searched.result.final_outputs
    requested, note, runner = written_runner(written, request)
    conv_bias = conv_bias_of(request.engine)
    same = written.plan.fp32_nodes() == searched.result.plan.fp32_nodes()
    if requested is not None and final is not None and same:
        outputs, reused = final, True  # the search's final evaluation ran this very model
        verified_by = requested_verification(requested, reused=True, engine=note)
    else:
        outputs, reused = run_samples(runner, samples, names), False
        assert runner.verified_by is not None
        verified_by = runner.verified_by
    effective = written.report.effective_plan()
    if (request.runner is None and final is not None and same
            and effective.fp32_nodes() == written.plan.fp32_nodes()):
        emulated = final  # the search's final evaluation ran this plan
    else:
        emulated = run_samples(EmulatorRunner(written.source, effective, conv_bias=conv_bias),
                               samples, names)
    score = baseline.objective.score(baseline.reference, outputs)
    return Verification(verified_by.runner, verified_by, reused, outputs, emulated, score,
                        time.perf_counter() - t0)
