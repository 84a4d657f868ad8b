"""Every output path of the CLI is checked before any model is loaded: an unwritable place, a
folder given as a file, or the input model as the output is one line on stderr naming the path,
exit code 2, and nothing written. Missing folders of an output are created when it is written."""

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from tiny_models import conv_bn
from typer.testing import CliRunner

from precision_doctor.cli import app

runner = CliRunner()
DATA = "random:seed=0,low=-1,high=1,count=1,shape=x:1x3x8x8"
PROC = Path("/proc/precision-doctor-missing")  # root may write anywhere but here
needs_proc = pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A folder holding a valid tiny model ``m.onnx``, a garbage ``bad.onnx`` (loading it fails,
    so an output error on it shows the check ran first) and two arrays for ``inputs``."""
    onnx.save(conv_bn(), str(tmp_path / "m.onnx"))
    (tmp_path / "bad.onnx").write_bytes(b"\x08\x07garbage-not-a-model")
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "a.npy", x)
    np.save(tmp_path / "b.npy", x * 2)
    return tmp_path


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def assert_refused(args: list[str], path: Path, folder: Path, *words: str) -> None:
    """Exit 2, one stderr line naming ``path`` (and ``words``), no traceback, nothing written."""
    before = files_under(folder)
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert str(path) in lines[0] and all(w in lines[0] for w in words), lines[0]
    assert "Traceback" not in res.output
    assert files_under(folder) == before


@pytest.fixture
def unwritable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder this process cannot write to: mode 0o555, and, for root (who may write
    anyway), ``os.access`` denying writes to it, which is what the check asks."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):
        real = os.access

        def access(path, mode, *args, **kwargs):
            if Path(path) == folder and mode & os.W_OK:
                return False
            return real(path, mode, *args, **kwargs)

        monkeypatch.setattr(os, "access", access)
    yield folder
    folder.chmod(0o755)


@needs_proc
def test_diagnose_html_and_json_in_an_unwritable_place(work: Path):
    for option in ("--html", "--json"):
        out = PROC / "such" / f"r.{option[2:]}"
        assert_refused(["diagnose", str(work / "bad.onnx"), "--data", DATA, option, str(out)],
                       out, work, "not writable")


def test_diagnose_html_in_an_unwritable_folder(work: Path, unwritable: Path):
    for out in (unwritable / "r.html", unwritable / "missing" / "r.html"):
        assert_refused(["diagnose", str(work / "bad.onnx"), "--data", DATA, "--html",
                        str(out)], out, work, "not writable")


def test_diagnose_refuses_the_model_a_folder_and_a_file_as_folder(work: Path):
    model = work / "m.onnx"
    assert_refused(["diagnose", str(model), "--data", DATA, "--json", str(model), "--force"],
                   model, work, "input")
    assert_refused(["diagnose", str(model), "--data", DATA, "--html", str(work)], work, work,
                   "folder")
    out = model / "r.html"  # m.onnx is a file
    assert_refused(["diagnose", str(model), "--data", DATA, "--html", str(out)], out, work,
                   "not a folder")


@needs_proc
def test_fix_output_and_html(work: Path, unwritable: Path):
    bad = str(work / "bad.onnx")
    out = PROC / "fixed.onnx"
    assert_refused(["fix", bad, "-o", str(out), "--data", DATA], out, work, "not writable")
    out = unwritable / "fixed.onnx"
    assert_refused(["fix", bad, "-o", str(out), "--data", DATA], out, work, "not writable")
    html = PROC / "fix.html"
    assert_refused(["fix", bad, "-o", str(work / "fixed.onnx"), "--data", DATA, "--html",
                    str(html)], html, work, "not writable")
    model = work / "m.onnx"
    assert_refused(["fix", str(model), "-o", str(model), "--data", DATA, "--force"], model,
                   work, "input")


@needs_proc
def test_audit_json(work: Path):
    layers = work / "layers.json"
    layers.write_text('{"Layers": []}')
    out = PROC / "audit.json"
    assert_refused(["audit", str(layers), "--json", str(out)], out, work, "not writable")
    assert_refused(["audit", str(layers), "--json", str(layers), "--force"], layers, work,
                   "input")
    log = work / "build.log"
    log.write_text("[I] TensorRT version: 10.0.1\n[W] [TRT] Running layernorm after "
                   "self-attention in FP16 may cause overflow.\n")
    assert_refused(["audit", str(log), "--json", str(out)], out, work, "not writable")


def test_inputs_json(work: Path, unwritable: Path):
    out = unwritable / "forensics.json"
    assert_refused(["inputs", str(work / "a.npy"), str(work / "b.npy"), "--json", str(out)],
                   out, work, "not writable")


@needs_proc
def test_demo_out_folder(work: Path):
    out = PROC / "demo"
    assert_refused(["demo", "--quick", "--out", str(out)], out, work, "not writable")
    assert_refused(["demo", "--quick", "--out", str(work / "m.onnx")], work / "m.onnx", work,
                   "not a folder")


@needs_proc
def test_recipe_collect_out_folder(work: Path, unwritable: Path):
    out = PROC / "trt"
    assert_refused(["recipe", "collect", str(work / "bad.onnx"), "--data", DATA, "--out",
                    str(out)], out, work, "not writable")
    assert_refused(["recipe", "collect", str(work / "bad.onnx"), "--data", DATA, "--out",
                    str(unwritable)], unwritable, work, "not writable")


def test_a_writable_output_still_works(work: Path):
    """The check does not get in the way: a report in an existing folder is written."""
    out = work / "r.json"
    res = runner.invoke(app, ["diagnose", str(work / "m.onnx"), "--data", DATA, "--json",
                              str(out), "--no-noise", "--no-layerwise", "-q"])
    assert res.exit_code in (0, 1), res.output
    assert out.read_text().startswith("{")


def test_missing_folders_of_outputs_are_created(work: Path, monkeypatch: pytest.MonkeyPatch):
    """``-o new/folder/m.onnx`` (relative, as typed), ``--html`` and ``--json`` in folders that
    do not exist yet: the folders are made and the files written."""
    monkeypatch.chdir(work)
    res = runner.invoke(app, ["fix", "m.onnx", "-o", "new/folder/m.onnx", "--data", DATA,
                              "--html", "html/deeper/fix.html", "-q"])
    assert res.exit_code in (0, 1), res.output
    assert onnx.load(str(work / "new" / "folder" / "m.onnx")).graph.node
    assert (work / "html" / "deeper" / "fix.html").read_text().lstrip().startswith("<")
    res = runner.invoke(app, ["diagnose", "m.onnx", "--data", DATA, "--json", "j/r.json",
                              "--html", "h/a/r.html", "--no-noise", "--no-layerwise", "-q"])
    assert res.exit_code in (0, 1), res.output
    assert (work / "j" / "r.json").read_text().startswith("{")
    assert (work / "h" / "a" / "r.html").is_file()
    res = runner.invoke(app, ["recipe", "collect", "m.onnx", "--data", DATA, "--out",
                              "trt/new"])
    assert res.exit_code == 0, res.output
    assert (work / "trt" / "new" / "collect.sh").is_file()
