"""Module path patterns (no torch), and the float32 hooks and the autocast runner on a small
module: under CPU bfloat16 autocast a hand-written variance after a Linear cancels
catastrophically; the hooked module computes it in float32."""

from __future__ import annotations

import numpy as np
import pytest

from precision_doctor.autocast.hooks import matches, outermost, within
from precision_doctor.errors import BackendError, InputError


def test_patterns_match_one_component_per_star() -> None:
    assert matches("encoder.layer.3.output", "encoder.layer.*.output")
    assert not matches("encoder.layer.3.output.dense", "encoder.layer.*.output")
    assert within("encoder.layer.3.output.dense", "encoder.layer.*.output")
    assert matches("", "") and not matches("stats", "") and within("stats", "")
    assert outermost(["var.proj", "var", "head", "var"]) == ["var", "head"]
    assert outermost(["a.*.b", "a.1.b.c", "a.1"]) == ["a.*.b", "a.1"]


def test_without_torch_the_hooks_say_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from precision_doctor.autocast.hooks import keep_fp32
    from precision_doctor.errors import BackendUnavailable

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(BackendUnavailable, match=r'pip install "precision-doctor\[torch\]"'):
        with keep_fp32(object(), ["x"]):
            pass


def _variance_net():  # torch imported by the caller's importorskip
    import torch

    class Variance(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(16, 16)

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            h = self.proj(h)
            return (h * h).mean(-1) - h.mean(-1) ** 2

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.embed, self.var = torch.nn.Linear(16, 16), Variance()
            with torch.no_grad():
                self.var.proj.bias += 50.0  # mean 50, variance ~0.2: E[h^2] - E[h]^2 cancels

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.var(self.embed(x))

    return Net()


def test_hooks_keep_a_module_in_float32_under_autocast_and_go_away() -> None:
    torch = pytest.importorskip("torch")
    from precision_doctor.autocast.hooks import keep_fp32

    net = _variance_net().eval()
    x = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = net(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            alone = net(x)
            with keep_fp32(net, ["var.proj", "var"]) as hooked:
                kept = net(x)
                assert torch.is_autocast_enabled("cpu")  # restored after the module
            again = net(x)
    assert hooked == ["var"]  # var.proj runs inside var
    assert alone.dtype == torch.bfloat16 and kept.dtype == torch.float32

    def rel(y: torch.Tensor) -> float:
        return float(torch.linalg.norm(y.double() - ref.double()) / torch.linalg.norm(ref))

    assert rel(alone) > 1.0 and rel(kept) < 1e-2  # measured: 41 and 2.4e-3
    assert torch.equal(again, alone)  # the hooks are gone
    assert not net.var._forward_pre_hooks and not net.var._forward_hooks
    with pytest.raises(InputError, match="no submodule of Net is 'head'"):
        with keep_fp32(net, ["head"]):
            pass


def test_hooks_restore_autocast_when_the_module_raises() -> None:
    torch = pytest.importorskip("torch")
    from precision_doctor.autocast.hooks import keep_fp32

    class Boom(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("boom")

    outer = torch.nn.Sequential(torch.nn.Linear(4, 4), Boom())
    with torch.autocast("cpu", dtype=torch.bfloat16), keep_fp32(outer, ["1"]):
        with pytest.raises(ValueError):
            outer(torch.ones(1, 4))
        assert torch.is_autocast_enabled("cpu")


def test_runner_maps_feeds_onto_the_example_call() -> None:
    torch = pytest.importorskip("torch")
    from precision_doctor.autocast.runner import AutocastRunner

    net = _variance_net()
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(2))
    runner = AutocastRunner(net, ((x,), {}), input_names=["x"], output_names=["var"],
                            dtype=None, device="cpu")
    assert runner.name == "torch-fp32-cpu"
    assert [m.name for m in runner.input_metadata()] == ["x"]
    with pytest.raises(BackendError, match="not open"):
        runner.run({"x": x.numpy()})
    with runner:
        out = runner.run({"x": x.numpy()})
        with pytest.raises(InputError, match="lack inputs"):
            runner.run({})
    with torch.no_grad():
        np.testing.assert_array_equal(out["var"], net(x).numpy())
    with pytest.raises(InputError, match="fp16 or bf16"):
        AutocastRunner(net, ((x,), {}), dtype="int8")
