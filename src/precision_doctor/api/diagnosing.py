"""``diagnose``: does a model survive FP16/BF16/TF32, and where and why does it break."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.api.autocast import (
    autocast_recording,
    parse_autocast_runner,
    with_autocast_causes,
)
from precision_doctor.api.device import choose_device
from precision_doctor.api.options import (
    DataLike,
    ModelLike,
    ModuleLike,
    Progress,
    ToleranceLike,
    as_model,
    as_samples,
    build_objective,
    build_plan,
    labelled_objective,
    parse_precision,
    parse_tolerances,
    progress_reporter,
)
from precision_doctor.api.pytorch import module_input
from precision_doctor.api.results import Diagnosis, convert
from precision_doctor.diagnosis.diagnose import diagnose as diagnose_model
from precision_doctor.errors import InputError
from precision_doctor.formats import Precision
from precision_doctor.graph.upcast import upcast, with_fp32_io
from precision_doctor.inputs import PreprocessSpec, Sample
from precision_doctor.inputs.recording import Recording
from precision_doctor.jsonable import json_float
from precision_doctor.layerwise.candidates import Candidate, candidate_from_spec, reference_factory
from precision_doctor.layerwise.candidates import run_samples as run_all
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners.device import use as use_device
from precision_doctor.runners.kernels.engines import conv_bias_of
from precision_doctor.runners.kernels.registry import cpu_fp16_warning, refuse_cpu_bf16
from precision_doctor.runners.sessions import switched
from precision_doctor.search.objective import Objective


def diagnose(model: ModuleLike, data: DataLike, *, target: str = "fp16",
             preprocess: PreprocessSpec | str | None = None, runner: str = "emulate",
             tolerance: ToleranceLike = None,
             metric: str | None = None, threshold: float | None = None,
             layerwise: bool = True, noise: bool = True, keep: Sequence[str] = (),
             plan: PrecisionPlan | str | os.PathLike | None = None,
             candidate_model: ModelLike | None = None, max_samples: int | None = None,
             budget_mb: int = 256, progress: Progress | None = None,
             quiet: bool = False, candidate_results: str | os.PathLike | None = None,
             candidate_log: str | os.PathLike | None = None,
             stress: bool = False, device: str = "auto",
             labels: str | os.PathLike | None = None, engine: str | None = None) -> Diagnosis:
    """Run ``model`` in reduced precision next to its FP32 reference and explain the difference.

    The reference is ONNX Runtime in FP32 (on the CPU, or on the GPU with TF32 off, see
    ``device``). The candidate is, by default, an emulation that rounds every tensor to
    ``target`` (round-to-nearest-even, overflow to inf above the format's max, e.g. 65504 for
    FP16, flush below the smallest subnormal; TF32 rounds the inputs of MatMul/Gemm/Conv to 10
    mantissa bits), or a real engine.

    A model shipped in FP16/BF16 (weights, inputs/outputs or Casts in that format) is never
    compared with itself: its reference is its exact FP32 upcast (``graph.upcast``), the whole
    diagnosis runs on that upcast (its FP16/BF16 inputs take FP32 feeds; FP16 feeds are widened
    exactly), and ``Diagnosis.model`` says so (``shipped_precision``, ``reference``). An
    ``ort:``/``trt``/``emulate-written`` runner without ``candidate_model`` runs the model as
    shipped, its FP16/BF16 inputs and outputs cast from and to FP32 at the graph's edges
    (``graph.upcast.with_fp32_io``).

    Args:
        model: The FP32 model (or one shipped in FP16/BF16, see above): a ``.onnx`` path, an
            ``onnx.ModelProto`` (not modified) or an ``onnx_ir.Model``; or a
            ``torch.nn.Module``, exported with ``torch.onnx.export(dynamo=True)``
            (``api.pytorch.export_module``; ``data`` is then its samples).
        data: Inputs. What ``--data`` takes: an image file, folder or glob (with
            ``preprocess``), ``.npy``/``.npz`` or a folder of them, Polygraphy inputs JSON,
            or ``"random:seed=0,count=4,shape=x:1x3x224x224"``. Or in memory: a feed dict
            ``{input name: np.ndarray}``, one array (single-input models), or an iterable of
            either, one sample each. Arrays are cast to the input dtypes when values are kept
            (float64 -> float32); dynamic dims are taken from the data. For a module: a list
            or iterable of argument tuples, keyword dicts or tensors (torch.Tensor).
        target: ``"fp16"``, ``"bf16"``, ``"tf32"``, or ``"fp32"`` (compare two FP32 engines).
        preprocess: Image preprocessing: a preset (``imagenet``, ``ppocr-det``, ``ppocr-rec``,
            ``ppocr-cls``, ``paddleocr-det``, ``ultralytics``, ``none``), ``key=value`` overrides
            (``"ppocr-det:resize=max-side,side=960"``) or a ``PreprocessSpec``. Images only.
        runner: ``"emulate"``, ``"emulate-fused"`` (BatchNorm folded and LayerNorm fused as
            engines run it), ``"emulate-written"`` (``candidate_model``, a strongly typed model
            such as a BF16 model from ``fix``, emulated exactly as written), or ONNX Runtime:
            ``"ort:cuda,tf32=0"``, ``"ort:tensorrt,fp16=1"``. ``"ort:cpu"`` with a BF16
            target is refused with the reason (ONNX Runtime CPU has no BF16 kernels for
            Conv, MatMul, ...; it would run the FP32 model in FP32). For a
            ``torch.nn.Module``: ``"autocast[:fp16|bf16][,device=cpu|cuda]"`` runs the module
            under ``torch.autocast`` (default: the target's dtype, CUDA when torch sees a GPU)
            as the candidate, recorded (``report.recording``), with the strongly typed model of
            ``target``, emulated, as the cross-check (``api.autocast.autocast_recording``).
        tolerance: Pass bound per output. Default relative L2 error <= 1e-2 for FP16/TF32,
            8e-2 for BF16, 1e-4 for FP32 (20x the format's unit roundoff, 2^-11 for FP16, as
            ``compare.tolerance`` documents). A number (relative L2), text
            ``"rel_l2=1e-2,atol=1e-3,rtol=1e-3,statistic=p99"`` (``"OUT:..."`` for one
            output), a list of texts, a ``Tolerance`` or ``{output: Tolerance | text}``.
        metric: Also score a task metric of the candidate's outputs against the reference's
            (``top1``, ``mask-iou:threshold=0.3``, ``ctc-string``, ``db-boxes``, ``psnr``,
            ``module:function`` ...), reported in ``Diagnosis.task``; two extra runs.
        threshold: Pass mark of ``metric`` on every sample (default: the metric's own).
        layerwise: Compare every intermediate floating tensor (first divergence, overflow,
            flush-to-zero, NaN birth, headroom in bits).
        noise: Measure the FP32 noise floor (float64 and unoptimized FP32 probes).
        keep: Node names or op types kept in FP32 by the emulator.
        plan: A ``PrecisionPlan`` (or its JSON file) for the emulator instead of all-``target``.
        candidate_model: For ``ort:`` and ``emulate-written`` runners, run this model (e.g. a
            fixed one) as the candidate instead of ``model``.
        max_samples: Use the first N samples.
        budget_mb: Memory budget of one layerwise segment (its outputs and weights, both
            runners, one sample), in MiB.
        progress: ``progress(stage, done, total)`` callback; default: a rich bar on stderr
            when it is a terminal, nothing otherwise.
        quiet: No progress output at all (the library never prints results).
        candidate_results: Outputs recorded on the deployed engine instead of a live
            candidate: Polygraphy ``--save-outputs`` JSON (``"out.json:RUNNER"`` picks a
            runner), trtexec ``--exportOutput`` JSON, or ``.npz`` per sample; iteration i is
            sample i. The emulator of ``target``/``plan``/``keep`` becomes the cross-check.
        candidate_log: That engine's trtexec/Polygraphy ``--verbose`` build log (TensorRT
            version, GPU, FP16/TF32/strongly typed settings), with ``candidate_results``.
        stress: For a transformer and an FP16 target, also run the stress probe: the factor
            by which the real inputs can be scaled before an activation overflows, and where
            (``Diagnosis.transformer["stress"]``; up to ~26 extra FP32 runs of one sample).
        device: Where the reference, the emulation, the layerwise segments and the impact
            measurements run: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (the first
            CUDA device when ``onnxruntime-gpu`` and a GPU are present and the workload pays
            for starting CUDA, else the CPU, with a warning saying so: ``api.device``). On
            CUDA the reference is FP32 with TF32 off (``Diagnosis.reference`` says so) and
            the noise floor adds a CPU cross-check (``runners.device``).
        labels: Ground truth (COCO JSON for detection, ``file,class`` CSV for
            classification, matched to image samples by file name): ``Diagnosis.accuracy``
            gives the task accuracy of the FP32 reference and of the candidate side by side
            (COCO mAP by pycocotools, top-1 accuracy); needed by ``metric="coco-map-drop"``.
        engine: The deployment engine whose arithmetic the emulator follows (``"ort-cuda"``:
            an FP16/BF16 convolution's bias is added after its output was rounded, and
            rounded again, as ONNX Runtime CUDA does; ``precision.conv_bias``). None: the
            default engine model (TensorRT's fused bias). An out-of-range constant's finding
            says what each engine makes of it, measured once with the constants clamped as
            TensorRT does, and this engine's own verdict
            (``diagnosis.causes.engine_constants``).

    Returns:
        :class:`Diagnosis`: ``verdict`` (``"pass"``/``"fail"``), ``outputs`` (metrics per
        output: max/mean/median/p99 abs error, relative L2, cosine, SNR in dB, NaN/Inf
        counts), ``findings`` (root cause, node, evidence, remedy, measured impact),
        ``hazards``, ``layerwise``, ``noise``; ``to_json()``, ``to_html(path)``.

    Raises:
        ModelLoadError: The model cannot be read (missing, corrupt, external data missing).
        InputError: No data, a source not found, images without ``preprocess``, an unknown
            ``target`` or a bad ``tolerance``.
        InputNameError, InputShapeError: The data does not fit the model's inputs (the
            message names the input, the dim, expected and got).
        DataFormatError: A data file does not decode.
        PlanError: ``keep`` or ``plan`` names nodes the model does not have, or ``engine`` is
            not a known engine.
        BackendError, BackendUnavailable: A runner cannot be built (e.g. no CUDA provider:
            the message lists the available ones; ONNX Runtime CPU asked to run BF16), or
            ``device`` is CUDA and ONNX Runtime has no CUDA execution provider or no GPU
            answers.
        ReferenceError_: The FP32 reference itself produces NaN/Inf.
        MetricError: Unknown ``metric``, or the metric fails.
        InputError: ``threshold`` without ``metric``.
    """
    if candidate_results is not None and (runner != "emulate" or candidate_model is not None):
        raise InputError("candidate_results is the candidate: drop runner/candidate_model (the "
                         "emulator of target/plan/keep is the cross-check)")
    if candidate_log is not None and candidate_results is None:
        raise InputError("candidate_log goes with candidate_results")
    if candidate_results is not None and metric:
        raise InputError("a task metric on recorded results is not supported yet: score the "
                         "recording with `diagnose` alone, or run the metric live")
    precision = parse_precision(target)
    conv_bias = conv_bias_of(engine)  # an unknown engine is refused before any loading
    # before any loading: a threshold without a metric is refused, as fix refuses it
    objective = (build_objective(None, metric, threshold, precision)
                 if metric or threshold is not None else None)
    torch_module: Any = model  # for an autocast candidate (api.autocast)
    torch_samples = data
    recorded: str | Recording | None = None if candidate_results is None else str(
        candidate_results)
    model, data, exported = module_input(model, data, max_samples)
    shipped_model, path = as_model(model)
    proto, shipped = upcast(shipped_model)  # a model shipped in FP16/BF16: its reference is FP32
    samples = as_samples(data, proto, preprocess, max_samples)
    labelled, accuracy = labelled_objective(objective or Objective(), proto, samples, labels)
    if objective is not None:
        objective = labelled
    emulated_plan = build_plan(proto, precision, plan, keep)
    runner_spec = runner
    if parse_autocast_runner(runner) is not None:  # the module under torch.autocast, recorded
        if exported is None:
            raise InputError(f"--runner {runner} runs a torch.nn.Module under torch.autocast: "
                             "give the module (package.module:factory), not an ONNX model")
        recorded = autocast_recording(
            torch_module, torch_samples, runner, precision.value,
            [i.name for i in proto.graph.input], [o.name for o in proto.graph.output],
            max_samples)
        runner = "emulate"  # the strongly typed model, emulated, is the cross-check
    other = as_model(candidate_model)[0] if candidate_model is not None else None
    if other is None and shipped is not None and (
            runner.strip().startswith(("ort", "trt")) or runner.strip() == "emulate-written"):
        other = with_fp32_io(shipped_model)  # an engine runs the model as shipped
    if precision is Precision.BF16:
        refuse_cpu_bf16(runner, proto, other, "diagnose")
    cpu_note = cpu_fp16_warning(runner, other, precision)
    candidate = candidate_from_spec(runner, emulated_plan, proto, other,
                                    conv_bias)
    runs: dict[str, dict[str, list[np.ndarray]]] = {}  # the plain runs, scored again below
    where, device_note = choose_device(device, proto, samples)
    with progress_reporter(progress, quiet) as callback, use_device(where), \
            switched.sessions():
        report = diagnose_model(proto, samples, precision, candidate,
                                parse_tolerances(tolerance, precision), layerwise=layerwise,
                                noise=noise, budget_bytes=budget_mb << 20, model_path=path,
                                progress=callback,
                                candidate_results=recorded,
                                candidate_log=(str(candidate_log)
                                               if candidate_log is not None else None),
                                stress=stress, runs=runs, engine=engine,
                                constants_plan=emulated_plan)
        if cpu_note:
            report = replace(report, warnings=(cpu_note, *report.warnings))
        if device_note:
            report = replace(report, warnings=(*report.warnings, device_note))
        if shipped is not None or exported is not None:
            report = replace(report, model={**report.model, **(exported or {}), **(
                shipped.model_info() if shipped is not None else {})})
        if isinstance(recorded, Recording) and recorded.format == "autocast":
            report = with_autocast_causes(report, torch_module, torch_samples, runner_spec,
                                          max_samples)
        task = (task_score(proto, samples, candidate, objective, callback, runs)
                if objective is not None else None)
        measured = None
        if accuracy is not None:
            names = [o.name for o in proto.graph.output]
            ref = runs.get("reference") or run_all(reference_factory(proto), samples, names)
            cand = runs.get("candidate") or run_all(candidate.factory(proto), samples, names)
            measured = accuracy({"fp32": ref, precision.value: cand})
    return convert(Diagnosis, report, task=task, accuracy=measured)


def task_score(model: onnx.ModelProto, samples: Sequence[Sample], candidate: Candidate,
               objective: Objective, progress: Progress | None = None,
               runs: Mapping[str, Mapping[str, list[np.ndarray]]] | None = None
               ) -> dict[str, Any]:
    """The task metric of the candidate's outputs against the FP32 reference's.

    ``runs``: the outputs diagnose already computed (``"reference"``, ``"candidate"``); the
    model is run here only when they are missing.

    Returns:
        ``{"metric": description, "passed", "value" (worst sample), "per_sample"}``.

    Raises:
        MetricError: The metric raised or returned NaN.
    """
    names = [o.name for o in model.graph.output]
    runs = runs or {}
    reference = runs.get("reference") or run_all(reference_factory(model), samples, names,
                                                  "task-reference", progress)
    outputs = runs.get("candidate") or run_all(candidate.factory(model), samples, names,
                                               "task-candidate", progress)
    objective = objective.with_samples(samples)
    score = objective.score(reference, outputs)
    return {"metric": objective.describe(), "passed": score.passed,
            "value": json_float(score.value),
            "per_sample": {s.name: json_float(float(v)) for s, v in
                           zip(samples, score.detail.get("per_sample", []))}}
