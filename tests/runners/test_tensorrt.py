"""The TensorRT adapter over Polygraphy's backend: absence handling and the argument mapping,
tested here with Polygraphy installed and a fake ``tensorrt`` module (TensorRT cannot be
installed in this workplace); a real-TensorRT test skips where TensorRT is absent."""

from __future__ import annotations

import importlib.util
import json
import sys
import types

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from precision_doctor.errors import BackendError, BackendUnavailable
from precision_doctor.formats import Precision
from precision_doctor.layerwise.candidates import candidate_from_spec
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners import tensorrt as adapter
from precision_doctor.runners.ort import OrtRunner
from precision_doctor.runners.tensorrt import TensorRTRunner, engine_loader, widen_profile

HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None


def tiny_model() -> onnx.ModelProto:
    """x[batch,4] -> Relu -> r -> Neg -> y."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("Neg", ["r"], ["y"], name="neg")], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def fake_tensorrt(version: str = "10.9.0", strongly_typed: bool = True) -> types.ModuleType:
    """The TensorRT names the adapter itself touches (enums only)."""
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    trt.NetworkDefinitionCreationFlag = types.SimpleNamespace(
        **({"STRONGLY_TYPED": 1} if strongly_typed else {}), EXPLICIT_BATCH=0)
    trt.MemoryPoolType = types.SimpleNamespace(WORKSPACE="WORKSPACE")
    trt.ProfilingVerbosity = types.SimpleNamespace(DETAILED="DETAILED")
    trt.LayerInformationFormat = types.SimpleNamespace(JSON="JSON")
    return trt


def test_missing_tensorrt_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # makes `import tensorrt` fail
    runner = TensorRTRunner(tiny_model())  # constructing is cheap and imports nothing
    with pytest.raises(BackendUnavailable, match=r"pip install 'precision-doctor\[tensorrt\]'"):
        runner.__enter__()
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt())
    monkeypatch.setitem(sys.modules, "polygraphy.backend.trt", None)
    if importlib.util.find_spec("polygraphy") is not None:  # an earlier import set the attr
        import polygraphy.backend

        monkeypatch.delattr(polygraphy.backend, "trt", raising=False)
    with pytest.raises(BackendUnavailable, match="Polygraphy is not installed"):
        adapter.load_backend()


def test_real_polygraphy_loaders_get_strongly_typed_tf32_off_and_the_feed_profile(monkeypatch):
    backend = pytest.importorskip("polygraphy.backend.trt")
    trt = fake_tensorrt()
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    loader = engine_loader(trt, backend, "m.onnx", {"x": ((1, 4), (2, 4), (8, 4))}, tf32=False,
                           workspace_bytes=1 << 30, engine_path="m.plan")
    assert isinstance(loader, backend.SaveEngine)
    build = loader._engine
    assert isinstance(build, backend.EngineFromNetwork)
    network, config = build._network, build._config
    assert isinstance(network, backend.NetworkFromOnnxPath)
    assert network.path == "m.onnx" and network.strongly_typed is True
    assert isinstance(config, backend.CreateConfig)
    assert (config.tf32, config.fp16) == (False, False)
    assert config.profiling_verbosity == "DETAILED"
    assert config.memory_pool_limits == {"WORKSPACE": 1 << 30}
    (profile,) = config.profiles
    shape = profile["x"]
    assert (tuple(shape.min), tuple(shape.opt), tuple(shape.max)) == ((1, 4), (2, 4), (8, 4))


def test_weakly_typed_tensorrt_takes_the_fp16_flag_and_strong_typing_refuses_it(monkeypatch):
    backend = pytest.importorskip("polygraphy.backend.trt")
    old = fake_tensorrt("8.6.1", strongly_typed=False)
    monkeypatch.setitem(sys.modules, "tensorrt", old)
    build = engine_loader(old, backend, "m.onnx", {}, tf32=True, fp16=True)
    assert build._network.strongly_typed is False and build._config.fp16 is True
    assert build._config.tf32 is True  # static shapes: no profile entries of ours
    assert all(len(p) == 0 for p in build._config.profiles)
    with pytest.raises(BackendError, match="strongly typed network takes its precision"):
        engine_loader(fake_tensorrt(), backend, "m.onnx", {}, tf32=False, fp16=True)


class FakeBackend:
    """Stands in for ``polygraphy.backend.trt``: records the loader chain; the "engine" runs
    the ONNX file with ONNX Runtime so outputs are real numbers."""

    def __init__(self):
        self.built = []
        self.deactivated = 0
        outer = self

        class Runner:
            def __init__(self, loader, name=None):
                self.loader, self.name = loader, name
                outer.built.append(loader)

            def activate(self):
                self.ort = OrtRunner(onnx.load(self.loader["path"])).__enter__()
                inspector = types.SimpleNamespace(get_engine_information=lambda fmt: json.dumps(
                    {"Layers": ["relu", "neg"], "format": fmt}))
                self.engine = types.SimpleNamespace(create_engine_inspector=lambda: inspector)
                self.context = "context"

            def deactivate(self):
                self.ort.__exit__()
                outer.deactivated += 1

            def infer(self, feeds):
                return self.ort.run(feeds)

        self.TrtRunner = Runner


def test_runner_builds_on_first_feed_and_rebuilds_with_a_wider_profile(monkeypatch, tmp_path):
    fake = FakeBackend()
    monkeypatch.setattr(adapter, "load_backend", lambda: (fake_tensorrt(), fake))
    monkeypatch.setattr(adapter, "engine_loader", lambda trt, backend, path, profile, **kw: {
        "path": path, "profile": dict(profile), **kw})
    x = np.array([[-1.0, 2.0, -3.0, 4.0]] * 2, dtype=np.float32)
    info = tmp_path / "layers.json"
    with TensorRTRunner(tiny_model(), tf32=True, layer_info_path=info) as runner:
        assert runner.name == "trt-tf32" and runner.output_names() == ["y"]
        out = runner.run({"x": x})
        runner.run({"x": x})  # same shape: no rebuild
        bigger = runner.run({"x": np.concatenate([x, x])})
    np.testing.assert_allclose(out["y"], -np.maximum(x, 0))
    assert bigger["y"].shape == (4, 4)
    first, second = fake.built
    assert first["profile"] == {"x": ((2, 4), (2, 4), (2, 4))} and first["tf32"] is True
    assert second["profile"] == {"x": ((2, 4), (4, 4), (4, 4))}
    assert fake.deactivated == 2
    assert json.loads(info.read_text())["format"] == "JSON"


def test_widen_profile_grows_min_and_max_and_keeps_covered_shapes():
    profile = {"x": ((2, 4), (2, 4), (2, 4))}
    assert widen_profile(profile, {"x": (2, 4)}) is None
    assert widen_profile(profile, {"x": (8, 4)}) == {"x": ((2, 4), (8, 4), (8, 4))}
    assert widen_profile({}, {"x": (1, 4)}) == {"x": ((1, 4), (1, 4), (1, 4))}


def test_trt_runner_spec_maps_to_the_adapter():
    plan = PrecisionPlan(Precision.FP16)
    cand = candidate_from_spec("trt:tf32=1,strongly_typed=0", plan, tiny_model())
    runner = cand.factory(tiny_model())
    assert cand.tf32 is True and isinstance(runner, TensorRTRunner)
    assert runner.options["strongly_typed"] is False
    with pytest.raises(BackendError, match="bad TensorRT option 'int8=1'"):
        candidate_from_spec("trt:int8=1", plan, tiny_model())


@pytest.mark.tensorrt
@pytest.mark.skipif(not HAS_TENSORRT, reason="TensorRT is not installed (cannot be here)")
def test_real_tensorrt_matches_numpy_and_exports_layer_info(tmp_path):
    x = np.array([[-1.0, 2.0, -3.0, 4.0]] * 2, dtype=np.float32)
    info = tmp_path / "layers.json"
    with TensorRTRunner(tiny_model(), layer_info_path=info) as runner:
        out = runner.run({"x": x})
        out_bigger = runner.run({"x": np.concatenate([x, x])})  # widens the profile
    np.testing.assert_allclose(out["y"], -np.maximum(x, 0))
    assert out_bigger["y"].shape == (4, 4)
    assert '"Layers"' in info.read_text()
