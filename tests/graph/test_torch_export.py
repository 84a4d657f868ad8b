"""graph.torch_export: a torch.nn.Module and its samples as an ONNX model (dynamo exporter) and
feeds; dynamic axes where the samples' shapes differ; one clear InputError when it cannot be
exported or the samples do not fit."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from precision_doctor.errors import InputError
from precision_doctor.graph.torch_export import export_error, export_module, is_torch_module

torch = pytest.importorskip("torch", reason="needs torch: pip install '.[torch]'")


class Masked(torch.nn.Module):
    """Masked mean over the sequence: x float32 [batch, seq, 4], mask float32 [batch, seq]."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.proj(x)) * mask.unsqueeze(-1)
        return h.sum(1) / mask.sum(1, keepdim=True)


def _samples() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(2, n, 4, generator=g), torch.ones(2, n)) for n in (3, 6)]


def test_export_gives_the_model_feeds_and_dynamic_axes() -> None:
    module = Masked().train()
    samples = _samples()
    exported = export_module(module, samples)
    assert module.training  # exported in eval mode, its mode restored
    assert exported.dynamic == {"x": (1,), "mask": (1,)}
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
            for i in exported.model.graph.input}
    assert list(dims) == ["x", "mask"]
    assert isinstance(dims["x"][1], str) and dims["x"][0] == 2 and dims["x"][2] == 4
    assert [f["x"].shape for f in exported.feeds] == [(2, 3, 4), (2, 6, 4)]
    assert all(f["x"].dtype == np.float32 for f in exported.feeds)
    assert exported.seconds > 0 and exported.torch_version == str(torch.__version__)
    info = exported.info("Masked")
    assert info["exported_from"] == "Masked" and info["dynamic_axes"] == {"x": [1], "mask": [1]}
    # the ONNX model computes what the module computes in eval mode (dropout off)
    import onnxruntime as ort

    session = ort.InferenceSession(exported.model.SerializeToString())
    with torch.no_grad():
        expected = module.eval()(*samples[1]).numpy()
    np.testing.assert_allclose(session.run(None, exported.feeds[1])[0], expected, rtol=1e-5,
                               atol=1e-6)


def test_keyword_samples_any_iterable_and_max_samples() -> None:
    samples = [{"mask": m, "x": x} for x, m in _samples()]
    # a generator, as a DataLoader yields; keys in another order in the second sample
    items = iter([samples[0], {"x": samples[1]["x"], "mask": samples[1]["mask"]}])
    exported = export_module(Masked(), items)
    assert len(exported.feeds) == 2
    assert {i.name for i in exported.model.graph.input} == {"x", "mask"}
    for feeds, sample in zip(exported.feeds, samples):
        np.testing.assert_array_equal(feeds["x"], sample["x"].numpy())
    one = export_module(Masked(), samples, max_samples=1)
    assert len(one.feeds) == 1 and one.dynamic == {}
    # one sample alone: a tuple of tensors is one call's arguments
    assert len(export_module(Masked(), _samples()[0]).feeds) == 1


def test_samples_that_do_not_fit_forward_are_refused_with_what_to_do() -> None:
    x, m = _samples()[0]
    with pytest.raises(InputError, match=r"does not fit Masked.forward\(x, mask\).*inputs only"):
        export_module(Masked(), [(x, m, torch.tensor(1))])  # a DataLoader's (inputs, label)
    with pytest.raises(InputError, match="structure of sample 0"):
        export_module(Masked(), [(x, m), {"x": x, "mask": m}])
    with pytest.raises(InputError, match="no sample"):
        export_module(Masked(), [])
    with pytest.raises(InputError, match="samples are required"):
        export_module(Masked(), None)


@torch.library.custom_op("pdtest::opaque", mutates_args=())
def opaque(x: torch.Tensor) -> torch.Tensor:
    """An operator without an ONNX translation."""
    return x.clone()


@opaque.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class Opaque(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return opaque(x * 2) + 1


def test_an_operator_without_translation_is_named() -> None:
    with pytest.raises(InputError, match=r"operator pdtest\.opaque has no ONNX translation") \
            as info:
        export_module(Opaque(), [torch.ones(2, 3)])
    assert info.value.context["operator"] == "pdtest.opaque"
    assert "custom_translation_table" in str(info.value)


def test_other_export_failures_give_the_exporter_s_first_line() -> None:
    error = export_error(RuntimeError("data-dependent branch\nmore"), "Net")
    assert "cannot export Net" in str(error) and "data-dependent branch" in str(error)
    assert "more" not in str(error)


def test_is_torch_module_and_the_package_imports_without_torch() -> None:
    assert is_torch_module(Masked()) and not is_torch_module(object())
    code = ("import sys, precision_doctor as pd; pd.diagnose; "
            "import precision_doctor.api.pytorch, precision_doctor.graph.torch_export; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
