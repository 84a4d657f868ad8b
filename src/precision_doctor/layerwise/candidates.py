"""Candidates: how to build the runner under test for a (possibly output-marked) model.

A ``Candidate`` is a factory, because layerwise comparison rebuilds the runner for models with
different marked outputs. ``candidate_from_spec`` maps the CLI's ``--runner`` text to one.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.errors import BackendError, ReferenceError_
from precision_doctor.graph.external import small_in_memory
from precision_doctor.graph.load import input_metadata
from precision_doctor.graph.outputs import mark_outputs
from precision_doctor.graph.segments import is_segment
from precision_doctor.inputs.recording import Recording
from precision_doctor.layerwise.compare import RunnerFactory, WholeGraph
from precision_doctor.layerwise.engines import SegmentFallback
from precision_doctor.precision.conv_bias import FUSED, SEPARATE
from precision_doctor.precision.emulate import EmulationInfo, emulate
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners import device
from precision_doctor.runners.base import Runner
from precision_doctor.runners.batching import batches_on, run_batched
from precision_doctor.runners.emulator import EmulatorRunner, WrittenEmulatorRunner
from precision_doctor.runners.ort import OrtRunner, resolve_provider
from precision_doctor.runners.ort_options import ort_providers
from precision_doctor.runners.recorded import RecordedRunner
from precision_doctor.runners.sessions import switched
from precision_doctor.runners.sessions.cpu_arena import shared_cpu
from precision_doctor.runners.tensorrt import TensorRTRunner
from precision_doctor.runners.verify import VerifiedBy, verified_again


@dataclass(frozen=True)
class Candidate:
    """How to build the candidate runner for a (possibly output-marked) model.

    Attributes:
        name: Label in reports.
        factory: Model proto -> runner.
        plan: The precision plan when the candidate is the emulator (enables measuring the
            impact of each finding); None for real engines.
        tf32: Whether the engine may use TF32 for FP32 MatMul/Conv (None: not applicable).
            ONNX Runtime's CUDA EP enables TF32 unless ``use_tf32=0`` (CUDA EP docs).
        segments: The factory runs the sub-models it is given (segments of the diagnosed
            model), so layerwise comparison can run each node once; False for candidates
            that run a model of their own (rewritten, FP16), which need marked outputs.
        graph: Model -> (the candidate's own whole graph, a runner factory for its sub-models)
            or None; layerwise comparison cuts that graph instead of building the candidate
            per segment (``layerwise.compare.compare_layerwise``'s ``candidate_graph``).
        conv_bias: The emulator's convolution bias model (``precision.conv_bias``), which
            the emulations derived from this candidate (impact trials, attribution) follow.
    """

    name: str
    factory: RunnerFactory
    plan: PrecisionPlan | None = None
    tf32: bool | None = None
    recorded: RecordedSource | None = None
    segments: bool = False
    graph: WholeGraph | None = None
    conv_bias: str = FUSED


@dataclass(frozen=True)
class RecordedSource:
    """A candidate whose outputs were recorded elsewhere (``Candidate.recorded``).

    Attributes:
        recording: The recording, one iteration per sample (``match_samples``).
        cross_check: The plan the emulator runs for the emulated-vs-recorded side-by-side
            (None: no cross-check).
    """

    recording: Recording
    cross_check: PrecisionPlan | None = None


def emulated(plan: PrecisionPlan, conv_bias: str = FUSED) -> Candidate:
    """The CPU emulation of ``plan`` (``conv_bias``: the deployment engine's,
    ``precision.conv_bias``; ``separate`` for ONNX Runtime CUDA).

    The emulation of the last whole model it ran is kept until layerwise comparison takes it
    (``Candidate.graph``), which cuts that graph instead of emulating every segment again.
    """
    name = f"emulate-{plan.default.value}" + ("-ort-cuda-bias" if conv_bias == SEPARATE else "")
    kept: list[tuple[onnx.ModelProto, tuple[onnx.ModelProto, EmulationInfo]]] = []

    def emulation(model: onnx.ModelProto) -> tuple[onnx.ModelProto, EmulationInfo] | None:
        if kept and kept[0][0] is model:  # asked again: the model was sized when kept
            return kept[0][1]
        # a kept emulation holds a rounded copy of every weight: small models only (sizing
        # the proto is not free: 0.26 s on MiniLM's 90 MB, protobuf's ByteSize)
        if is_segment(model) or not small_in_memory(model):
            return None
        kept[:] = [(model, emulate(model, plan, conv_bias))]
        return kept[0][1]

    def factory(model: onnx.ModelProto) -> EmulatorRunner:
        # with a switched session open (a GPU: runners.sessions.switched), the runner takes it
        ready = None if switched.serves(device.current()) else emulation(model)
        return EmulatorRunner(model, plan, name=name, emulation=ready, conv_bias=conv_bias)

    def graph(model: onnx.ModelProto) -> tuple[onnx.ModelProto, RunnerFactory] | None:
        done = emulation(model)
        kept.clear()  # handed over: layerwise comparison holds it only while it runs
        if done is None:
            return None
        return done[0], lambda sub: OrtRunner(sub, name=name)

    return Candidate(name, factory, plan, segments=True, graph=graph, conv_bias=conv_bias)


def emulated_fused(model: onnx.ModelProto, plan: PrecisionPlan,
                   rewritten: onnx.ModelProto | None = None) -> Candidate:
    """Emulation of ``plan`` on the model an engine would actually run: BatchNorm folded into
    the convolution, decomposed LayerNorm fused (``precision.rewrites``). Tensors are matched
    by name; those the rewrites removed are not compared. The plan is applied to the nodes the
    rewritten model still has (its default covers the new nodes). ``rewritten``: the result
    of ``apply_rewrites(model)`` when the caller already has it."""
    from precision_doctor.precision.rewrites import apply_rewrites

    if rewritten is None:
        rewritten, _ = apply_rewrites(model)
    names = {n.name for n in rewritten.graph.node}
    fused_plan = PrecisionPlan(plan.default, {k: v for k, v in plan.overrides.items()
                                              if k in names})
    name = f"emulate-fused-{plan.default.value}"

    def factory(marked: onnx.ModelProto) -> EmulatorRunner:
        _refuse_segments(marked, name)
        target = mark_outputs(rewritten, [o.name for o in marked.graph.output])
        return EmulatorRunner(target, fused_plan, name=name)

    return Candidate(name, factory)


def onnxruntime(providers: Sequence[str], provider_options: Sequence[Mapping[str, str]] | None
                = None, model: onnx.ModelProto | None = None, name: str | None = None
                ) -> Candidate:
    """ONNX Runtime with ``providers`` on ``model`` (default: the diagnosed model itself).

    When ``model`` differs from the diagnosed model (e.g. an FP16 model written by ``fix``),
    the tensors marked on the diagnosed model are marked on ``model`` too, by name.
    """
    label = name or "ort-" + "+".join(providers)

    def factory(marked: onnx.ModelProto) -> OrtRunner:
        if model is not None:
            _refuse_segments(marked, label)
        target = marked if model is None else mark_outputs(
            model, [o.name for o in marked.graph.output])
        return OrtRunner(target, providers, provider_options, name=label)

    tf32 = None
    if providers and resolve_provider(providers[0]) == "CUDAExecutionProvider":
        opts = (provider_options or [{}])[0]
        tf32 = str(opts.get("use_tf32", "1")).lower() not in ("0", "false")
    return Candidate(label, factory, tf32=tf32, segments=model is None)


def written_emulation(model: onnx.ModelProto, name: str = "emulate-written",
                      conv_bias: str = FUSED) -> Candidate:
    """The exact CPU emulation of a strongly typed ``model`` (e.g. a BF16 model written by
    ``fix``, which ONNX Runtime CPU has no kernels for): its Casts, every BF16/FP16 tensor
    rounded to its format (``precision.emulate_written``). Tensors marked on the diagnosed model
    are marked on ``model`` by name."""
    def factory(marked: onnx.ModelProto) -> WrittenEmulatorRunner:
        _refuse_segments(marked, name)
        return WrittenEmulatorRunner(mark_outputs(model, [o.name for o in marked.graph.output]),
                                     name=name, conv_bias=conv_bias)

    return Candidate(name, factory, conv_bias=conv_bias)


def verified(verified_by: VerifiedBy, model: onnx.ModelProto, conv_bias: str = FUSED
             ) -> Candidate:
    """The runner that verified the written ``model`` (``runners.verify``) as a candidate
    (``conv_bias``: the deployment engine's, ``precision.conv_bias``)."""
    name = verified_by.runner

    def factory(marked: onnx.ModelProto) -> Runner:
        _refuse_segments(marked, name)
        return verified_again(verified_by,
                              mark_outputs(model, [o.name for o in marked.graph.output]),
                              conv_bias)

    return Candidate(name, factory)


def _refuse_segments(model: onnx.ModelProto, name: str) -> None:
    """A candidate running a model of its own cannot run a segment of the diagnosed one."""
    if is_segment(model):
        raise SegmentFallback(f"the candidate {name} runs a model of its own, not segments of "
                              "the diagnosed model")


def reference_factory(model: onnx.ModelProto) -> OrtRunner:
    """ONNX Runtime in FP32 on the current device (``runners.device``; the CPU by default,
    CUDA with TF32 off inside ``device.use``): the trusted reference."""
    return OrtRunner(model, name=reference_name())


def reference_name() -> str:
    """Label of the reference on the current device (``ort-cpu``, ``ort-cuda:0-fp32 ...``)."""
    return device.current().reference_name()


def check_finite_reference(reference: Mapping[str, Sequence[np.ndarray]],
                           sample_names: Sequence[str]) -> None:
    """Refuse a reference with NaN/Inf in a floating output: nothing can be compared with it.

    Raises:
        ReferenceError_: Naming the first output and sample with a non-finite value.
    """
    for name, arrays in reference.items():
        for sample, a in zip(sample_names, arrays):
            if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
                raise ReferenceError_(
                    f"the FP32 reference ({reference_name()}) produces NaN/Inf in output {name!r} "
                    f"for sample {sample!r}: nothing can be compared against it. Check the "
                    "input preprocessing (scale, mean/std) and the model.", output=name,
                    sample=sample)


def recorded(recording: Recording, model: onnx.ModelProto,
             cross_check: PrecisionPlan | None = None) -> Candidate:
    """Outputs recorded on another machine (``inputs.recording``) as the candidate.

    Args:
        recording: Matched to the samples (``match_samples``): iteration i is sample i.
        model: The diagnosed model (for input metadata).
        cross_check: Emulator plan to compare against the recording, tensor by tensor.
    """
    name = f"recorded {recording.runner}"
    inputs = input_metadata(model)

    def factory(marked: onnx.ModelProto) -> RecordedRunner:
        return RecordedRunner(recording.iterations, inputs,
                              [o.name for o in marked.graph.output], name)

    tf32 = recording.settings.get("tf32")  # from the build log: enables the TF32 root cause
    return Candidate(name, factory, tf32=tf32 if isinstance(tf32, bool) else None,
                     recorded=RecordedSource(recording, cross_check))


def candidate_from_spec(spec: str, plan: PrecisionPlan, model: onnx.ModelProto,
                        candidate_model: onnx.ModelProto | None = None,
                        conv_bias: str = FUSED) -> Candidate:
    """Build the candidate named by ``spec``.

    Args:
        spec: ``emulate``, ``emulate-fused`` (the model after BatchNorm folding and LayerNorm
            fusion, as engines run it), ``emulate-written`` (``candidate_model`` emulated as
            written: ``written_emulation``) or an ONNX Runtime spec such as ``ort:cuda,tf32=0``
            (see ``precision_doctor.runners.ort_options``), or ``trt[:tf32=1,...]``
            (TensorRT via Polygraphy, ``runners.tensorrt``; untested with real TensorRT).
        plan: The precision plan (used by the emulators).
        model: The diagnosed model.
        candidate_model: For ``ort``/``trt``/``emulate-written`` runners, run this model (e.g.
            the FP16 model written by ``fix``) instead of the diagnosed one.
        conv_bias: The emulators' convolution bias model (``precision.conv_bias``).

    Raises:
        BackendError: Unknown runner or bad ORT options.
    """
    text = spec.strip()
    if text == "emulate-written":
        if candidate_model is None:
            raise BackendError("--runner emulate-written emulates a strongly typed model as "
                               "written: give it with --candidate-model (e.g. a BF16 model from "
                               "fix)", runner=spec)
        return written_emulation(candidate_model, conv_bias=conv_bias)
    if text in ("emulate", "emulate-fused"):
        if candidate_model is not None:
            raise BackendError("--candidate-model is for ort runners; the emulator derives its "
                               "model from the plan")
        return emulated(plan, conv_bias) if text == "emulate" else emulated_fused(model, plan)
    if text.startswith("ort"):
        providers, options = ort_providers(text)
        return onnxruntime(providers, options, candidate_model, name=text.replace(",", " "))
    if text == "trt" or text.startswith("trt:"):
        return tensorrt(trt_options(text), candidate_model, name=text.replace(",", " "))
    raise BackendError(f"unknown runner {spec!r}: use 'emulate', 'emulate-fused', "
                       "'emulate-written' (with --candidate-model), "
                       "'ort:<provider>[,options]' (e.g. ort:cuda,tf32=0) or "
                       "'trt[:tf32=0,fp16=0,strongly_typed=1]'", runner=spec)


def tensorrt(options: Mapping[str, Any], model: onnx.ModelProto | None = None,
             name: str = "trt") -> Candidate:
    """TensorRT built by Polygraphy (``runners.tensorrt``; UNTESTED with real TensorRT).

    Args:
        options: ``TensorRTRunner`` keywords (``tf32``, ``fp16``, ``strongly_typed``).
        model: Run this model (e.g. an FP16 model from ``fix``) with the diagnosed model's
            marked tensors; default the diagnosed model.
        name: Label in reports.
    """
    def factory(marked: onnx.ModelProto) -> TensorRTRunner:
        target = marked if model is None else mark_outputs(
            model, [o.name for o in marked.graph.output])
        return TensorRTRunner(target, name=name, **options)

    return Candidate(name, factory, tf32=bool(options.get("tf32", False)))


def trt_options(spec: str) -> dict[str, Any]:
    """``trt[:tf32=1,fp16=1,strongly_typed=0]`` -> ``TensorRTRunner`` keyword arguments.

    Raises:
        BackendError: Unknown key or a value that is not 0/1/true/false.
    """
    _, _, rest = spec.partition(":")
    out: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, _, value = item.partition("=")
        if key not in ("tf32", "fp16", "strongly_typed") or value.lower() not in (
                "0", "1", "true", "false"):
            raise BackendError(f"bad TensorRT option {item!r} in {spec!r}: use tf32=0|1, "
                               "fp16=0|1, strongly_typed=0|1", runner=spec)
        out[key] = value.lower() in ("1", "true")
    return out


def float32_outputs(result: Mapping[str, np.ndarray], names: Sequence[str]
                    ) -> dict[str, np.ndarray]:
    """The ``names`` outputs of one run, low-precision floats widened to float32 (exact)."""
    out = {}
    for n in names:
        a = np.asarray(result[n])
        out[n] = a.astype(np.float32) if a.dtype.kind == "f" and a.itemsize < 4 else a
    return out


def run_samples(runner: Runner, samples: Sequence, names: Sequence[str], stage: str = "",
                progress: Callable[[str, int, int], None] | None = None
                ) -> dict[str, list[np.ndarray]]:
    """Run ``runner`` (entered and exited here) on every sample; float outputs as float32.

    On a CUDA device (``runners.device``) samples of equal shapes run in batches where the
    model has a batch dimension (``runners.batching``); on the CPU one run per sample.

    Args:
        runner: A runner not yet entered.
        samples: Objects with ``.feeds``.
        names: Output names to collect.
        stage / progress: ``progress(stage, done, total)`` after each sample.

    Returns:
        Output name -> one array per sample.
    """
    outs: dict[str, list[np.ndarray]] = {n: [] for n in names}
    batched = batches_on(device.current().is_cuda, getattr(runner, "model", None), len(samples))
    # on the CPU the session allocates from the shared arena (runners.sessions.cpu_arena): det's
    # 3 images at up to 736x3968 run in 1.2 s instead of 3.3 s with a fresh allocation per
    # activation (benchmarks/probes/incremental_cuts.py, 2026-11-28); outputs are copied out of
    # it, where kept views would pin its chunks
    with shared_cpu() if not device.current().is_cuda else nullcontext(), runner:
        if batched:  # on a GPU: samples of equal shapes in one run (runners.batching)
            for r in run_batched(runner, [s.feeds for s in samples], names):
                result = float32_outputs(r, names)
                for n in names:
                    outs[n].append(result[n])
            if progress:
                progress(stage, len(samples), len(samples))
            return outs
        for i, s in enumerate(samples):
            result = float32_outputs(runner.run(s.feeds), names)
            for n in names:
                outs[n].append(np.array(result[n]))
            if progress:
                progress(stage, i + 1, len(samples))
    return outs
