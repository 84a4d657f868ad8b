"""TensorRTRunner: absence handling (runs here), the build sequence against a small fake
``tensorrt`` module, and real-TensorRT tests that skip where TensorRT is not installed."""

from __future__ import annotations

import ctypes
import importlib.util
import sys
import types

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from precision_doctor.errors import BackendError, BackendUnavailable
from precision_doctor.runners import tensorrt as trt_runner
from precision_doctor.runners.tensorrt import (
    TensorRTRunner,
    build_plan,
    mark_debug_tensors,
    parse_network,
    widen_profile,
)
from precision_doctor.runners.trt_cuda import (
    CudaRuntime,
    capsule_pointer,
    make_debug_listener,
    make_output_allocator,
)

HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None


def tiny_model() -> onnx.ModelProto:
    """x[batch,4] -> Relu -> r -> Neg -> y."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("Neg", ["r"], ["y"], name="neg")], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def fake_tensorrt(version: str = "10.9.0", tf32_flag: bool = True) -> types.ModuleType:
    """The few TensorRT names the build path touches; every call lands in ``trt.calls``."""
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    calls: list[tuple] = []
    trt.calls = calls
    trt.float32, trt.float16 = "float32", "float16"
    trt.nptype = lambda dtype: np.dtype(dtype)
    trt.NetworkDefinitionCreationFlag = types.SimpleNamespace(STRONGLY_TYPED=1)
    trt.BuilderFlag = types.SimpleNamespace(**({"TF32": "TF32"} if tf32_flag else {}))
    trt.ProfilingVerbosity = types.SimpleNamespace(DETAILED="DETAILED")
    trt.MemoryPoolType = types.SimpleNamespace(WORKSPACE="WORKSPACE")
    trt.Logger = type("Logger", (), {"WARNING": 2, "VERBOSE": 4, "__init__": lambda s, level: None})
    rec = lambda name: (lambda *args: calls.append((name, *args)) or True)  # noqa: E731

    def tensor(name, shape):
        return types.SimpleNamespace(name=name, shape=shape, dtype="float32")

    class Network:
        def __init__(self):
            self.inputs, self.layers, self.outputs = [], [], []
            self.mark_debug, self.mark_output = rec("mark_debug"), rec("mark_output")
        num_inputs = property(lambda s: len(s.inputs))
        num_layers = property(lambda s: len(s.layers))
        num_outputs = property(lambda s: len(s.outputs))
        get_input = lambda s, i: s.inputs[i]  # noqa: E731
        get_layer = lambda s, i: s.layers[i]  # noqa: E731
        get_output = lambda s, i: s.outputs[i]  # noqa: E731

    class Parser:
        def __init__(self, network, logger):
            self.network, self.num_errors = network, 0

        def parse(self, data):
            calls.append(("parse", type(data).__name__))
            graph = onnx.load_from_string(data).graph
            dims = lambda v: [d.dim_value or -1 for d in v.type.tensor_type.shape.dim]  # noqa
            self.network.inputs = [tensor(v.name, dims(v)) for v in graph.input]
            for node in graph.node:
                outs = [tensor(o, [-1, 4]) for o in node.output]
                self.network.layers.append(types.SimpleNamespace(
                    num_outputs=len(outs), get_output=outs.__getitem__))
            self.network.outputs = [tensor(v.name, dims(v)) for v in graph.output]
            return True

    class Builder:
        def __init__(self, logger):
            self.create_optimization_profile = lambda: types.SimpleNamespace(
                set_shape=rec("profile.set_shape"))
            self.build_serialized_network = lambda net, cfg: calls.append(("build",)) or b"plan"

        def create_network(self, flags):
            calls.append(("create_network", flags))
            return Network()

        def create_builder_config(self):
            config = types.SimpleNamespace(set_flag=rec("set_flag"), clear_flag=rec("clear_flag"),
                                           set_memory_pool_limit=rec("set_memory_pool_limit"),
                                           add_optimization_profile=rec("add_profile"))
            calls.append(("config", config))
            return config

    trt.Builder, trt.OnnxParser = Builder, Parser
    return trt


def test_missing_tensorrt_raises_backend_unavailable_with_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # makes `import tensorrt` fail
    runner = TensorRTRunner(tiny_model())  # constructing is cheap and imports nothing
    with pytest.raises(BackendUnavailable, match=r"pip install 'precision-doctor\[tensorrt\]'"):
        runner.__enter__()


def test_old_tensorrt_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt(version="8.6.1"))
    with pytest.raises(BackendUnavailable, match="needs >= 10"):
        trt_runner.import_tensorrt()


def test_no_device_memory_library_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt())
    for name in ("cuda", "cuda.bindings", "torch"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(BackendUnavailable, match="cuda-python"):
        TensorRTRunner(tiny_model()).__enter__()


def test_build_sequence_is_strongly_typed_with_tf32_cleared_and_a_profile():
    trt = fake_tensorrt()
    builder, network, _ = parse_network(trt, trt.Logger(2), tiny_model().SerializeToString())
    marked, via = mark_debug_tensors(trt, network, ["r"])
    plan = build_plan(trt, builder, network, tf32=False, workspace_bytes=1 << 30,
                      profile={"x": ((1, 4), (2, 4), (8, 4))})
    names = [c[0] for c in trt.calls]
    assert ("create_network", 1 << 1) in trt.calls  # 1 << int(STRONGLY_TYPED)
    assert ("parse", "bytes") in trt.calls
    assert (marked, via) == (["r"], "debug") and names.count("mark_debug") == 1
    assert ("clear_flag", "TF32") in trt.calls and "set_flag" not in names
    config = next(c[1] for c in trt.calls if c[0] == "config")
    assert config.profiling_verbosity == "DETAILED"
    assert ("set_memory_pool_limit", "WORKSPACE", 1 << 30) in trt.calls
    assert ("profile.set_shape", "x", (1, 4), (2, 4), (8, 4)) in trt.calls
    assert names[-1] == "build" and plan == b"plan"


def test_tf32_on_sets_the_flag_and_trt11_without_flags_still_builds():
    trt = fake_tensorrt()
    builder, network, _ = parse_network(trt, trt.Logger(2), tiny_model().SerializeToString())
    build_plan(trt, builder, network, tf32=True, profile={})
    assert ("set_flag", "TF32") in trt.calls
    trt11 = fake_tensorrt(version="11.1.0", tf32_flag=False)
    trt11.NetworkDefinitionCreationFlag = types.SimpleNamespace()  # flag gone: plain network
    builder, network, _ = parse_network(trt11, trt11.Logger(2), tiny_model().SerializeToString())
    build_plan(trt11, builder, network, tf32=False, profile={})
    names = [c[0] for c in trt11.calls]
    assert ("create_network", 0) in trt11.calls and "clear_flag" not in names


def test_debug_marking_falls_back_to_outputs_and_rejects_unknown_names():
    trt = fake_tensorrt()
    _, network, _ = parse_network(trt, trt.Logger(2), tiny_model().SerializeToString())
    assert mark_debug_tensors(trt, network, "all", use_debug_api=False) == (["r"], "outputs")
    with pytest.raises(BackendError, match="no such tensor"):
        mark_debug_tensors(trt, network, ["nope"])


def test_enter_defers_the_build_for_dynamic_inputs_and_reports_metadata(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt())
    cuda = types.SimpleNamespace(raw_copies=True, stream=lambda: "stream",
                                 destroy=lambda s: None)
    monkeypatch.setattr(trt_runner, "cuda_backend", lambda: cuda)
    with TensorRTRunner(tiny_model(), debug_tensors=["r"]) as runner:
        (meta,) = runner.input_metadata()
        assert (meta.name, meta.shape, meta.dtype) == ("x", ("batch", 4), np.float32)
        assert runner.output_names() == ["y", "r"] and runner.debug_via == "debug"
    builds = [c for c in sys.modules["tensorrt"].calls if c[0] == "build"]
    assert builds == []  # no feed yet, so no profile and no engine


def test_widen_profile_grows_min_and_max_and_keeps_covered_shapes():
    profile = {"x": ((2, 4), (2, 4), (2, 4))}
    assert widen_profile(profile, {"x": (2, 4)}) is None
    assert widen_profile(profile, {"x": (8, 4)}) == {"x": ((2, 4), (8, 4), (8, 4))}
    assert widen_profile({}, {"x": (1, 4)}) == {"x": ((1, 4), (1, 4), (1, 4))}


class HostAsDevice:
    """Stands in for the CUDA backend with host memory, so the callbacks run without a GPU."""

    raw_copies = True

    def __init__(self):
        self.blocks = {}

    def malloc(self, nbytes):
        block = np.zeros(max(nbytes, 1), dtype=np.uint8)
        self.blocks[block.ctypes.data] = block
        return block.ctypes.data

    def free(self, ptr):
        del self.blocks[ptr]

    def d2h(self, array, ptr, stream):
        ctypes.memmove(array.ctypes.data, ptr, array.nbytes)

    def sync(self, stream):
        return None


def callback_trt() -> types.SimpleNamespace:
    base = type("Base", (), {"__init__": lambda self: None})
    return types.SimpleNamespace(IOutputAllocator=base, IDebugListener=base, bfloat16=None,
                                 nptype=np.dtype, TensorLocation=types.SimpleNamespace(
                                     HOST="host", DEVICE="device"))


def test_debug_listener_copies_device_tensors_and_keeps_errors():
    cuda = HostAsDevice()
    listener = make_debug_listener(callback_trt(), cuda)
    produced = np.arange(6, dtype=np.float16).reshape(2, 3)
    assert listener.process_debug_tensor(produced.ctypes.data, "device", "float16", [2, 3],
                                         "r", 0)
    np.testing.assert_array_equal(listener.tensors["r"], produced)
    listener.process_debug_tensor(0, "device", "fp8-no-numpy", [1], "bad", 0)
    assert "bad" in listener.errors


def test_output_allocator_grows_buffers_and_records_shapes():
    cuda = HostAsDevice()
    allocator = make_output_allocator(callback_trt(), cuda)
    first = allocator.reallocate_output("y", None, 16, 256)
    assert allocator.reallocate_output_async("y", first, 8, 256, 0) == first
    bigger = allocator.reallocate_output("y", first, 64, 256)
    assert allocator.buffers["y"] == (bigger, 64) and first not in cuda.blocks
    allocator.notify_shape("y", [4, 4])
    assert allocator.shapes["y"] == (4, 4)
    allocator.release()
    assert cuda.blocks == {}


def test_cuda_runtime_raises_on_cuda_errors_and_capsules_become_ints():
    errors = types.SimpleNamespace(cudaSuccess=0)
    cudart = types.SimpleNamespace(cudaError_t=errors, cudaMalloc=lambda n: (2, 0),
                                   cudaStreamCreate=lambda: (0, 7))
    runtime = CudaRuntime(cudart)
    assert runtime.stream() == 7
    with pytest.raises(BackendError, match="CUDA runtime error: 2"):
        runtime.malloc(10)
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    assert capsule_pointer(new(1234, None, None)) == 1234 and capsule_pointer(99) == 99


@pytest.mark.tensorrt
@pytest.mark.skipif(not HAS_TENSORRT, reason="TensorRT is not installed (cannot be here)")
def test_real_tensorrt_matches_numpy_and_exports_layer_info(tmp_path):
    x = np.array([[-1.0, 2.0, -3.0, 4.0]] * 2, dtype=np.float32)
    info = tmp_path / "layers.json"
    with TensorRTRunner(tiny_model(), debug_tensors=["r"], layer_info_path=info) as runner:
        out = runner.run({"x": x})
        out_bigger = runner.run({"x": np.concatenate([x, x])})  # widens the profile
    np.testing.assert_allclose(out["y"], -np.maximum(x, 0))
    np.testing.assert_allclose(out["r"], np.maximum(x, 0))
    assert out_bigger["y"].shape == (4, 4)
    assert '"Layers"' in info.read_text()
