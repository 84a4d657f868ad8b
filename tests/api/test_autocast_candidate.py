"""``diagnose(module, samples, runner="autocast:fp16")``: the module run under torch.autocast
is the candidate (recorded), the emulated strongly typed model the cross-check, and the report
says which causes autocast avoids, measured (here on the CPU)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from rich.console import Console
from tiny_models import IR_VERSION

import precision_doctor as pd
from precision_doctor.api.autocast import parse_autocast_runner
from precision_doctor.report.terminal.diagnosis import render_diagnosis

torch = pytest.importorskip("torch", reason="needs torch: pip install '.[torch]'")


class Stats(torch.nn.Module):
    """A hand-written mean square: [b, s, 8] -> [b, s]."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return (h * h).mean(-1)


class Net(torch.nn.Module):
    """A Linear, then ``stats``: float32 [b, s, 8] -> [b, s]. Autocast runs the Linear in FP16
    and the product in the dtype of its input: at 1e3 it overflows FP16 under autocast too."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj, self.stats = torch.nn.Linear(8, 8), Stats()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stats(self.proj(x))


def test_autocast_is_a_candidate_and_says_which_causes_it_avoids() -> None:
    g = torch.Generator().manual_seed(1)
    samples = [(torch.randn(1, 4, 8, generator=g) * 1e3,) for _ in range(2)]
    d = pd.diagnose(Net(), samples, runner="autocast:fp16,device=cpu", quiet=True,
                    noise=False)
    assert d.verdict == "fail" and d.candidate == "recorded torch-autocast-fp16-cpu"
    rec = d.recording
    assert rec is not None and rec["engine"] == "PyTorch torch.autocast"
    assert rec["cross_check"]["emulator"] == "emulate-fp16"
    causes = rec["autocast"]["causes"]
    assert causes and rec["autocast"]["dtype"] == "fp16" and rec["autocast"]["device"] == "cpu"
    console = Console(width=80, record=True)
    render_diagnosis(d, console)
    text = console.export_text()
    assert "'torch-autocast-fp16-cpu' (PyTorch torch.autocast)" in text
    assert "autocast does not avoid: stats (activation-overflow)" in text
    assert [c["avoided"] for c in causes if c["module"] == "stats"] == [False]


def test_autocast_runs_a_module_only() -> None:
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    with pytest.raises(pd.InputError, match="runs a torch.nn.Module"):
        pd.diagnose(model, [{"x": np.ones(2, np.float32)}], runner="autocast", quiet=True)


def test_autocast_runner_specs() -> None:
    assert parse_autocast_runner("autocast") == ("", "auto")
    assert parse_autocast_runner("autocast:bf16,device=cuda") == ("bf16", "cuda")
    assert parse_autocast_runner("emulate") is None
    with pytest.raises(pd.InputError, match="expected autocast"):
        parse_autocast_runner("autocast:int8")
