"""Models with external data: every path (load, emulate, diagnose with layerwise, writer, fix)
gives the answers of the same model stored inline, and never builds a proto with the weights."""

import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from tiny_models import transformer_block
from typer.testing import CliRunner

from precision_doctor.cli import app
from precision_doctor.errors import ModelLoadError
from precision_doctor.formats import Precision
from precision_doctor.graph.external import has_external_data, is_external
from precision_doctor.graph.external_files import save_model
from precision_doctor.graph.load import load_model
from precision_doctor.graph.outputs import mark_outputs
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.precision.writer import write_mixed_precision
from precision_doctor.runners.emulator import EmulatorRunner
from precision_doctor.runners.ort import OrtRunner

cli = CliRunner()
DATA = "random:seed=0,low=-1,high=1,count=2,shape=x:1x8x32"
FEEDS = {"x": np.random.default_rng(3).uniform(-1, 1, (1, 8, 32)).astype(np.float32)}


@pytest.fixture()
def models(tmp_path):
    """The same model inline and with every tensor in ``ext/m.onnx.data``."""
    model = transformer_block(hot_value=1000.0, hidden=32)  # 32x32 weights: 4 KiB each
    inline = tmp_path / "inline.onnx"
    onnx.save(model, str(inline))
    (tmp_path / "ext").mkdir()
    ext = tmp_path / "ext" / "m.onnx"
    onnx.save_model(model, str(ext), save_as_external_data=True, size_threshold=0,
                    location="m.onnx.data")
    return inline, ext


def _refs(model):
    return sorted((t.name, tuple(e.value for e in t.external_data))
                  for t in model.graph.initializer if is_external(t))


def test_load_keeps_weights_in_their_file(models):
    inline, ext = models
    before = ext.read_bytes(), (ext.parent / "m.onnx.data").read_bytes()
    model = load_model(ext)
    external = [t for t in model.graph.initializer if is_external(t)]
    assert {t.name for t in external} == {"w1", "w2"}  # >= 1 KiB; scalars read in
    assert all(os.path.isabs(e.value) for t in external for e in t.external_data
               if e.key == "location")
    assert model.ByteSize() < 3000 < os.path.getsize(inline)
    assert (ext.read_bytes(), (ext.parent / "m.onnx.data").read_bytes()) == before
    with OrtRunner(model) as a, OrtRunner(load_model(inline)) as b:
        np.testing.assert_array_equal(a.run(FEEDS)["probs"], b.run(FEEDS)["probs"])


def test_emulator_and_writer_match_the_inline_model(models, tmp_path):
    inline, ext = (load_model(p) for p in models)
    plan = PrecisionPlan(Precision.FP16).keep_fp32(["ln/pow"], "user")
    with EmulatorRunner(ext, plan) as a, EmulatorRunner(inline, plan) as b, \
            EmulatorRunner(ext, plan) as again:  # rounded weights reused from the store
        np.testing.assert_array_equal(a.run(FEEDS)["probs"], b.run(FEEDS)["probs"])
        np.testing.assert_array_equal(again.run(FEEDS)["probs"], b.run(FEEDS)["probs"])
    written, report = write_mixed_precision(ext, plan)
    assert report.ort_validated and has_external_data(written)
    assert not any("checker" in w for w in report.warnings), report.warnings  # checker ran
    assert _refs(write_mixed_precision(ext, plan)[0]) == _refs(written)  # converted once
    assert written.ByteSize() < 4000  # FP16 weights live in the weight store, not the proto
    files = save_model(written, tmp_path / "w.onnx")
    assert [f.name for f in files] == ["w.onnx", "w.onnx.data"]
    saved = onnx.load(str(files[0]), load_external_data=False)
    assert {e.value for t in saved.graph.initializer if is_external(t)
            for e in t.external_data if e.key == "location"} == {"w.onnx.data"}
    expected = OrtRunner(write_mixed_precision(inline, plan)[0]).__enter__().run(FEEDS)
    got = ort.InferenceSession(str(files[0])).run(None, FEEDS)[0]
    np.testing.assert_array_equal(got, expected["probs"])


def test_cli_diagnose_and_fix_with_external_data(models, tmp_path):
    inline, ext = models
    reports = []
    for path, name in ((inline, "inline.json"), (ext, "ext.json")):
        res = cli.invoke(app, ["diagnose", str(path), "--data", DATA, "--json",
                               str(tmp_path / name), "-q"])
        assert res.exit_code == 1, res.output
        reports.append(json.loads((tmp_path / name).read_text()))
    inline_r, ext_r = reports
    assert ext_r["layerwise"]["records"] and \
        ext_r["layerwise"]["records"] == inline_r["layerwise"]["records"]
    assert ext_r["outputs"] == inline_r["outputs"]
    assert [f["node"] for f in ext_r["findings"]] == [f["node"] for f in inline_r["findings"]]

    out = tmp_path / "out" / "fixed.onnx"
    out.parent.mkdir()
    res = cli.invoke(app, ["fix", str(ext), "-o", str(out), "--data", DATA, "-q"])
    assert res.exit_code == 0, res.output
    for f in (out, out.with_name("fixed.onnx.data"), out.with_name("fixed.rewritten-fp32.onnx"),
              out.with_name("fixed.rewritten-fp32.onnx.data")):
        assert f.is_file(), f
    session = ort.InferenceSession(str(out))
    assert np.isfinite(session.run(None, FEEDS)[0]).all()
    stamp = out.with_name("fixed.onnx.data").stat().st_mtime_ns
    res = cli.invoke(app, ["fix", str(ext), "-o", str(out), "--data", DATA, "-q"])
    assert res.exit_code == 2 and "--force" in res.output
    assert out.with_name("fixed.onnx.data").stat().st_mtime_ns == stamp


def test_missing_or_truncated_data_file_is_a_clear_error(models):
    _, ext = models
    data = ext.parent / "m.onnx.data"
    content = data.read_bytes()
    data.write_bytes(content[:100])
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model(ext)
    data.unlink()
    with pytest.raises(ModelLoadError, match="m.onnx.data.*missing"):
        load_model(ext)
    res = cli.invoke(app, ["diagnose", str(ext), "--data", DATA])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "m.onnx.data" in res.output and "missing" in res.output


def test_data_outside_the_model_folder_is_refused(models):
    _, ext = models
    model = onnx.load(str(ext), load_external_data=False)
    for e in model.graph.initializer[0].external_data:
        if e.key == "location":
            e.value = "../ext/m.onnx.data"
    ext.write_bytes(model.SerializeToString())
    with pytest.raises(ModelLoadError, match="outside the model's folder"):
        load_model(ext)


def test_a_segment_of_an_external_data_model_runs_from_memory(models):
    """What segment-wise layerwise needs: a sub-model cut from the loaded proto (weights still
    referenced, not copied) opens in ONNX Runtime and in the emulator."""
    inline, ext = (load_model(p) for p in models)
    with OrtRunner(mark_outputs(inline, ["ln_out"])) as r:
        h = r.run(FEEDS, ["ln_out"])["ln_out"]
    cuts = [onnx.utils.Extractor(onnx.shape_inference.infer_shapes(m)).extract_model(
        ["ln_out"], ["probs"]) for m in (ext, inline)]
    assert has_external_data(cuts[0]) and cuts[0].ByteSize() < 2000
    with OrtRunner(cuts[0]) as a, OrtRunner(cuts[1]) as b:
        np.testing.assert_array_equal(a.run({"ln_out": h})["probs"], b.run({"ln_out": h})["probs"])
    plan = PrecisionPlan(Precision.FP16)
    with EmulatorRunner(cuts[0], plan) as a, EmulatorRunner(cuts[1], plan) as b:
        np.testing.assert_array_equal(a.run({"ln_out": h})["probs"], b.run({"ln_out": h})["probs"])
