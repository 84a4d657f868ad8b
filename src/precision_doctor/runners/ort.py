"""ONNX Runtime runner: the FP32 CPU reference and any execution provider (CUDA, TensorRT EP).

Provider options follow ONNX Runtime's documentation, e.g. CUDA ``{"use_tf32": "0"}`` and the
TensorRT EP's ``{"trt_fp16_enable": "True"}`` (the TensorRT EP parses booleans as
``True``/``False``; ``precision_doctor.runners.ort_options`` builds these from short specs).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.errors import BackendError, BackendUnavailable, PrecisionDoctorError
from precision_doctor.graph.external import (
    drop_unused_external,
    external_initializers,
    has_external_data,
    iter_external,
)
from precision_doctor.graph.external_files import link_model
from precision_doctor.graph.load import PROTOBUF_LIMIT, ort_model_source
from precision_doctor.precision.writer.validate import (
    crashing_fusions,
    optimizer_defect,
    optimizer_note,
)
from precision_doctor.runners import device
from precision_doctor.runners.base import Feeds, TensorMeta
from precision_doctor.runners.sessions import cpu_arena

_ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_, "tensor(int16)": np.int16,
    "tensor(uint16)": np.uint16, "tensor(string)": np.object_,
}

PROVIDER_ALIASES = {
    "cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider", "trt": "TensorrtExecutionProvider",
    "rocm": "ROCMExecutionProvider", "dml": "DmlExecutionProvider",
    "openvino": "OpenVINOExecutionProvider", "coreml": "CoreMLExecutionProvider",
}


def resolve_provider(name: str) -> str:
    """Map a short provider name (``cuda``) to ONNX Runtime's (``CUDAExecutionProvider``)."""
    return PROVIDER_ALIASES.get(name.lower(), name)


def _import_ort():
    try:
        import onnxruntime
    except ImportError as exc:  # pragma: no cover - onnxruntime is a hard dependency
        raise BackendUnavailable("onnxruntime is not installed: pip install onnxruntime") from exc
    return onnxruntime


class OrtRunner:
    """Runs a model with ONNX Runtime.

    Args:
        model: The model proto to run (never written to the user's path), or the path of an
            ``.onnx`` file (with its external data next to it) that ONNX Runtime opens itself.
            A proto whose tensors reference external data (``graph.load.load_model`` keeps
            weights in their files) is opened from a temporary folder of hard links to its
            data files (``graph.external.link_model``), so ONNX Runtime memory-maps the weights:
            no 2 GiB protobuf limit and no copy of the weights in memory. Across file systems
            the weights are handed over as ``OrtValue``s instead
            (``SessionOptions.add_external_initializers``; ONNX Runtime copies them).
        providers: Execution providers in priority order (short names allowed: ``cuda``).
            None: the device of the open ``runners.device.use`` scope (the CPU outside one),
            with that device's options (on CUDA: TF32 off, see ``runners.device``).
        provider_options: One dict per provider (e.g. ``[{"use_tf32": "0"}, {}]``).
        name: Label for reports; default derived from the providers.
        graph_optimization: ``all``, ``extended``, ``basic`` or ``disable``.
        intra_op_threads: Threads per op (0 = ONNX Runtime's default).
        strict_providers: Raise ``BackendUnavailable`` if ORT would fall back to CPU for the
            first provider.
        cpu_mem_arena: ONNX Runtime's CPU memory arena. Off by default: the arena keeps each
            session's peak (measured 2026-11-21: ``fix`` on PP-OCRv4 det, 3 full-size images,
            2.3 GB peak RSS with it, 0.9 GB without). On where one session runs many large
            samples: without it each large activation is a fresh mmap, and ``fix``'s emulated
            search spent half its CPU time in page faults (``repair.stages.SEARCH_ARENA``).
            Turn it on to time CPU inference. Inside ``runners.sessions.cpu_arena.shared_cpu()``
            the session allocates from one arena shared with the other sessions instead.
        arena_shrinkage: On a CUDA device, end every run by giving the device arena's free
            regions back (ONNX Runtime's run option ``memory.enable_memory_arena_shrinkage``),
            so that between runs the session holds its weights and no activations. For a
            session that outlives a stage (``runners.sessions.switched``): measured on an H200
            (PP-OCRv4 rec, 256 strips, ``benchmarks/gpu_pipeline.py``), the switched emulation
            kept its batched runs' activations through the layerwise stage, 2.6 GiB of the
            diagnosis's 12.8 GiB peak. Off by default: it costs a cudaFree/cudaMalloc per
            run, which sessions of many small runs feel (the same layerwise with every
            statistics-graph run shrinking: 44.6 vs 15.5 s; with only the segments' runs
            shrinking: 16.7 vs 16.3 s; ``benchmarks/probes/gpu_memory_probe.py``).

    Attributes:
        optimizer_note: Set by ``__enter__`` when ONNX Runtime's own graph optimizer broke the
            model and the session was created with graph optimizations off
            (``precision.writer.validate.optimizer_defect``); None otherwise.

    Raises:
        BackendUnavailable: (on ``__enter__``) a requested provider is not available; the
            message lists the available ones.
        BackendError: (on ``__enter__``) the session cannot be created.
    """

    def __init__(self, model: onnx.ModelProto | str | os.PathLike,
                 providers: Sequence[str] | None = None,
                 provider_options: Sequence[Mapping[str, str]] | None = None,
                 name: str | None = None, graph_optimization: str = "all",
                 intra_op_threads: int = 0, strict_providers: bool = True,
                 cpu_mem_arena: bool = False, arena_shrinkage: bool = False) -> None:
        self.model = model
        if providers is None:
            providers, provider_options = device.default_providers()
        self.providers = [resolve_provider(p) for p in providers]
        self.provider_options = [dict(o) for o in (provider_options or [{} for _ in providers])]
        if len(self.provider_options) != len(self.providers):
            raise BackendError("give one provider-options dict per provider")
        self.name = name or "ort-" + "+".join(
            p.replace("ExecutionProvider", "").lower() for p in self.providers)
        self.graph_optimization = graph_optimization
        self.intra_op_threads = intra_op_threads
        self.strict_providers = strict_providers
        self.cpu_mem_arena = cpu_mem_arena
        self.arena_shrinkage = arena_shrinkage
        self._run_options: Any = None  # __enter__ sets it where runs shrink the arena
        self.optimizer_note: str | None = None  # set when the optimizer had to be turned off
        self._session = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._weights: list = []  # OrtValues ONNX Runtime reads from: alive as long as the session

    def __enter__(self) -> OrtRunner:
        ort = _import_ort()
        available = ort.get_available_providers()
        missing = [p for p in self.providers if p not in available]
        if missing:
            raise BackendUnavailable(
                f"execution provider {missing[0]} is not available in this onnxruntime "
                f"({ort.__version__}); available: {', '.join(available)}. For CUDA install "
                "onnxruntime-gpu and call onnxruntime.preload_dlls().", provider=missing[0])
        options = ort.SessionOptions()
        levels = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                  "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                  "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                  "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}
        options.graph_optimization_level = levels[self.graph_optimization]
        options.intra_op_num_threads = self.intra_op_threads
        options.log_severity_level = 3
        options.enable_cpu_mem_arena = self.cpu_mem_arena
        if cpu_arena.active():
            cpu_arena.share_in(options)
        try:
            source = self._source(ort, options)
            session = self._session = self._open(ort, source, options)
        except Exception as exc:
            self.__exit__()
            if isinstance(exc, PrecisionDoctorError):
                raise
            raise BackendError(f"{self.name}: ONNX Runtime cannot create a session: {exc}",
                               runner=self.name) from exc
        used = session.get_providers()
        if self.strict_providers and self.providers[0] not in used:
            raise BackendUnavailable(
                f"{self.name}: ONNX Runtime fell back to {used} instead of {self.providers[0]}",
                provider=self.providers[0])
        if self.arena_shrinkage and self.providers[0] == device.CUDA_PROVIDER:
            shrink = ort.RunOptions()
            shrink.add_run_config_entry(
                "memory.enable_memory_arena_shrinkage",
                f"gpu:{int(self.provider_options[0].get('device_id', 0))}")
            self._run_options = shrink
        return self

    def _open(self, ort, source: bytes | str, options):
        """The session; again with graph optimizations off when ONNX Runtime's own optimizer
        broke the graph (``precision.writer.validate.optimizer_defect``: its LayerNorm fusion
        on FP16 models on the CPU), noted in ``optimizer_note``. The fusion that crashes the
        process on a Transpose -> Cast -> MatMul chain is always off for a model that has one
        (``precision.writer.validate.crashing_fusions``)."""
        disabled = crashing_fusions(self.model) if isinstance(self.model, onnx.ModelProto) \
            else []
        try:
            return ort.InferenceSession(source, sess_options=options, providers=self.providers,
                                        provider_options=self.provider_options,
                                        disabled_optimizers=disabled)
        except Exception as exc:
            message = str(exc)
            if not optimizer_defect(message) or self.graph_optimization == "disable":
                raise
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            session = ort.InferenceSession(source, sess_options=options,
                                           providers=self.providers,
                                           provider_options=self.provider_options,
                                           disabled_optimizers=disabled)
            self.optimizer_note = optimizer_note(message)
            return session

    def _source(self, ort, options) -> bytes | str:
        """What ``InferenceSession`` opens: a path, or bytes (+ external initializers)."""
        if not isinstance(self.model, onnx.ModelProto):
            return os.fspath(self.model)
        external = has_external_data(self.model)
        if external:
            self._tmp = tempfile.TemporaryDirectory(prefix="precision-doctor-ort-")
            try:  # hard links to the weight files: ONNX Runtime memory-maps them itself
                return str(link_model(self.model, Path(self._tmp.name), copy=False))
            except OSError:  # another file system: hand the weights over in memory
                self._tmp.cleanup()
                self._tmp = None
        if external and self.model.ByteSize() < PROTOBUF_LIMIT:
            # ONNX Runtime drops unread initializers before it takes the external ones.
            model = drop_unused_external(self.model)
            names, arrays = external_initializers(model)
            if len(names) == sum(1 for _ in iter_external(model)):
                self._weights = [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays]
                options.add_external_initializers(names, self._weights)
                return model.SerializeToString()
        self._tmp = tempfile.TemporaryDirectory(prefix="precision-doctor-ort-")
        return ort_model_source(self.model, self._tmp.name, external)

    def __exit__(self, *exc: object) -> None:
        self._session = None
        self._weights = []
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _require(self):
        if self._session is None:
            raise BackendError(f"{self.name}: use the runner inside a `with` block")
        return self._session

    def input_metadata(self) -> list[TensorMeta]:
        """Graph inputs as ONNX Runtime sees them (initializers excluded)."""
        return [TensorMeta(i.name, np.dtype(_ORT_TYPES.get(i.type, np.float32)),
                           tuple(d if isinstance(d, int) else (d or "?") for d in i.shape))
                for i in self._require().get_inputs()]

    def output_names(self) -> list[str]:
        """Names of the session outputs, in model order."""
        return [o.name for o in self._require().get_outputs()]

    def run(self, feeds: Feeds, output_names: Sequence[str] | None = None
            ) -> dict[str, np.ndarray]:
        """Run once and return ``{output name: array}``.

        Raises:
            BackendError: ONNX Runtime failed (the message keeps ORT's node name).
        """
        session = self._require()
        names = list(output_names) if output_names else self.output_names()
        try:
            values = session.run(names, dict(feeds), self._run_options)
        except Exception as exc:
            raise BackendError(f"{self.name}: run failed: {exc}", runner=self.name) from exc
        return dict(zip(names, values))

    def run_resident(self, feeds: Mapping[str, object], output_names: Sequence[str] | None = None
                     ) -> dict[str, object]:
        """Run once with ONNX Runtime's I/O binding: the outputs stay where the session's first
        provider keeps them (GPU memory on CUDA), as ``onnxruntime.OrtValue``. An output keeps
        its session's memory arena alive (with all the memory the arena holds) until it is
        freed: let none outlive the session (measured on an H100: PP-OCRv4 rec layerwise peaked
        at 32 GiB with device boundary tensors carried across segment sessions, 6 GiB
        without; ``benchmarks/probes/gpu_memory_probe.py``).

        Args:
            feeds: Input name -> ``OrtValue`` (used where it lies, e.g. an output of another
                session on the same device) or array (copied to the device), of any rank: a
                0-d array stays 0-d (``np.ascontiguousarray`` would make it [1], and a scalar
                crossing a layerwise segment boundary, such as BERT attention's
                ``Gather(Shape(x), 0)``, then broke the ``Unsqueeze -> Concat`` reading it:
                "Ranks of input data are different").
            output_names: Outputs to return (default: all).

        Returns:
            ``{output name: OrtValue}``; ``.numpy()`` copies one to the host.

        Raises:
            BackendError: ONNX Runtime failed.
        """
        ort = _import_ort()
        session = self._require()
        names = list(output_names) if output_names else self.output_names()
        cuda = self.providers[0] == device.CUDA_PROVIDER
        where = ("cuda", int(self.provider_options[0].get("device_id", 0))) if cuda else ("cpu", 0)
        try:
            binding = session.io_binding()
            for name, value in feeds.items():
                if isinstance(value, ort.OrtValue):
                    binding.bind_ortvalue_input(name, value)
                else:  # keeps a 0-d array 0-d (Args); the binding holds a reference to it
                    binding.bind_cpu_input(name, np.asarray(value, order="C"))
            for name in names:
                binding.bind_output(name, where[0], where[1])
            session.run_with_iobinding(binding, self._run_options)
            values = binding.get_outputs()
        except Exception as exc:
            raise BackendError(f"{self.name}: run failed: {exc}", runner=self.name) from exc
        return dict(zip(names, values))


@dataclass(frozen=True)
class OrtFactory:
    """Model -> ``OrtRunner`` with fixed providers: a picklable runner factory (spawned GPU
    workers of the search receive it, ``search.evalpool``).

    Attributes:
        providers / provider_options / name: As for ``OrtRunner``.
    """

    providers: tuple[str, ...]
    provider_options: tuple[Mapping[str, str], ...]
    name: str

    def __call__(self, model: onnx.ModelProto | str | os.PathLike,
                 intra_op_threads: int = 0) -> OrtRunner:
        return OrtRunner(model, self.providers, self.provider_options, name=self.name,
                         intra_op_threads=intra_op_threads)
