"""The collect recipe: exact, shell-quoted commands for the TensorRT machine (checked by running
the script in bash with every program replaced by an argv printer, as the recipe tests do),
the analysis commands, the CLI and the section in fix's recipes file."""

from __future__ import annotations

import shlex
import shutil
import subprocess

import numpy as np
import onnx
import pytest
from test_recipes import _argv
from tiny_models import transformer_block
from typer.testing import CliRunner

from precision_doctor.cli import app
from precision_doctor.errors import PlanError
from precision_doctor.inputs.polygraphy import read_polygraphy_inputs
from precision_doctor.report.collect import CollectRecipe, build_collect

BASH = shutil.which("bash")
MODEL, FIXED, INPUTS = "my models/det v1.onnx", "fixed;rm -rf x.onnx", "in puts.json"
SHAPES = {"x y": [[1, 3, 32, 32], [2, 3, 64, 48]]}


def _script_argvs(recipe: CollectRecipe, tmp_path) -> dict[str, list[str]]:
    """Run the script with fake programs; argv of every command, keyed by where it printed
    (stdout, or the log file it was redirected to)."""
    fake = ("out() { printf '%s\\0' \"$@\"; printf '\\n'; }\n"
            "trtexec() { out trtexec \"$@\"; }\npolygraphy() { out polygraphy \"$@\"; }\n")
    res = subprocess.run([BASH, "-c", fake + recipe.script()], capture_output=True,
                         cwd=tmp_path, check=True)
    found = {}
    for i, line in enumerate(res.stdout.decode().split("\0\n")):
        if line:
            found[f"stdout{i}"] = line.split("\0")
    for log in sorted((tmp_path / recipe.out_dir).glob("*.log")):
        found[log.name] = log.read_text().rstrip("\n").rstrip("\0").split("\0")
    return found


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_script_runs_the_exact_quoted_commands(tmp_path):
    recipe = build_collect(MODEL, INPUTS, fixed=FIXED, out_dir="res ults",
                           input_shapes=SHAPES)
    assert [r.tag for r in recipe.runs] == ["original_fp16_notf32", "original_fp16_tf32",
                                            "fixed_typed_notf32", "fixed_typed_tf32"]
    got = _script_argvs(recipe, tmp_path)
    deployed = got["original_fp16_notf32.log"]
    assert deployed == ["polygraphy", "run", MODEL, "--trt", "--fp16",
                        "--trt-min-shapes", "x y:[1,3,32,32]", "--trt-opt-shapes",
                        "x y:[1,3,32,32]", "--trt-max-shapes", "x y:[2,3,64,48]",
                        "--load-inputs", INPUTS, "--save-inputs",
                        "res ults/original_fp16_notf32.inputs.json", "--save-outputs",
                        "res ults/original_fp16_notf32.json", "--verbose"]
    marked = next(v for v in got.values() if "mark" in v and FIXED in v and "--tf32" in v)
    assert marked[:5] == ["polygraphy", "run", FIXED, "--trt", "--strongly-typed"]
    assert marked[-5:] == ["--trt-outputs", "mark", "all", "--save-outputs",
                           "res ults/fixed_typed_tf32.marked.json"]
    audit = got["fixed_typed_notf32.trtexec.log"]
    assert audit[:4] == ["trtexec", f"--onnx={FIXED}", "--stronglyTyped", "--noTF32"]
    assert "--minShapes=x y:1x3x32x32" in audit and "--fp16" not in audit
    assert audit[-4:] == ["--profilingVerbosity=detailed",
                          "--exportLayerInfo=res ults/fixed_typed_notf32.layers.json",
                          "--exportProfile=res ults/fixed_typed_notf32.profile.json",
                          "--verbose"]
    tf32_audit = got["original_fp16_tf32.trtexec.log"]
    assert "--noTF32" not in tf32_audit and "--fp16" in tf32_audit
    assert not (tmp_path / "x.onnx").exists()  # the ';' in a name stayed inside its word


def test_analysis_commands_read_what_the_machine_writes():
    recipe = build_collect(MODEL, INPUTS, target="bf16", tf32_variants=(False,))
    (run,) = recipe.runs
    diag = shlex.split(recipe.analyse)
    assert diag == ["precision-doctor", "diagnose", MODEL, "--data", INPUTS, "--target", "bf16",
                    "--candidate-results", "trt-results/original_bf16_notf32.marked.json",
                    "--candidate-log", "trt-results/original_bf16_notf32.log", "--html",
                    "trt-results/original_bf16_notf32.html", "--json",
                    "trt-results/original_bf16_notf32.report.json"]
    assert "--bf16" in _argv(run.commands[0])[0]
    audit = shlex.split(run.analyse[2])
    assert audit[:3] == ["precision-doctor", "audit", "trt-results/original_bf16_notf32"
                                                       ".layers.json"]
    assert audit[-2:] == ["--log", "trt-results/original_bf16_notf32.trtexec.log"]
    assert CollectRecipe.from_dict(recipe.to_dict()) == recipe
    assert "## Collect on a TensorRT machine" in recipe.render_markdown()
    with pytest.raises(PlanError, match="FP16 or BF16"):
        build_collect(MODEL, INPUTS, target="tf32")


def test_cli_writes_inputs_script_and_page_and_fix_recipes_get_the_section(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(transformer_block(hot_value=1000.0), str(model))
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((1, 8, 16)).astype(
        np.float32))
    out = tmp_path / "collect"
    args = ["recipe", "collect", str(model), "--data", str(tmp_path / "x.npy"), "-o", str(out)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    feeds = read_polygraphy_inputs(out / "inputs.json")
    assert list(feeds[0]) == ["x"] and feeds[0]["x"].shape == (1, 8, 16)
    script = (out / "collect.sh").read_text()
    assert "--trt-opt-shapes 'x:[1,8,16]'" in script and "COLLECT" not in script
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "--force" in res.output
    res = CliRunner().invoke(app, ["fix", str(model), "-o", str(tmp_path / "f.onnx"), "--data",
                                   str(out / "inputs.json")])
    assert res.exit_code == 0, res.output
    recipes = (tmp_path / "f.recipes.md").read_text()
    assert "## Collect on a TensorRT machine" in recipes
    assert shlex.quote(str(tmp_path / "f.onnx")) in recipes and "--strongly-typed" in recipes
