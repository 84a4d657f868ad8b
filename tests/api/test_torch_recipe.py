"""``fix(module, samples)``'s PyTorch recipe (``report["torch"]``: the FP32 modules, a
standalone hook snippet, the module's error under ``torch.autocast`` with and without it) and
``compare_autocast``, measured on the CPU with bfloat16 (FP16 on the CPU too, for the
overflow of ``test_pytorch.Stats``)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import precision_doctor as pd
from precision_doctor.api import TorchRecipe, compare_autocast, torch_recipe
from precision_doctor.api.pytorch_recipe import recipe_snippet
from precision_doctor.graph.source import Source
from precision_doctor.jsonable import dumps
from precision_doctor.report.terminal.sources import fix_lines

torch = pytest.importorskip("torch", reason="needs torch: pip install '.[torch]'")


@pytest.fixture(scope="module", autouse=True)
def _on_the_cpu():
    """The recipe is measured where autocast runs by default (CUDA when a GPU is visible):
    these figures are the CPU's, so the GPU is hidden here."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.cuda, "is_available", lambda: False)
        yield


class Variance(torch.nn.Module):
    """A hand-written variance of a Linear's output, E[h^2] - E[h]^2: [b, s, 16] -> [b, s]."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = self.proj(h)
        return (h * h).mean(-1) - h.mean(-1) ** 2


class Net(torch.nn.Module):
    """Linear, then the variance of features whose mean is ~50 and variance ~0.2: BF16
    autocast rounds h (ulp 0.25) and h * h (ulp 16), and the difference cancels."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.var = torch.nn.Linear(16, 16), Variance()
        with torch.no_grad():
            self.var.proj.bias += 50.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.var(self.embed(x))


def samples() -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(2, n, 16, generator=g),) for n in (5, 7, 9)]


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float(torch.linalg.norm(y.double() - ref.double()) / torch.linalg.norm(ref.double()))


@pytest.fixture(scope="module")
def fixed() -> pd.Fix:
    return pd.fix(Net(), samples(), target="bf16", quiet=True)


def test_fix_of_a_module_gives_an_autocast_recipe_that_meets_the_target(fixed: pd.Fix) -> None:
    t = fixed.report["torch"]
    assert fixed.passed and t["fp32_modules"] == ["var"]  # var.proj's Linear inside var
    assert set(t["groups"]) == {"var", "var.proj"}
    assert sorted(n for g in t["groups"].values() for n in g) == fixed.fp32_nodes
    assert (t["autocast_dtype"], t["device"], t["tolerance"]) == ("bf16", "cpu", {"sub_6": 0.08})
    # measured: autocast alone 39 (the cancellation), with the recipe 2.9e-3; the ONNX
    # plan's emulated error 3.9e-3
    assert t["autocast_alone_rel_l2"]["sub_6"] > 1.0
    assert t["autocast_rel_l2"]["sub_6"] < 1e-2 and t["passed"] is True
    assert t["plan_rel_l2"]["sub_6"] == fixed.report["after"]["sub_6"]["rel_l2"]
    recipe = torch_recipe(fixed)
    assert recipe == TorchRecipe.from_dict(json.loads(json.dumps(t)))
    assert recipe.passed and recipe.snippet() == t["snippet"]


def test_the_recipe_and_its_snippet_cure_the_module_under_autocast(fixed: pd.Fix) -> None:
    recipe, net = torch_recipe(fixed), Net().eval()
    namespace: dict = {}
    exec(compile(recipe.snippet(), "recipe.py", "exec"), namespace)  # standalone: torch only
    assert namespace["FP32_MODULES"] == ["var"]
    assert 'torch.autocast("cpu", dtype=torch.bfloat16)' in recipe.snippet()
    for (x,) in samples():
        with torch.no_grad():
            ref = net(x)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                alone = net(x)
                with recipe.apply(net) as hooked:
                    kept = net(x)
                with namespace["keep_fp32"](net):
                    snipped = net(x)
        assert hooked == ["var"] and torch.equal(kept, snipped)
        assert _rel(alone, ref) > 0.08 >= _rel(kept, ref)
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in net.modules())


def test_save_writes_the_snippet_next_to_the_model(fixed: pd.Fix, tmp_path: Path) -> None:
    written = fixed.save(tmp_path / "net_bf16.onnx")
    report = json.loads(written["report"].read_text())
    assert report["torch"]["fp32_modules"] == ["var"]
    assert written["torch"] == tmp_path / "net_bf16.torch.py"
    assert written["torch"].read_text() == report["torch"]["snippet"]
    with pytest.raises(pd.OutputExistsError):
        fixed.save(tmp_path / "net_bf16.onnx")


def test_the_terminal_and_html_show_the_recipe(fixed: pd.Fix, tmp_path: Path) -> None:
    lines = fix_lines(fixed.result, fixed.report["torch"], 80)
    assert lines[0] == "Keep in FP32, by module: var"
    assert "PyTorch recipe (*.torch.py): keep var in float32 under autocast BF16 (cpu)" in lines
    assert lines[1].startswith("  var at test_torch_recipe.py:")  # var.proj inside var
    assert any(line.startswith("  sub_6: rel L2 ") and "(ONNX plan " in line for line in lines)
    assert max(map(len, lines)) <= 80
    fixed.to_html(tmp_path / "fix.html")
    html = (tmp_path / "fix.html").read_text()
    assert "<h3>PyTorch recipe</h3>" in html and "FP32_MODULES = [&#39;var&#39;]" in html


def test_recipe_of_patterns_and_of_an_onnx_fix() -> None:
    assert torch_recipe(["a.*.norm", "a.1.norm.inner"]).fp32_modules == ("a.*.norm",)
    with pytest.raises(pd.InputError, match="comes with fix\\(module, samples\\)"):
        torch_recipe({"schema": "precision-doctor/fix"})
    with pytest.raises(pd.InputError, match="fp16 or bf16"):
        recipe_snippet(["x"], dtype="int8")
    text = recipe_snippet([""], dtype="fp16", device="cuda:1")
    assert "FP32_MODULES = ['']" in text and 'torch.autocast("cuda", dtype=torch.float16)' in text


def test_compare_autocast_says_which_causes_autocast_avoids() -> None:
    from test_pytorch import Net as OverflowNet
    from test_pytorch import samples as large_samples

    d = pd.diagnose(Net(), samples(), target="bf16", quiet=True, noise=False)
    c = compare_autocast(Net(), samples(), dtype="bf16", diagnosis=d)
    assert (c.dtype, c.device, c.tolerance) == ("bf16", "cpu", 0.08)
    assert not c.passed and c.rel_l2["sub_6"] > 1.0  # the exported model's output name
    assert c.onnx_target == "bf16" and c.onnx_rel_l2 is not None and c.onnx_rel_l2["sub_6"] > 1
    assert c.causes and all(x["module"] == "var" and not x["avoided"] for x in c.causes)
    assert c.causes[0]["rel_l2_kept"]["sub_6"] < 1e-2
    # h * h ~ 2.5e5 overflows FP16 (stats) but not BF16: BF16 autocast avoids the cause
    d16 = pd.diagnose(OverflowNet(), large_samples(), target="fp16", quiet=True, noise=False)
    bf16 = compare_autocast(OverflowNet(), large_samples(), dtype="bf16", diagnosis=d16)
    fp16 = compare_autocast(OverflowNet(), large_samples(), dtype="fp16", diagnosis=d16,
                            fp32_modules=["stats"])
    assert bf16.passed and [x["avoided"] for x in bf16.causes] == [True]
    assert fp16.rel_l2["mean"] == float("inf") and [x["avoided"] for x in fp16.causes] \
        == [False]
    assert fp16.kept_rel_l2 is not None and fp16.kept_rel_l2["mean"] < 1e-2
    assert list(compare_autocast(OverflowNet(), large_samples()).rel_l2) == ["output_0"]
    assert json.loads(dumps(fp16.to_dict()))["causes"][0]["module"] == "stats"
    # a finding of the top-level module is not measured: all of it in float32 is no autocast
    top = SimpleNamespace(findings=[SimpleNamespace(node="n", kind="k", source=Source(
        module=""))], outputs=(), target="fp16")
    assert compare_autocast(OverflowNet(), large_samples(), dtype="fp16", diagnosis=top
                            ).causes == ({"node": "n", "kind": "k", "module": "",
                                          "rel_l2_kept": None, "removed": None,
                                          "avoided": False},)
    with pytest.raises(pd.InputError, match="takes a torch.nn.Module"):
        compare_autocast("model.onnx", samples())
    with pytest.raises(pd.InputError, match="no submodule of Net is 'head'"):
        compare_autocast(Net(), samples(), fp32_modules=["head"])


def test_a_module_that_fails_under_autocast_keeps_its_recipe(fixed: pd.Fix) -> None:
    from precision_doctor.api.pytorch_recipe import torch_report
    from precision_doctor.compare.tolerance import Tolerance
    from precision_doctor.search.objective import Objective

    class NoLowPrecision(Net):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if torch.is_autocast_enabled("cpu"):
                raise RuntimeError("no bfloat16 kernel")
            return super().forward(x)

    t = torch_report(NoLowPrecision(), samples(), None, fixed.result,
                     Objective(tolerances={"*": Tolerance(0.08)}))
    assert t["fp32_modules"] == ["var"] and t["autocast_rel_l2"] is None
    assert t["note"].startswith("not measured: torch-autocast-bf16-cpu") and t["passed"] is None
    assert "no bfloat16 kernel" in t["note"]


class Fourier(torch.nn.Module):
    """Random Fourier features sin/cos(B x), B ~ N(0, 10^2): [n, 2] -> [n, 64]."""

    def __init__(self) -> None:
        super().__init__()
        self.B = torch.nn.Linear(2, 32, bias=False)
        with torch.no_grad():
            self.B.weight.normal_(0, 10.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.B(x)
        return torch.cat([torch.sin(z), torch.cos(z)], -1)


class Field(torch.nn.Module):
    """A coordinate MLP on Fourier features ([n, 2] in [0, 10) -> [n, 3]): the arguments of
    sin/cos reach ~430, where BF16's spacing is 2."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.features = Fourier()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.features(x))


def test_the_recipe_names_the_module_of_a_rewritten_periodic_argument() -> None:
    """The fix reduces sin/cos's argument modulo 2 pi in FP32 (a rewrite: new nodes without
    the exporter's metadata); they take the module of the Sin/Cos they replaced."""
    g = torch.Generator().manual_seed(1)
    coords = [(torch.rand(n, 2, generator=g) * 10,) for n in (64, 96, 128)]
    t = pd.fix(Field(), coords, target="bf16", quiet=True).report["torch"]
    assert t["fp32_modules"] == ["features"] and t["note"] == ""
    assert any(n.startswith("linear/reduce_2pi/") for n in t["groups"]["features"])
    # measured: BF16 autocast alone 0.17, with features in float32 2.9e-3 (ONNX plan 3.7e-3)
    assert t["autocast_alone_rel_l2"]["linear_2"] > 0.08 > 1e-2 > t["autocast_rel_l2"]["linear_2"]
