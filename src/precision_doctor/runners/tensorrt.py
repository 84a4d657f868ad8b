"""TensorRT through Polygraphy's maintained backend (extra ``precision-doctor[tensorrt]``).

UNTESTED with real TensorRT (it cannot be installed where this project is built: see
``shared/docs/GPU.md``); the argument mapping is tested with Polygraphy and a fake ``tensorrt``.
Building and running are Polygraphy's (``polygraphy.backend.trt``: ``NetworkFromOnnxPath``,
``CreateConfig``, ``Profile``, ``EngineFromNetwork``, ``SaveEngine``, ``TrtRunner``). The tested
way to analyse TensorRT results is to record them there (``recipe collect``) and analyse the
recording here (``diagnose --candidate-results``).

Ours: the settings (strongly typed when ``NetworkDefinitionCreationFlag.STRONGLY_TYPED`` exists,
so the model's dtypes and Casts decide precision; TF32 off unless asked, as TensorRT enables it
by default and Polygraphy does not; DETAILED profiling verbosity), profiles from the real feed
shapes (rebuilt when a feed falls outside), and the layer information from the engine inspector
(as ``polygraphy inspect model`` reads it) for ``audit``. Intermediate tensors are read by
marking them as ONNX outputs first (``graph.outputs.mark_outputs``), as for every runner.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import onnx

from precision_doctor.errors import BackendError, BackendUnavailable
from precision_doctor.graph.external_files import link_model
from precision_doctor.graph.load import input_metadata
from precision_doctor.runners.base import Feeds, TensorMeta

INSTALL_HINT = ("TensorRT is not installed: pip install 'precision-doctor[tensorrt]' (TensorRT "
                ">= 8.6 and Polygraphy) on a machine with an NVIDIA GPU. Without one, record "
                "the engine's outputs there (precision-doctor recipe collect) and analyse them "
                "here with diagnose --candidate-results.")
Shape = tuple[int, ...]
Profile = dict[str, tuple[Shape, Shape, Shape]]  # input name -> (min, opt, max)


def load_backend() -> tuple[Any, Any]:
    """``(tensorrt, polygraphy.backend.trt)``, imported only when a runner is entered.

    Raises:
        BackendUnavailable: TensorRT or Polygraphy is missing (the message names the extra).
    """
    try:
        import tensorrt
    except ImportError as exc:
        raise BackendUnavailable(INSTALL_HINT, backend="tensorrt") from exc
    try:
        from polygraphy.backend import trt as backend
    except ImportError as exc:
        raise BackendUnavailable("Polygraphy is not installed: pip install "
                                 "'precision-doctor[tensorrt]'", backend="tensorrt") from exc
    return tensorrt, backend


def widen_profile(profile: Profile, shapes: Mapping[str, Shape]) -> Profile | None:
    """The profile extended to cover ``shapes`` (opt = the new shape), or None if it does."""
    grown, changed = dict(profile), False
    for name, shape in shapes.items():
        low, _, high = profile.get(name, (shape, shape, shape))
        if name not in profile or len(low) != len(shape):
            grown[name], changed = (shape, shape, shape), True
        elif any(not lo <= s <= hi for lo, s, hi in zip(low, shape, high)):
            grown[name] = (tuple(map(min, low, shape)), shape, tuple(map(max, high, shape)))
            changed = True
    return grown if changed else None


def engine_loader(trt: Any, backend: Any, onnx_path: str, profile: Profile, *, tf32: bool,
                  strongly_typed: bool | None = None, fp16: bool = False,
                  workspace_bytes: int | None = None, engine_path: str | None = None) -> Any:
    """Polygraphy's loader chain that builds the engine (called lazily by ``TrtRunner``).

    Args:
        trt / backend: ``tensorrt`` and ``polygraphy.backend.trt``.
        onnx_path: The model file; profile: input -> (min, opt, max) for the dynamic inputs.
        tf32: Allow TF32 for FP32 MatMul/Conv. strongly_typed: None = when supported.
        fp16: Builder FP16 flag, weakly typed networks only (TensorRT refuses precision flags
            on strongly typed networks; TensorRT 11 has none).
        workspace_bytes: Workspace pool limit. engine_path: Also save the engine here.

    Raises:
        BackendError: ``fp16`` asked for a strongly typed network.
    """
    if strongly_typed is None:
        strongly_typed = hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED")
    if strongly_typed and fp16:
        raise BackendError("a strongly typed network takes its precision from the model: run "
                           "an FP16 model (precision-doctor fix) instead of the FP16 flag, or "
                           "ask for a weakly typed build (strongly_typed=False, TensorRT < 11)")
    network = backend.NetworkFromOnnxPath(onnx_path, strongly_typed=strongly_typed)
    profiles = [backend.Profile()] if profile else None
    for name, (low, opt, high) in profile.items():
        profiles[0].add(name, min=low, opt=opt, max=high)  # type: ignore[index]
    pools = {trt.MemoryPoolType.WORKSPACE: int(workspace_bytes)} if workspace_bytes else None
    config = backend.CreateConfig(tf32=tf32, fp16=fp16, profiles=profiles,
                                  memory_pool_limits=pools,
                                  profiling_verbosity=trt.ProfilingVerbosity.DETAILED)
    engine = backend.EngineFromNetwork(network, config=config)
    return backend.SaveEngine(engine, engine_path) if engine_path else engine


class TensorRTRunner:
    """A TensorRT engine built from an ONNX model by Polygraphy. UNTESTED with real TensorRT.

    Args:
        model: The ONNX model (mark intermediate tensors as outputs beforehand to read them).
        tf32 / strongly_typed / fp16 / workspace_bytes / engine_path: See ``engine_loader``.
        name: Label for reports (default ``trt-fp32`` / ``trt-tf32``).
        layer_info_path: Write the engine's layer information JSON here after each build.

    Raises:
        BackendUnavailable: (on ``__enter__``) TensorRT or Polygraphy is missing.
    """

    def __init__(self, model: onnx.ModelProto, *, tf32: bool = False,
                 strongly_typed: bool | None = None, fp16: bool = False,
                 name: str | None = None, workspace_bytes: int | None = None,
                 layer_info_path: str | Path | None = None,
                 engine_path: str | Path | None = None) -> None:
        self.model = model
        self.name = name or ("trt-tf32" if tf32 else "trt-fp32")
        self.options: dict[str, Any] = {
            "tf32": tf32, "strongly_typed": strongly_typed, "fp16": fp16,
            "workspace_bytes": workspace_bytes,
            "engine_path": str(engine_path) if engine_path else None}
        self.layer_info_path = Path(layer_info_path) if layer_info_path else None
        self._inputs = input_metadata(model)
        self._profile: Profile = {}
        self._state: dict[str, Any] = {}

    def __enter__(self) -> TensorRTRunner:
        trt, backend = load_backend()
        tmp = tempfile.TemporaryDirectory(prefix="precision-doctor-trt-")
        # relative data files beside the model, large in-memory weights in a data file of
        # their own: what TensorRT's ONNX parser can open (graph.external_files.link_model)
        path = str(link_model(self.model, Path(tmp.name)))
        self._state = {"trt": trt, "backend": backend, "tmp": tmp, "path": path}
        return self

    def __exit__(self, *exc: object) -> None:
        state, self._state = self._state, {}
        if state.get("runner") is not None:
            state["runner"].deactivate()
        if state.get("tmp") is not None:
            state["tmp"].cleanup()

    def input_metadata(self) -> list[TensorMeta]:
        return list(self._inputs)

    def output_names(self) -> list[str]:
        return [o.name for o in self.model.graph.output]

    def run(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """Run once; (re)builds the engine when a feed shape is outside the profile.

        Raises:
            BackendError: Not entered, or TensorRT/Polygraphy failed (its message is kept).
        """
        if not self._state:
            raise BackendError(f"{self.name}: use the runner inside a `with` block")
        dynamic = {m.name for m in self._inputs if m.is_dynamic()}
        grown = widen_profile(self._profile, {k: tuple(np.shape(v)) for k, v in feeds.items()
                                              if k in dynamic})
        state = self._state
        try:
            if grown is not None or state.get("runner") is None:
                self._profile = grown if grown is not None else self._profile
                if state.get("runner") is not None:
                    state.pop("runner").deactivate()
                loader = engine_loader(state["trt"], state["backend"], state["path"],
                                       self._profile, **self.options)
                state["runner"] = state["backend"].TrtRunner(loader, name=self.name)
                state["runner"].activate()
                self._write_layer_info()
            outputs = state["runner"].infer(dict(feeds))
        except BackendError:
            raise
        except Exception as exc:  # noqa: BLE001 - TensorRT/Polygraphy raise many types
            raise BackendError(f"{self.name}: TensorRT via Polygraphy failed: {exc}",
                               runner=self.name) from exc
        return {n: np.asarray(outputs[n]) for n in self.output_names()}

    def _write_layer_info(self) -> None:
        """The engine's layer information (``IEngineInspector`` JSON, the format of trtexec
        ``--exportLayerInfo``) to ``layer_info_path``."""
        if self.layer_info_path is None:
            return
        trt, runner = self._state["trt"], self._state["runner"]
        inspector = runner.engine.create_engine_inspector()
        inspector.execution_context = runner.context
        self.layer_info_path.write_text(str(inspector.get_engine_information(
            trt.LayerInformationFormat.JSON)), encoding="utf-8")


__all__ = ["INSTALL_HINT", "TensorRTRunner", "engine_loader", "load_backend", "widen_profile"]
