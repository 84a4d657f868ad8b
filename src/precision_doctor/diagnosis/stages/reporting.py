"""The last stage: every stage's result gathered into the ``DiagnosisReport``."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import onnx

from precision_doctor.diagnosis.causes.findings import Finding
from precision_doctor.diagnosis.lengths.records import LengthReport
from precision_doctor.diagnosis.report import DiagnosisReport
from precision_doctor.diagnosis.stages.assessing import Assessed
from precision_doctor.diagnosis.stages.causes import Causes
from precision_doctor.diagnosis.stages.comparing import Compared, Read
from precision_doctor.diagnosis.stages.localizing import Localized
from precision_doctor.diagnosis.stages.request import DiagnoseRequest, SampleLike
from precision_doctor.diagnosis.stages.runs import CandidateRun, Reference
from precision_doctor.graph.load import opset_of
from precision_doctor.graph.source import Source, sources
from precision_doctor.layerwise.candidates import Candidate, reference_name


def build_report(request: DiagnoseRequest, reference: Reference, candidate: CandidateRun,
                 compared: Compared, read: Read, localized: Localized, causes: Causes,
                 assessed: Assessed, lengths: LengthReport | None = None) -> DiagnosisReport:
    """The ``DiagnosisReport`` of the stages; ``timings_s`` in stage order (reference,
    candidate, noise_floor, layerwise, transformer, the explanation's, rewritten)."""
    timings = {"reference": reference.seconds, "candidate": candidate.seconds,
               "noise_floor": compared.seconds}
    if localized.seconds is not None:
        timings["layerwise"] = localized.seconds
    timings.update(causes.seconds)
    timings["rewritten"] = assessed.seconds
    if lengths is not None:
        timings["lengths"] = lengths.seconds
    explanation, jump, model = causes.explanation, causes.jump, request.model
    explained = explanation.explained
    if lengths is not None and lengths.cured:  # its measured cure restores every shape
        explained = 1.0
    return DiagnosisReport(
        verdict=compared.verdict, model=model_info(model, request.model_path),
        target=request.target.value, reference=reference_name(),
        candidate=request.candidate.name,
        samples=sample_info(request.samples),
        outputs=read.outputs, findings=with_sources(explanation.findings, model),
        hazards=causes.hazards,
        layerwise=localized.layerwise, noise=compared.floor,
        emulation=emulation_info(request.candidate, model),
        timings_s={k: round(v, 3) for k, v in timings.items()}, warnings=assessed.warnings,
        assessment=assessed.assessment, explained_share=explained,
        decision_flips=read.flips, decisions=read.summaries, rewritten=assessed.rewritten,
        largest_jump=jump.record.tensor if jump is not None else None,
        recording=localized.recording, transformer=causes.transformer,
        attribution=explanation.attribution.to_dict() if explanation.attribution else None,
        joint_cause=explanation.joint.to_dict() if explanation.joint else None,
        finding_groups=explanation.groups, lengths=lengths,
        sources=named_sources(model, localized.layerwise, explanation.joint, lengths))


def sample_info(samples: Sequence[SampleLike]) -> tuple[dict, ...]:
    """The report's ``samples``: each sample's name and input shapes."""
    return tuple({"name": s.name, "shapes": {k: list(v.shape) for k, v in s.feeds.items()}}
                 for s in samples)


def with_sources(findings: Sequence[Finding], model: onnx.ModelProto
                 ) -> tuple[Finding, ...]:
    """``findings`` with the Python line and module of their node (``graph.source``), where
    the model carries the exporter's metadata or TorchScript node names."""
    known = sources(model)
    if not known:
        return tuple(findings)
    return tuple(replace(f, source=known.get(f.node)) for f in findings)


def named_sources(model: onnx.ModelProto, layerwise: Any, joint: Any,
                  lengths: LengthReport | None) -> dict[str, Source]:
    """Node -> ``Source`` (``graph.source``) of every node the report names outside its
    findings: the layerwise records', the joint cause's members' and the length decisions';
    empty when the model carries no exporter metadata nor TorchScript node names."""
    known = sources(model)
    if not known:
        return {}
    named = [r.node for r in layerwise.records] if layerwise is not None else []
    named += [node for _, node in joint.members] if joint is not None else []
    named += [d.node for d in lengths.decisions] if lengths is not None else []
    return {n: known[n] for n in named if n in known}


def model_info(model: onnx.ModelProto, path: str | None) -> dict:
    """The report's ``model`` section: path, opset, node count, sha256 (first 16 hex digits
    of the file) and producer."""
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16] if path and Path(
        path).is_file() else None
    return {"path": path, "opset": opset_of(model), "nodes": len(model.graph.node),
            "sha256": digest, "producer": model.producer_name or None}


def emulation_info(candidate: Candidate, model: onnx.ModelProto) -> dict | None:
    """The report's ``emulation`` section of an emulated candidate (None otherwise)."""
    if candidate.plan is None:
        return None
    from precision_doctor.precision.conv_bias import SEPARATE
    from precision_doctor.precision.emulate import describe_method

    plan = candidate.plan
    bias = ("added after the convolution's output is rounded, then rounded again (ONNX Runtime "
            "CUDA, --engine ort-cuda)" if candidate.conv_bias == SEPARATE else
            "added before the convolution's one rounding (TensorRT's fused bias; for ONNX "
            "Runtime CUDA use --engine ort-cuda)")
    return {"default": plan.default.value, "fp32_nodes": plan.fp32_nodes(),
            "rounding": describe_method(model, plan.default), "conv_bias": bias}


__all__ = ["build_report", "emulation_info", "model_info", "named_sources", "sample_info",
           "with_sources"]
