"""Find the causes: the all-FP32 invariant, static hazards, transformer headroom, findings
with measured cures (``diagnosis.causes.explain``) and the largest error jump."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import onnx

from precision_doctor.diagnosis.causes.cures import layerwise_regions
from precision_doctor.diagnosis.causes.engine_constants import engine_verdicts
from precision_doctor.diagnosis.causes.explain import Explanation, explain
from precision_doctor.diagnosis.causes.hazards import Hazard, scan_hazards
from precision_doctor.diagnosis.lengths.records import LengthReport
from precision_doctor.diagnosis.report import DiagnosisReport
from precision_doctor.diagnosis.stages.comparing import Compared, Read
from precision_doctor.diagnosis.stages.localizing import Localized
from precision_doctor.diagnosis.stages.request import DiagnoseRequest, SampleLike
from precision_doctor.diagnosis.stages.runs import CandidateRun, Reference
from precision_doctor.formats import FORMATS, Precision
from precision_doctor.graph.outputs import producer_inputs
from precision_doctor.layerwise.gain import Gain, largest_jump
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners.kernels.engines import conv_bias_of
from precision_doctor.runners.sessions import switched
from precision_doctor.search.invariant import DEFAULT_BOUND, check_all_fp32

ATTRIBUTION_BUDGET = 4.0  # attribution wall time: 4x the plain runs and the layerwise pass


@dataclass(frozen=True)
class Causes:
    """What explains the error.

    Attributes:
        hazards: The static hazard scan.
        explanation: Findings with measured cures, attribution, joint causes, groups.
        jump: The largest local error gain (None without layerwise).
        transformer: Per-block FP16 headroom of a transformer (``diagnosis.headroom``), or None.
        seconds: Wall time per sub-stage (``transformer``, then ``explanation.seconds``).
    """

    hazards: tuple[Hazard, ...]
    explanation: Explanation
    jump: Gain | None
    transformer: dict | None
    seconds: dict[str, float]


def find_causes(request: DiagnoseRequest, reference: Reference, candidate: CandidateRun,
                compared: Compared, read: Read, localized: Localized,
                lengths: LengthReport | None = None) -> Causes:
    """The causes of the candidate's error, each established by a measured cure.

    Before any cure is measured on a failing emulated candidate, the plan with every candidate
    node in FP32 must be the FP32 model (``search.invariant``, on the first sample).

    Raises:
        InvariantError: A node the plan cannot reach still rounds (a tool defect).
        BackendError: An emulated evaluation fails.
    """
    model, target, cand = request.model, request.target, request.candidate
    out_names = request.output_names
    floor = compared.floor
    if cand.plan is not None and request.measure_impact and compared.verdict == "fail" \
            and cand.recorded is None:  # before attribution: search.invariant
        floor_max = max(floor.per_output.values(), default=0.0) if floor else 0.0
        with switched.one_plan():  # the first sample is enough
            check_all_fp32(model, cand.plan, request.samples[0].feeds,
                           {n: reference.outputs[n][0] for n in out_names}, cand.conv_bias,
                           max(DEFAULT_BOUND, 2.0 * floor_max))
    lw = localized.layerwise
    inputs_of = producer_inputs(model)
    hazards = scan_hazards(model, target)
    regions = layerwise_regions(model, lw) if lw is not None else {}
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    transformer = transformer_section(model, request.samples, target, request.stress)
    seconds["transformer"] = time.perf_counter() - t0
    budget = ATTRIBUTION_BUDGET * (reference.seconds + candidate.seconds
                                   + (localized.seconds or 0.0))
    explanation = explain(model, request.samples, target, cand, lw, hazards,
                          {o.name: (o.metrics.rel_l2, o.passed) for o in read.outputs},
                          reference.outputs, candidate.outputs, read.summaries, inputs_of,
                          regions, compared.expected, request.progress, budget,
                          request.measure_impact,
                          lengths is not None and lengths.reading == "near-tie"
                          and lengths.cured)
    seconds.update(explanation.seconds)
    jump = None
    if lw is not None:  # an Inf birth measured harmless (minor) is not the jump
        harmless = {n for f in explanation.findings if f.group == "minor"
                    and f.impact is not None for n in f.nodes}
        jump = largest_jump(lw.records, inputs_of, FORMATS[target].unit_roundoff, lw.threshold,
                            harmless)
    return Causes(tuple(hazards), explanation, jump, transformer, seconds)


def engine_stage(request: DiagnoseRequest, reference: Reference, report: DiagnosisReport,
                 plan: PrecisionPlan | None, engine: str | None) -> DiagnosisReport:
    """What each engine makes of an out-of-range constant: the report's findings with the
    per-engine verdict (``diagnosis.causes.engine_constants``; one emulated evaluation with the
    constants clamped as TensorRT does, when the diagnosis fails), and ``engine``'s own.

    Args:
        plan: The emulated plan whose default is the target (None: no verdicts).
        engine: The deployment engine (``--engine``), or None.

    Raises:
        BackendError: The clamped emulation fails.
    """
    if plan is None:
        return report
    findings = engine_verdicts(
        request.model, request.samples, plan, reference.outputs,
        {o.name: o.tolerance.rel_l2 for o in report.outputs if o.tolerance.rel_l2},
        report.findings, engine, conv_bias_of(engine), report.verdict != "pass")
    return replace(report, findings=tuple(findings))


def transformer_section(model: onnx.ModelProto, samples: Sequence[SampleLike],
                        target: Precision, stress: bool) -> dict | None:
    """Per-block FP16 headroom (``diagnosis.headroom.probe``) plus the stress probe, as a dict."""
    from precision_doctor.diagnosis.headroom.probe import analyze_transformer
    from precision_doctor.diagnosis.headroom.stress import stress_probe

    feeds: list[Mapping] = [s.feeds for s in samples]
    report = analyze_transformer(model, feeds)
    if report is None:
        return None
    if stress and target is Precision.FP16:
        report = report.with_stress(stress_probe(model, feeds, report).to_dict())
    return report.to_dict()


__all__ = ["ATTRIBUTION_BUDGET", "Causes", "engine_stage", "find_causes",
           "transformer_section"]
