"""``--device``: parsing, the clear error without CUDA, the scope every default session follows,
and the pool of one spawned worker per GPU (tested with fake devices: CI has no GPU)."""

import os
import threading
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from tiny_models import random_samples, transformer_block
from typer.testing import CliRunner

from precision_doctor.cli import app
from precision_doctor.errors import BackendUnavailable, InputError
from precision_doctor.formats import Precision
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners import device as dev
from precision_doctor.runners.base import TensorMeta
from precision_doctor.runners.emulator import EmulatorRunner
from precision_doctor.runners.fake import FakeRunner
from precision_doctor.runners.ort import OrtRunner
from precision_doctor.search.evalpool import SampleRunner, resolve_jobs

HAS_CUDA = dev.cuda_devices()[0] > 0


def test_parse_device():
    assert dev.parse_device("cpu") == (dev.CPU, False)
    assert dev.parse_device("auto") == (None, True)
    assert dev.parse_device(None) == (None, True)
    assert dev.parse_device("cuda") == (dev.Device("cuda"), False)
    assert dev.parse_device("CUDA:1") == (dev.Device("cuda", 1), False)
    assert dev.parse_device("gpu:0")[0] == dev.Device("cuda", 0)
    for bad in ("tpu", "cuda:x", "cuda:-1", "cpu:0"):
        with pytest.raises(InputError, match="cpu, cuda, cuda:N"):
            dev.parse_device(bad)


def test_cuda_options_turn_tf32_off_bound_cudnns_workspace_and_pick_the_device():
    """FP32 reference (TF32 off); cuDNN's exhaustive search within a 32 MiB workspace (the
    heuristic's pick held 4.2 GiB per PP-OCRv4 rec session); on the CPU no options."""
    d = dev.Device("cuda", 1)
    assert d.providers() == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    opts = d.provider_options()[0]
    assert opts["use_tf32"] == "0" and opts["device_id"] == "1"
    assert opts["cudnn_conv_algo_search"] == "EXHAUSTIVE"
    assert opts["cudnn_conv_use_max_workspace"] == "0"
    assert "tf32 off" in d.reference_name() and dev.CPU.reference_name() == "ort-cpu"
    assert dev.CPU.provider_options() == [{}]


def test_layerwise_opens_its_segment_sessions_on_the_callers_device(monkeypatch):
    """compare_layerwise on a (fake) CUDA device: every session it opens sees that device; after
    it, the scope is the caller's."""
    from precision_doctor.layerwise import compare

    seen = []

    def factory(model):
        seen.append(dev.current())
        return OrtRunner(model, ("cpu",))

    model = transformer_block()
    samples = [dict(s.feeds) for s in random_samples((2, 8, 16), 2)]
    monkeypatch.setattr(compare, "batched_samples", lambda m, s, sites, b: s)
    monkeypatch.setattr(dev, "segment_budget", lambda d, b: b)
    cuda = dev.Device("cuda", 0)
    with dev.use(cuda):
        compare.compare_layerwise(model, samples, factory, factory, Precision.FP16, 1e-3,
                                  resident=False)
        assert dev.current() is cuda
    assert seen and all(d is cuda for d in seen)


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is present: the error path cannot be seen")
def test_cuda_asked_for_and_absent_is_one_clear_error():
    assert dev.resolve_device("auto") == dev.CPU
    with pytest.raises(BackendUnavailable, match="onnxruntime-gpu") as info:
        dev.resolve_device("cuda:0")
    assert "--device cuda:0" in str(info.value) and "--device cpu" in str(info.value)

def test_cli_device_cuda_without_cuda_exits_2(tmp_path):
    if HAS_CUDA:
        pytest.skip("a CUDA device is present: the error path cannot be seen")
    path = tmp_path / "m.onnx"
    onnx.save(transformer_block(), path)
    result = CliRunner().invoke(app, ["diagnose", str(path), "--data",
                                      "random:seed=0,count=1,shape=x:2x8x16", "--device",
                                      "cuda", "-q"])
    assert result.exit_code == 2, result.output
    assert "onnxruntime-gpu" in result.output


def test_default_sessions_follow_the_device_scope_in_every_thread():
    model = transformer_block()
    assert OrtRunner(model).providers == ["CPUExecutionProvider"]
    seen = {}
    with dev.use(dev.Device("cuda", 1)):
        r = OrtRunner(model)
        assert r.providers[0] == "CUDAExecutionProvider"
        assert r.provider_options[0]["device_id"] == "1"
        thread = threading.Thread(target=lambda: seen.update(p=OrtRunner(model).providers))
        thread.start()
        thread.join()
        # explicit providers are kept (the noise floor's CPU cross-check)
        assert OrtRunner(model, ("cpu",)).providers == ["CPUExecutionProvider"]
        emu = EmulatorRunner(model, PrecisionPlan(Precision.FP16))
        assert emu.model is model  # built lazily: its session follows the scope on __enter__
    assert seen["p"][0] == "CUDAExecutionProvider"
    assert dev.current() == dev.CPU
    assert OrtRunner(model).providers == ["CPUExecutionProvider"]


def test_cpu_scope_is_the_cpu_path_unchanged():
    model = transformer_block()
    samples = random_samples((2, 8, 16), 2)
    with dev.use(dev.CPU):
        with OrtRunner(model) as r:
            a = r.run(samples[0].feeds)
    with OrtRunner(model, ("cpu",)) as r:
        b = r.run(samples[0].feeds)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


@pytest.fixture
def two_fake_gpus(monkeypatch):
    monkeypatch.setattr(dev, "_probe", (2, ""))


def test_jobs_on_cuda_is_one_worker_per_device(two_fake_gpus):
    assert resolve_jobs("auto", 8, dev.Device("cuda")) == 1  # the pool was measured slower
    assert resolve_jobs(4, 8, dev.Device("cuda")) == 2
    assert resolve_jobs(1, 8, dev.Device("cuda")) == 1
    assert resolve_jobs("auto", 8, dev.Device("cuda", 1)) == 1  # pinned to one GPU
    assert resolve_jobs(2, 1, dev.Device("cuda")) == 1          # one sample
    assert [d.label for d in dev.pool_devices(dev.Device("cuda"), 8)] == ["cuda:0", "cuda:1"]
    with pytest.raises(InputError):
        resolve_jobs("0", 8, dev.Device("cuda"))


class DeviceEcho:
    """A picklable plan -> runner: its output says which device and process ran the sample."""

    def __call__(self, plan: PrecisionPlan, threads: int = 0) -> FakeRunner:
        where = dev.current()

        def fn(feeds):
            return {"y": feeds["x"] * 2, "device": np.array([where.ordinal, os.getpid()]),
                    "kind": np.array([where.is_cuda])}
        return FakeRunner([TensorMeta("x", np.dtype(np.float32), (1, 4))],
                          ["y", "device", "kind"], fn)


def test_spawned_pool_runs_each_worker_on_its_own_device(two_fake_gpus):
    samples = [SimpleNamespace(feeds={"x": np.full((1, 4), i, np.float32)}) for i in range(6)]
    plan = PrecisionPlan(Precision.FP16)
    with SampleRunner(DeviceEcho(), samples, ["y", "device", "kind"], jobs=2,
                      device=dev.Device("cuda")) as runner:
        assert runner.jobs == 2
        got = list(runner.run(plan, range(6)))
    assert [i for i, _ in got] == list(range(6))  # in the search's order
    for i, out in got:
        np.testing.assert_array_equal(out["y"], samples[i].feeds["x"] * 2)
    by_pid = {}
    for _, out in got:
        assert bool(out["kind"][0])
        by_pid.setdefault(int(out["device"][1]), set()).add(int(out["device"][0]))
    assert os.getpid() not in by_pid
    assert all(len(d) == 1 for d in by_pid.values())  # a worker keeps its device
    assert set().union(*by_pid.values()) <= {0, 1}


def test_unpicklable_evaluation_on_a_gpu_pool_says_what_to_do(two_fake_gpus):
    samples = [SimpleNamespace(feeds={"x": np.zeros((1, 4), np.float32)}) for _ in range(2)]

    def local_opener(plan, threads=0):  # a closure: cannot reach a spawned worker
        return DeviceEcho()(plan)

    from precision_doctor.errors import BackendError
    with SampleRunner(local_opener, samples, ["y"], jobs=2, device=dev.Device("cuda")) as r:
        with pytest.raises(BackendError, match="--jobs 1"):
            list(r.run(PrecisionPlan(Precision.FP16), [0, 1]))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs an NVIDIA GPU with onnxruntime-gpu")
def test_diagnose_on_cuda_gives_the_cpu_answer():
    import precision_doctor as pd

    model = transformer_block()
    samples = random_samples((2, 8, 16), 2)
    cpu = pd.diagnose(model, samples, device="cpu", quiet=True)
    gpu = pd.diagnose(model, samples, device="cuda", quiet=True)
    assert gpu.reference.startswith("ort-cuda") and cpu.reference == "ort-cpu"
    assert gpu.verdict == cpu.verdict
    for a, b in zip(cpu.outputs, gpu.outputs):
        assert b.metrics.rel_l2 <= 1.1 * a.metrics.rel_l2 + 1e-6


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs an NVIDIA GPU with onnxruntime-gpu")
def test_layerwise_statistics_on_the_gpu_equal_the_host_ones():
    from precision_doctor.layerwise.candidates import emulated, reference_factory
    from precision_doctor.layerwise.compare import compare_layerwise

    model = transformer_block(hot_value=10.0)
    feeds = [dict(s.feeds) for s in random_samples((2, 8, 16), 4)]
    factory = emulated(PrecisionPlan(Precision.FP16)).factory
    with dev.use(dev.Device("cuda", 0)):
        host = compare_layerwise(model, feeds, reference_factory, factory, Precision.FP16, 1e-2,
                                 resident=False)
        resident = compare_layerwise(model, feeds, reference_factory, factory, Precision.FP16,
                                     1e-2, resident=True)
    for a, b in zip(host.records, resident.records):
        assert (a.tensor, a.numel, a.overflow, a.cand_nan) == (b.tensor, b.numel, b.overflow,
                                                               b.cand_nan)
        assert b.rel_l2 == pytest.approx(a.rel_l2, rel=1e-4, abs=1e-9)


def test_what_a_gpu_worker_receives_pickles():
    import pickle

    from precision_doctor.repair.stages import PlanOpener
    from precision_doctor.runners.ort import OrtFactory
    from precision_doctor.runners.ort_options import ort_providers

    model = transformer_block()
    providers, options = ort_providers("ort:cuda,tf32=0")
    for opener in (PlanOpener(model), PlanOpener(model, OrtFactory(tuple(providers),
                                                                   tuple(options), "ort:cuda"))):
        again = pickle.loads(pickle.dumps(opener))
        assert again.model == model and type(again.runner) is type(opener.runner)
    with dev.use(dev.CPU):
        runner = pickle.loads(pickle.dumps(PlanOpener(model)))(PrecisionPlan(Precision.FP16))
        assert isinstance(runner, EmulatorRunner)


def test_gpu_segment_budget_leaves_room_for_the_sessions_and_statistics(monkeypatch):
    """On a GPU a segment's sessions (1.5x their outputs) and statistics (256 MiB) fit
    min(4 GiB, a quarter of the device). The CPU keeps the host budget; a host budget above
    that wins."""
    cuda = dev.Device("cuda", 0)
    monkeypatch.setattr(dev, "_device_memory", lambda ordinal: 80 << 30)
    assert dev.segment_budget(cuda, 256 << 20) == 2560 << 20
    monkeypatch.setattr(dev, "_device_memory", lambda ordinal: 8 << 30)
    assert dev.segment_budget(cuda, 256 << 20) == int(((2048 - 256) << 20) / 1.5)
    assert dev.segment_budget(cuda, 2 << 30) == 2 << 30
    assert dev.segment_budget(dev.CPU, 256 << 20) == 256 << 20
    monkeypatch.setattr(dev, "_device_memory", lambda ordinal: 0)  # the runtime cannot say
    assert dev.segment_budget(cuda, 256 << 20) == 256 << 20
