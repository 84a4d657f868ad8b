"""``diagnose`` with a recorded candidate: load and match the recording, compare its tensors,
and build the report's ``recording`` section (what was recorded, by which runner, what is
missing, and the emulated-vs-recorded cross-check)."""

from __future__ import annotations

import os
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.audit.buildlog import read_build_log
from precision_doctor.errors import InputError
from precision_doctor.formats import Precision
from precision_doctor.inputs.recording import Recording, load_recording, match_samples
from precision_doctor.layerwise.candidates import (
    Candidate,
    emulated,
    recorded,
    reference_factory,
)
from precision_doctor.layerwise.recorded import (
    RecordedLayerwise,
    compare_recorded,
    cross_check_table,
)
from precision_doctor.precision.plan import PrecisionPlan


def load_recorded(spec: str | os.PathLike, log: str | os.PathLike | None = None) -> Recording:
    """The recording at ``spec``, with the TensorRT version and build settings (GPU, FP16,
    TF32, strongly typed, flagged warnings) read from the engine's build ``log``.

    Raises:
        InputError / DataFormatError: Unreadable recording or log.
    """
    if log is None:
        return load_recording(spec)
    build = read_build_log(log)
    settings = {"log": str(log), "gpu": build.gpu, "fp16": build.fp16, "tf32": build.tf32,
                "tf32_evidence": build.tf32_evidence, "strongly_typed": build.strongly_typed,
                "flagged": [f"line {e.line}: {e.text[:200]}" for e in build.flagged()]}
    return load_recording(spec, tensorrt_version=build.tensorrt_version, settings=settings)


def recorded_candidate(results: str | os.PathLike | Recording, model: onnx.ModelProto,
                       sample_names: Sequence[str], target: Precision,
                       cross_check: PrecisionPlan | None = None,
                       log: str | os.PathLike | None = None) -> Candidate:
    """The candidate replaying ``results``, matched to the samples.

    Args:
        results: A recording, or what ``load_recording`` reads (``file.json[:RUNNER]``...).
        model: The diagnosed model.
        sample_names: Names of the ``--data`` samples, in order.
        target: Precision of the cross-check emulation (default plan: all nodes in it).
        cross_check: Emulator plan for the cross-check (default ``PrecisionPlan(target)``).
        log: The engine's build log (``audit.buildlog``): version and settings.

    Raises:
        InputError: Too few iterations, or a graph output is not in the recording.
        DataFormatError: Unreadable recording.
    """
    rec = results if isinstance(results, Recording) else load_recorded(results, log)
    rec = match_samples(rec, sample_names)
    have = set(rec.tensor_names())
    absent = [o.name for o in model.graph.output if o.name not in have]
    if absent:
        shown = ", ".join(sorted(have)[:8]) + (" ..." if len(have) > 8 else "")
        raise InputError(
            f"{rec.source}: runner {rec.runner!r} recorded no output {absent[0]!r} of the model "
            f"(recorded: {shown}). Record the same model (its outputs keep their ONNX names) or "
            "pick another runner with FILE:RUNNER.", file=rec.source, tensor=absent[0])
    plan = cross_check if cross_check is not None else PrecisionPlan(target)
    return recorded(rec, model, plan)


def check_recorded_outputs(ref: Mapping[str, list[np.ndarray]],
                           cand: dict[str, list[np.ndarray]], sample_names: Sequence[str],
                           source: str) -> None:
    """Every recorded output has the reference's shape on every sample.

    Raises:
        InputError: A shape differs: the recording was not made on these inputs (or in order).
    """
    for name, arrays in ref.items():
        for i, (r, c) in enumerate(zip(arrays, cand[name])):
            if r.shape != c.shape and r.size != c.size:
                raise InputError(
                    f"{source}: output {name!r} of iteration {i} has shape {list(c.shape)} but "
                    f"the reference computes {list(r.shape)} for sample {sample_names[i]!r}: "
                    "the recording was not made on these inputs, or not in this order. Record "
                    "with --load-inputs on the file given to --data.", file=source, tensor=name)
            if r.shape != c.shape:
                cand[name][i] = c.reshape(r.shape)


def recorded_layerwise(model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]],
                       candidate: Candidate, target: Precision, threshold: float,
                       budget_bytes: int, layerwise: bool,
                       progress: Callable[[int, int], None] | None = None) -> RecordedLayerwise:
    """``compare_recorded`` for a recorded candidate: every recorded ONNX tensor with
    ``layerwise``, else the graph outputs only (for the output cross-check)."""
    assert candidate.recorded is not None
    src = candidate.recorded
    emu = emulated(src.cross_check).factory if src.cross_check is not None else None
    outputs = None if layerwise else [o.name for o in model.graph.output]
    return compare_recorded(model, feeds, src.recording.iterations, reference_factory, emu,
                            target, threshold, budget_bytes, outputs, progress)


def recording_section(candidate: Candidate, result: RecordedLayerwise,
                      output_errors: Mapping[str, float]) -> dict:
    """The report's ``recording`` section.

    Returns:
        ``{"statement", "source", "format", "runner", "engine", "runners_in_file",
        "tensorrt_version", "iterations", "tensors": {name: {dtype, shape}}, "notes",
        "recorded_tensors", "matched_tensors", "missing": {tensor: reason},
        "missing_by_reason": {reason kind: count}, "unmatched": [name], "cross_check": {...}}``
        (``cross_check`` as ``layerwise_recorded.cross_check_table``).
    """
    assert candidate.recorded is not None
    rec = candidate.recorded.recording
    info = rec.describe()
    version = f"TensorRT {rec.tensorrt_version}" if rec.tensorrt_version else (
        "TensorRT version not recorded in the file" if rec.engine == "TensorRT" else rec.engine)
    plan = candidate.recorded.cross_check
    statement = (f"The candidate is a recording: outputs computed elsewhere by runner "
                 f"{rec.runner!r} ({version}), read from {rec.source}; the FP32 reference was "
                 "computed here on the same inputs.")
    built = rec.settings
    if built:
        on = {True: "on", False: "off", None: "not stated"}
        statement += (f" Build log: GPU {built.get('gpu') or 'not stated'}, FP16 "
                      f"{on[built.get('fp16')]}, TF32 {on[built.get('tf32')]}, strongly typed "
                      f"{on[built.get('strongly_typed')]}; {len(built.get('flagged', []))} "
                      "flagged line(s).")
    kinds: dict[str, int] = {}
    for reason in result.missing.values():
        kind = reason.split(" (")[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    info.update(
        statement=statement, recorded_tensors=len(rec.tensor_names()),
        matched_tensors=len(result.recorded.records), missing=dict(result.missing),
        missing_by_reason=kinds, unmatched=list(result.unmatched[:200]),
        cross_check=({"emulator": f"emulate-{plan.default.value}",
                      "fp32_nodes": plan.fp32_nodes(),
                      **cross_check_table(result, output_errors)}
                     if plan is not None else None))
    return info
