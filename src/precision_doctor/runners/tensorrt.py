"""Native TensorRT runner (optional extra ``precision-doctor[tensorrt]``).

UNTESTED in this project's environment: TensorRT cannot be installed on the machines this project
is built and tested on (see ``shared/docs/GPU.md``), so this module is written against the
documented TensorRT 10.x / 11 Python API and checked only with a fake ``tensorrt`` module. Run the
tests marked ``tensorrt`` on a machine with an NVIDIA GPU and TensorRT before relying on it.

It parses the ONNX model into a **strongly typed** network (precision comes from the model's
dtypes and Casts, never from builder flags), sets TF32 on/off, builds the optimization profile from
the real feed shapes, runs with ``set_input_shape``/``set_tensor_address``/``execute_async_v3``,
captures intermediate tensors, and exports the engine's layer information as JSON.

API references:

- Builder, ``NetworkDefinitionCreationFlag.STRONGLY_TYPED`` (TensorRT 10; deprecated and ignored in
  11, where every network is strongly typed and ``EXPLICIT_BATCH``/``BuilderFlag.FP16`` are gone):
  https://docs.nvidia.com/deeplearning/tensorrt/latest/_static/python-api/infer/Core/Builder.html,
  https://docs.nvidia.com/deeplearning/tensorrt/11.0.0/_static/python-api/infer/Core/Builder.html,
  https://docs.nvidia.com/deeplearning/tensorrt/latest/api/migration/tensorrt-10x-to-11x-python-api-reference.html
- ``IBuilderConfig`` (``BuilderFlag.TF32`` is on by default, ``profiling_verbosity``):
  https://docs.nvidia.com/deeplearning/tensorrt/latest/_static/python-api/index.html
- ``IExecutionContext`` / ``IOutputAllocator``:
  https://docs.nvidia.com/deeplearning/tensorrt/latest/_static/python-api/infer/Core/ExecutionContext.html
- ``IDebugListener`` (TensorRT >= 10):
  https://docs.nvidia.com/deeplearning/tensorrt/api/python_api/infer/Core/DebugListener.html
- ``EngineInspector``; the JSON of ``get_engine_information(LayerInformationFormat.JSON)`` is what
  ``trtexec --exportLayerInfo`` writes and needs ``ProfilingVerbosity.DETAILED``:
  https://docs.nvidia.com/deeplearning/tensorrt/10.16.1/inference-library/engine-tools.html
- Run loop and debug listener as in Polygraphy's ``polygraphy/backend/trt/runner.py``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.errors import (
    BackendError,
    BackendUnavailable,
    InputNameError,
    InputShapeError,
    UnsupportedModelError,
)
from precision_doctor.graph.load import ort_model_source
from precision_doctor.runners.base import Feeds, TensorMeta
from precision_doctor.runners.trt_cuda import (
    cuda_backend,
    make_debug_listener,
    make_output_allocator,
    np_dtype,
)

INSTALL_HINT = ("TensorRT is not installed: pip install 'precision-doctor[tensorrt]' on a machine "
                "with an NVIDIA GPU (TensorRT >= 10; TensorRT-RTX does not support Hopper GPUs and "
                "tensorrt-lean cannot build engines). Use '--runner ort:cuda' meanwhile.")

Shape = tuple[int, ...]
Profile = dict[str, tuple[Shape, Shape, Shape]]  # input name -> (min, opt, max)


def import_tensorrt() -> Any:
    """Import ``tensorrt`` (only inside ``__enter__``/functions, never at module import).

    Raises:
        BackendUnavailable: TensorRT is missing, or older than 10 (no tensor-name API).
    """
    try:
        import tensorrt
    except ImportError as exc:
        raise BackendUnavailable(INSTALL_HINT, backend="tensorrt") from exc
    version = str(getattr(tensorrt, "__version__", "0"))
    if int(version.split(".")[0]) < 10:
        raise BackendUnavailable(f"TensorRT {version} is too old: TensorRTRunner needs >= 10 "
                                 "(strongly typed networks, execute_async_v3)", backend="tensorrt")
    return tensorrt


def parse_network(trt: Any, logger: Any, source: bytes | str) -> tuple[Any, Any, Any]:
    """Create a builder and a strongly typed network, and parse the ONNX model into it.

    Args:
        trt: The ``tensorrt`` module; logger: a ``trt.Logger``.
        source: Serialized ONNX bytes, or the path of a model saved with external data.

    Returns:
        ``(builder, network, parser)``; keep all three alive while the network is used.

    Raises:
        UnsupportedModelError: The ONNX parser rejected the model (its errors are listed).
    """
    builder = trt.Builder(logger)
    strongly_typed = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    flags = 0 if strongly_typed is None else 1 << int(strongly_typed)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    ok = parser.parse_from_file(source) if isinstance(source, str) else parser.parse(source)
    if not ok:
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise UnsupportedModelError(f"TensorRT's ONNX parser rejected the model: {errors}")
    return builder, network, parser


def network_tensors(network: Any) -> dict[str, Any]:
    """Every named tensor of a parsed network (inputs and layer outputs), in network order."""
    tensors = {network.get_input(i).name: network.get_input(i) for i in range(network.num_inputs)}
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        for j in range(layer.num_outputs):
            tensors.setdefault(layer.get_output(j).name, layer.get_output(j))
    return tensors


def mark_debug_tensors(trt: Any, network: Any, names: Sequence[str] | str,
                       use_debug_api: bool = True) -> tuple[list[str], str]:
    """Expose intermediate tensors for layerwise comparison.

    TensorRT >= 10 has ``network.mark_debug(tensor)``, read back through an ``IDebugListener``;
    otherwise (or with ``use_debug_api=False``) the tensors are marked as network outputs. Either
    way a marked tensor must be materialized, which blocks the fusions around it, so the engine
    is not quite the one deployed: "--mark all ... will break all TRT fusion"
    (NVIDIA/TensorRT#2571), and in NVIDIA/TensorRT#4647 adding ``--mark-debug`` changed the
    engine's output. Compare the final outputs of an unmarked engine too.

    Args:
        trt: The ``tensorrt`` module; network: the parsed network.
        names: Tensor names, or ``"all"`` for every floating-point layer output.
        use_debug_api: Use ``mark_debug`` when the network has it.

    Returns:
        ``(marked names, "debug" or "outputs")``.

    Raises:
        BackendError: A name is not a tensor of the network.
    """
    tensors = network_tensors(network)
    outputs = {network.get_output(i).name for i in range(network.num_outputs)}
    inputs = {network.get_input(i).name for i in range(network.num_inputs)}
    if names == "all":
        floats = {trt.float32, trt.float16, getattr(trt, "bfloat16", trt.float32)}
        chosen = [n for n, t in tensors.items()
                  if n not in outputs | inputs and t.dtype in floats]
    else:
        chosen = [n for n in names if n not in outputs]
        missing = [n for n in chosen if n not in tensors]
        if missing:
            raise BackendError(f"cannot mark {missing[:5]} for layerwise comparison: no such "
                               "tensor in the TensorRT network (names follow the ONNX tensors "
                               "TensorRT kept; fused constants have none)", tensor=missing[0])
    via = "debug" if use_debug_api and hasattr(network, "mark_debug") else "outputs"
    for name in chosen:
        (network.mark_debug if via == "debug" else network.mark_output)(tensors[name])
    return chosen, via


def build_plan(trt: Any, builder: Any, network: Any, *, tf32: bool, profile: Profile,
               workspace_bytes: int | None = None, optimization_level: int | None = None) -> Any:
    """Configure the builder and build a serialized engine.

    TF32 is enabled by default in TensorRT (``BuilderFlag.TF32`` doc), so ``tf32=False`` clears it
    where the flag exists. ``ProfilingVerbosity.DETAILED`` keeps layer precisions in the engine's
    layer information. No precision flags are set: the network is strongly typed.

    Args:
        profile: Input name -> (min, opt, max) shape, for the inputs with dynamic dims.

    Returns:
        The serialized engine (``IHostMemory``; supports the buffer protocol).

    Raises:
        BackendError: The build failed (TensorRT's log says why).
    """
    config = builder.create_builder_config()
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    tf32_flag = getattr(trt.BuilderFlag, "TF32", None)
    if tf32_flag is not None:
        (config.set_flag if tf32 else config.clear_flag)(tf32_flag)
    if workspace_bytes is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_bytes))
    if optimization_level is not None:
        config.builder_optimization_level = int(optimization_level)
    if profile:
        opt_profile = builder.create_optimization_profile()
        for name, (low, opt, high) in profile.items():
            opt_profile.set_shape(name, low, opt, high)
        config.add_optimization_profile(opt_profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise BackendError("TensorRT could not build the engine; its log above says why")
    return plan


def engine_layer_info(trt: Any, engine: Any) -> str:
    """The engine's layer information as JSON text, as ``trtexec --exportLayerInfo`` writes it."""
    inspector = engine.create_engine_inspector()
    return str(inspector.get_engine_information(trt.LayerInformationFormat.JSON))


def widen_profile(profile: Profile, shapes: Mapping[str, Shape]) -> Profile | None:
    """The profile extended to cover ``shapes``, or None when it already does (opt = new shape)."""
    grown = dict(profile)
    changed = False
    for name, shape in shapes.items():
        low, opt, high = profile.get(name, (shape, shape, shape))
        if len(low) != len(shape):  # rank changed: start over from this shape
            grown[name], changed = (shape, shape, shape), True
        elif any(not lo <= s <= hi for lo, s, hi in zip(low, shape, high)):
            low = tuple(min(a, b) for a, b in zip(low, shape))
            high = tuple(max(a, b) for a, b in zip(high, shape))
            grown[name], changed = (low, shape, high), True
        elif name not in profile:
            grown[name], changed = (low, opt, high), True
    return grown if changed else None


class TensorRTRunner:
    """Builds and runs a TensorRT engine from an ONNX model. UNTESTED in this project's
    environment: written against the documented TensorRT 10.x/11 API (see the module docstring).

    The network is strongly typed, so the engine computes in the dtypes the ONNX model declares:
    to test FP16, run a converted (Cast-annotated) model, not a builder flag.

    Args:
        model: The ONNX model.
        tf32: Allow TF32 for FP32 matmul/conv (TensorRT's default is on; ours is off).
        name: Label for reports (default ``trt-fp32`` / ``trt-tf32``).
        debug_tensors: Intermediate tensor names to return from ``run`` too, or ``"all"``.
        debug_mode: ``auto`` (``mark_debug`` + ``IDebugListener`` when possible) or ``outputs``
            (mark them as network outputs).
        profile: Input name -> (min, opt, max) shapes; by default built from the first feed's
            shapes and widened (engine rebuilt) when a later feed falls outside it.
        workspace_bytes: Builder workspace pool limit.
        layer_info_path: Where to write the layer-information JSON after each build.
        engine_path: Where to save the serialized engine after each build.
        verbose: TensorRT logger at VERBOSE instead of WARNING.

    Raises:
        BackendUnavailable: (on ``__enter__``) TensorRT, or device memory support, is missing.
    """

    def __init__(self, model: onnx.ModelProto, *, tf32: bool = False, name: str | None = None,
                 debug_tensors: Sequence[str] | str = (), debug_mode: str = "auto",
                 profile: Profile | None = None, workspace_bytes: int | None = None,
                 layer_info_path: str | Path | None = None, engine_path: str | Path | None = None,
                 optimization_level: int | None = None, verbose: bool = False) -> None:
        if debug_mode not in ("auto", "outputs"):
            raise BackendError(f"debug_mode must be 'auto' or 'outputs', not {debug_mode!r}")
        self.model = model
        self.tf32 = tf32
        self.name = name or ("trt-tf32" if tf32 else "trt-fp32")
        self.debug_request: tuple[str, ...] | str = (
            debug_tensors if isinstance(debug_tensors, str) else tuple(debug_tensors))
        self.debug_mode = debug_mode
        self.layer_info_path = Path(layer_info_path) if layer_info_path else None
        self.engine_path = Path(engine_path) if engine_path else None
        self._options = {"workspace_bytes": workspace_bytes,
                         "optimization_level": optimization_level}
        self._profile: Profile = dict(profile or {})
        self._verbose = verbose
        self._state: dict[str, Any] = {}
        self.debug_via = ""
        self.layer_info: str | None = None

    def __enter__(self) -> TensorRTRunner:
        trt = import_tensorrt()
        cuda = cuda_backend()
        tmp = tempfile.TemporaryDirectory(prefix="precision-doctor-trt-")
        self._state = {"trt": trt, "cuda": cuda, "tmp": tmp, "inputs_mem": {}}
        try:
            level = trt.Logger.VERBOSE if self._verbose else trt.Logger.WARNING
            logger = trt.Logger(level)
            source = ort_model_source(self.model, tmp.name)
            builder, network, parser = parse_network(trt, logger, source)
            outputs = [network.get_output(i).name for i in range(network.num_outputs)]
            marked: list[str] = []
            if self.debug_request:
                request = self.debug_request if self.debug_request == "all" else \
                    list(self.debug_request)
                use_api = self.debug_mode == "auto" and cuda.raw_copies
                marked, self.debug_via = mark_debug_tensors(trt, network, request, use_api)
            self._state.update(logger=logger, builder=builder, network=network, parser=parser,
                               outputs=outputs, debug=marked, stream=cuda.stream())
            dynamic = [m.name for m in self.input_metadata() if m.is_dynamic()]
            if all(n in self._profile for n in dynamic):
                self._build()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        state, self._state = self._state, {}
        for key in ("context", "engine", "runtime", "listener"):
            state.pop(key, None)  # TensorRT objects go before the memory they point into
        cuda = state.get("cuda")
        if cuda is not None:
            for ptr, _ in state.get("inputs_mem", {}).values():
                cuda.free(ptr)
            if state.get("allocator") is not None:
                state["allocator"].release()
            if state.get("stream") is not None:
                cuda.destroy(state["stream"])
        if state.get("tmp") is not None:
            state["tmp"].cleanup()

    def _require(self) -> dict[str, Any]:
        if not self._state:
            raise BackendError(f"{self.name}: use the runner inside a `with` block")
        return self._state

    def input_metadata(self) -> list[TensorMeta]:
        """Network inputs; dynamic dims keep the ONNX ``dim_param`` name (else ``"?"``)."""
        state = self._require()
        trt, network = state["trt"], state["network"]
        onnx_dims = {i.name: [d.dim_param or "?" for d in i.type.tensor_type.shape.dim]
                     for i in self.model.graph.input}
        metas = []
        for i in range(network.num_inputs):
            tensor = network.get_input(i)
            names = onnx_dims.get(tensor.name, [])
            shape = tuple(int(d) if d >= 0 else (names[k] if k < len(names) else "?")
                          for k, d in enumerate(tensor.shape))
            metas.append(TensorMeta(tensor.name, np_dtype(trt, tensor.dtype), shape))
        return metas

    def output_names(self) -> list[str]:
        """The model outputs, then the marked debug tensors."""
        state = self._require()
        return list(state["outputs"]) + list(state["debug"])

    def _build(self) -> None:
        state = self._state
        trt, cuda = state["trt"], state["cuda"]
        plan = build_plan(trt, state["builder"], state["network"], tf32=self.tf32,
                          profile=self._profile, **self._options)
        runtime = trt.Runtime(state["logger"])  # kept alive as long as its engine
        engine = runtime.deserialize_cuda_engine(plan)
        if engine is None:
            raise BackendError(f"{self.name}: the built engine could not be deserialized")
        for key in ("context", "engine", "listener"):
            state.pop(key, None)
        if state.get("allocator") is not None:
            state["allocator"].release()
        context = engine.create_execution_context()
        allocator = make_output_allocator(trt, cuda)
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        io_outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        for out in io_outputs:
            if not context.set_output_allocator(out, allocator):
                raise BackendError(f"{self.name}: cannot set the output allocator of {out!r}")
        listener = None
        if self.debug_via == "debug" and state["debug"]:
            listener = make_debug_listener(trt, cuda)
            context.set_debug_listener(listener)
            for tensor in state["debug"]:
                context.set_tensor_debug_state(tensor, True)
        self.layer_info = engine_layer_info(trt, engine)
        if self.layer_info_path:
            self.layer_info_path.write_text(self.layer_info, encoding="utf-8")
        if self.engine_path:
            self.engine_path.write_bytes(bytes(memoryview(plan)))
        state.update(runtime=runtime, engine=engine, context=context, allocator=allocator,
                     listener=listener, io_outputs=io_outputs)

    def run(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """Run once; returns every name of ``output_names()``.

        Raises:
            InputNameError: Missing or extra inputs.
            InputShapeError: Wrong dtype, or a shape the engine rejects.
            BackendError: TensorRT failed to run.
        """
        state = self._require()
        expected = [m.name for m in self.input_metadata()]
        if sorted(feeds) != sorted(expected):
            raise InputNameError(f"{self.name}: inputs {sorted(feeds)} do not match the model's "
                                 f"{expected}", runner=self.name)
        grown = widen_profile(self._profile, {m.name: tuple(feeds[m.name].shape)
                                              for m in self.input_metadata() if m.is_dynamic()})
        if grown is not None or "engine" not in state:
            self._profile = grown if grown is not None else self._profile
            self._build()
        trt, cuda, engine, context = state["trt"], state["cuda"], state["engine"], state["context"]
        stream, handle = state["stream"], cuda.handle(state["stream"])
        for name in expected:
            array = np.ascontiguousarray(feeds[name])
            want = np_dtype(trt, engine.get_tensor_dtype(name))
            if array.dtype != want:
                raise InputShapeError(f"{self.name}: input {name!r} is {array.dtype}; the engine "
                                      f"expects {want} (convert the data first)", input=name)
            if not context.set_input_shape(name, array.shape):
                raise InputShapeError(f"{self.name}: TensorRT rejects shape {array.shape} for "
                                      f"input {name!r}", input=name)
            ptr = self._input_buffer(name, array.nbytes)
            cuda.h2d(ptr, array, stream)
            context.set_tensor_address(name, ptr)
        if state.get("listener") is not None:
            state["listener"].tensors.clear()
        if not context.execute_async_v3(handle):
            raise BackendError(f"{self.name}: execute_async_v3 failed; see TensorRT's log",
                               runner=self.name)
        cuda.sync(stream)
        results = {}
        for name in state["io_outputs"]:
            ptr, shape = state["allocator"].buffers[name][0], state["allocator"].shapes[name]
            results[name] = np.empty(shape, dtype=np_dtype(trt, engine.get_tensor_dtype(name)))
            cuda.d2h(results[name], ptr, stream)
        cuda.sync(stream)
        if state.get("listener") is not None:
            listener = state["listener"]
            if listener.errors:
                raise BackendError(f"{self.name}: reading debug tensors failed: {listener.errors}")
            results.update(listener.tensors)
        missing = [n for n in self.output_names() if n not in results]
        if missing:
            raise BackendError(f"{self.name}: TensorRT produced no value for {missing[:5]} (a "
                               "debug tensor that was fused away reports nothing)",
                               tensor=missing[0])
        return {n: results[n] for n in self.output_names()}

    def _input_buffer(self, name: str, nbytes: int) -> int:
        state = self._state
        held = state["inputs_mem"].get(name)
        if held is None or held[1] < nbytes:
            if held is not None:
                state["cuda"].free(held[0])
            held = (state["cuda"].malloc(nbytes), nbytes)
            state["inputs_mem"][name] = held
        return held[0]

