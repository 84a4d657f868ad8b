"""``--device auto`` by workload (``api.device``): a few samples of a small model stay on the
CPU even where a GPU answers; explicit ``cuda`` and large models go to the GPU. A fake probe
stands in for the GPU (CI has none); no CUDA session is opened."""

import pytest
from tiny_models import random_samples, transformer_block

from precision_doctor.api import device as choice
from precision_doctor.runners import device as dev


@pytest.fixture
def one_fake_gpu(monkeypatch):
    monkeypatch.setattr(dev, "_probe", (1, ""))


def test_auto_keeps_a_small_workload_on_the_cpu(one_fake_gpu):
    samples = random_samples((2, 8, 16), 3)
    where, note = choice.choose_device("auto", transformer_block(), samples)
    assert where == dev.CPU
    assert "--device auto ran on the CPU, not cuda:0" in note and "3 sample(s)" in note
    assert "--device cuda" in note  # how to force the GPU


def test_auto_takes_the_gpu_when_the_reference_would_cost(one_fake_gpu, monkeypatch):
    monkeypatch.setattr(choice, "AUTO_CPU_SECONDS", 0.0)
    where, note = choice.choose_device(None, transformer_block(), random_samples((2, 8, 16), 2))
    assert where == dev.Device("cuda", 0) and note is None


def test_explicit_devices_and_large_models_are_not_estimated(one_fake_gpu, monkeypatch):
    def boom(*_):
        raise AssertionError("no estimate expected")
    monkeypatch.setattr(choice, "cpu_reference_seconds", boom)
    model, samples = transformer_block(), random_samples((2, 8, 16), 2)
    assert choice.choose_device("cuda", model, samples) == (dev.Device("cuda"), None)
    assert choice.choose_device("cpu", model, samples) == (dev.CPU, None)
    monkeypatch.setattr(choice, "small_in_memory", lambda m: False)  # e.g. external weights
    assert choice.choose_device("auto", model, samples) == (dev.Device("cuda", 0), None)


def test_without_a_gpu_auto_is_the_cpu_without_an_estimate(monkeypatch):
    monkeypatch.setattr(dev, "_probe", (0, "no GPU"))
    monkeypatch.setattr(choice, "cpu_reference_seconds", lambda *_: 1 / 0)
    assert choice.choose_device("auto", transformer_block(),
                                random_samples((2, 8, 16), 2)) == (dev.CPU, None)


def test_auto_keeps_the_gpu_when_the_cpu_cannot_run_the_model(one_fake_gpu, monkeypatch):
    from precision_doctor.errors import BackendError

    def cannot(*_):
        raise BackendError("ort-cpu: no kernel")
    monkeypatch.setattr(choice, "cpu_reference_seconds", cannot)
    assert choice.choose_device("auto", transformer_block(),
                                random_samples((2, 8, 16), 2)) == (dev.Device("cuda", 0), None)
