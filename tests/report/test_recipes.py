"""Engine recipes: exact quoted layer names, shapes, TF32, JSON round trip, markdown, shell argv."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess

import onnx
import pytest
from onnx import TensorProto, helper

from precision_doctor.errors import InputShapeError, PlanError
from precision_doctor.formats import Precision
from precision_doctor.graph.load import load_model
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.report.recipes import (
    Recipes,
    build_recipes,
    default_tolerance,
    shape_ranges,
    trt_layer_names,
)

NODES = ["ln/pow", "my node", "x:y"]  # a space and a colon: both expressible (quoted)
SHAPES = {"x": [[1, 3, 32, 32], [2, 3, 64, 48], [1, 3, 64, 48], [1, 3, 64, 48]]}
BASH = shutil.which("bash")


def _plan(names=NODES, default=Precision.FP16):
    return PrecisionPlan(default).keep_fp32(names, "hazard", "test")


def _recipes(names=NODES, target="fp16", tf32=False, **kw):
    return build_recipes("out dir/fixed.onnx", "models/orig.onnx", _plan(names), target, tf32,
                         SHAPES, **kw)


def _argv(command: str) -> list[list[str]]:
    """Each command of a rendered block split as a POSIX shell does: comment lines dropped and
    backslash-newline removed (the renderer only writes it outside quotes)."""
    text = "\n".join(line for line in command.splitlines() if not line.startswith("#"))
    return [shlex.split(line) for line in text.replace("\\\n", "").splitlines() if line]


def _run_in_bash(command: str, tmp_path) -> list[list[str]]:
    """Run ``command`` in bash with every program replaced by an argv printer."""
    fake = ("out() { printf '%s\\0' \"$@\"; printf '\\n'; }\n"
            "trtexec() { out trtexec \"$@\"; }\npolygraphy() { out polygraphy \"$@\"; }\n"
            "precision-doctor() { out precision-doctor \"$@\"; }\n")
    res = subprocess.run([BASH, "-c", fake + command], capture_output=True, cwd=tmp_path,
                         check=True)
    return [line.split("\0") for line in res.stdout.decode().split("\0\n") if line]


def test_weak_commands_name_exactly_the_plan_nodes_quoted():
    r = _recipes()
    argv = _argv(r.trtexec_weak)[0]
    assert "--layerPrecisions=ln/pow:fp32,my node:fp32,x:y:fp32" in argv
    assert "--layerOutputTypes=ln/pow:fp32,my node:fp32,x:y:fp32" in argv
    assert {"--fp16", "--precisionConstraints=obey", "--noTF32"} <= set(argv)
    assert "'" in r.trtexec_weak and "*" not in r.trtexec_weak  # quoted, no wildcard
    poly = _argv(r.polygraphy_weak)[0]
    i = poly.index("--layer-precisions")
    assert poly[i + 1:i + 4] == ["ln/pow:float32", "my node:float32", "x:y:float32"]
    assert r.fp32_layers == tuple(NODES) and not r.skipped


def test_comma_quote_wildcard_names_withhold_the_weak_route():
    bad = ["a,b", "it's", "conv*"]
    r = _recipes(NODES + bad)
    assert [n for n, _ in r.skipped] == sorted(bad)
    assert r.trtexec_weak == "" and r.polygraphy_weak == ""
    assert "--stronglyTyped" in _argv(r.trtexec)[0]
    assert any("withheld" in n for n in r.notes)
    md = r.render_markdown()
    assert all(n in md for n in bad) and "Withheld" in md


def test_strongly_typed_command_and_tf32_off():
    r = _recipes()
    cmd, audit = _argv(r.trtexec)
    assert cmd[:3] == ["trtexec", "--onnx=out dir/fixed.onnx", "--stronglyTyped"]
    assert "--noTF32" in cmd and "--fp16" not in cmd
    assert "--exportLayerInfo=out dir/fixed.layers.json" in cmd
    assert "--profilingVerbosity=detailed" in cmd and "--saveEngine=out dir/fixed.plan" in cmd
    assert audit[:3] == ["precision-doctor", "audit", "out dir/fixed.layers.json"]
    assert "TensorRT 11" in r.trtexec and "--tf32" not in r.polygraphy_run
    assert r.ort["cuda_fixed"]["provider_options"][0] == {"use_tf32": "0"}
    assert r.ort["tensorrt_fixed"]["provider_options"][1] == {"use_tf32": "0"}
    assert "{'use_tf32': '0'}" in r.ort_python


def test_tf32_on():
    r = _recipes(tf32=True)
    assert "--noTF32" not in r.trtexec and "--noTF32" not in r.trtexec_weak
    assert "--tf32" in _argv(r.polygraphy_run)[0] and "--tf32" in _argv(r.polygraphy_weak)[0]
    assert r.ort["cuda_fixed"]["provider_options"][0] == {"use_tf32": "1"}


def test_dynamic_shapes_give_min_opt_max():
    (rng,) = shape_ranges(SHAPES)
    assert (rng.min, rng.opt, rng.max) == ((1, 3, 32, 32), (1, 3, 64, 48), (2, 3, 64, 48))
    cmd = _argv(_recipes().trtexec)[0]
    assert {"--minShapes=x:1x3x32x32", "--optShapes=x:1x3x64x48",
            "--maxShapes=x:2x3x64x48"} <= set(cmd)
    poly = _argv(_recipes().polygraphy_run)[0]
    assert poly[poly.index("--trt-max-shapes") + 1] == "x:[2,3,64,48]"
    assert poly[poly.index("--input-shapes") + 1] == "x:[1,3,64,48]"
    static = _recipes(dynamic=False)
    assert "Shapes" not in static.trtexec and "shapes" not in static.polygraphy_run
    assert shape_ranges({"scalar": []})[0].opt == ()


def test_bad_shapes_and_target():
    with pytest.raises(InputShapeError, match="ranks"):
        shape_ranges({"x": [[1, 3], [1, 3, 4]]})
    with pytest.raises(InputShapeError, match="'x'"):
        shape_ranges({"x": [1, -3]})
    with pytest.raises(PlanError, match="fp16, bf16 or tf32"):
        _recipes(target="fp32")


def test_json_round_trip_and_markdown():
    r = _recipes(inputs_json="real inputs.json", plan_json="out dir/plan.json")
    data = json.loads(json.dumps(r.to_dict()))
    assert Recipes.from_dict(data) == r
    md = r.render_markdown()
    for text in (r.trtexec, r.trtexec_weak, r.polygraphy_run, r.polygraphy_reference,
                 r.polygraphy_weak, r.ort_python):
        assert text.strip() in md
    assert "--load-inputs" in r.polygraphy_run and "--plan" in r.trtexec
    with pytest.raises(PlanError):
        Recipes.from_dict({"target": "fp16"})


def test_bf16_tf32_targets_and_ort_booleans():
    bf = _recipes(target="bf16")
    assert "--bf16" in _argv(bf.trtexec_weak)[0] and "--fp16" not in bf.trtexec_weak
    assert bf.ort["tensorrt_original"]["provider_options"][0] == {
        "trt_bf16_enable": "True", "trt_layer_norm_fp32_fallback": "True"}
    fp = _recipes()
    assert fp.ort["tensorrt_original"]["provider_options"][0]["trt_fp16_enable"] == "True"
    assert fp.ort["tensorrt_fixed"]["provider_options"][0] == {"trt_fp16_enable": "False"}
    tf = _recipes(target="tf32", tf32=True)
    assert tf.trtexec_weak == "" and any("--noTF32" in n for n in tf.notes)
    assert default_tolerance(Precision.BF16) == pytest.approx(8e-3)
    assert "--atol 0.001 --rtol 0.001" in fp.polygraphy_run


def test_bf16_recipes_are_strongly_typed_and_compare_on_cuda():
    bf = _recipes(target="bf16")
    strong = _argv(bf.trtexec)[0]
    assert "--stronglyTyped" in strong and "--bf16" not in strong  # the Casts carry BF16
    run = _argv(bf.polygraphy_run)[0]
    assert run[run.index("--onnxrt") + 1:run.index("--onnxrt") + 3] == ["--providers", "cuda"]
    assert "--providers" not in _recipes().polygraphy_run  # FP16: ONNX Runtime CPU runs it
    assert bf.ort["cuda_fixed"]["provider_options"][0] == {"use_tf32": "0"}  # no BF16 flag
    note = next(n for n in bf.notes if n.startswith("BF16"))
    assert "compute capability >= 8.0" in note and "emulate-written" in note


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_shell_sees_exact_argv_even_for_hostile_long_names(tmp_path):
    hostile = ["$(touch pwned)", "`touch pwned2`; touch pwned3", "a\"b\\c", "x y " * 20]
    r = _recipes(NODES + hostile)
    assert "\\\n'" in r.trtexec_weak  # the long list continues on unindented lines
    calls = _run_in_bash(r.trtexec_weak, tmp_path)
    expected = ",".join(f"{n}:fp32" for n in sorted(NODES + hostile))
    assert "--layerPrecisions=" + expected in calls[0]
    assert calls[0] == _argv(r.trtexec_weak)[0]
    poly = _run_in_bash(r.polygraphy_weak, tmp_path)[0]
    assert [a[:-8] for a in poly if a.endswith(":float32")] == sorted(NODES + hostile)
    assert len(_run_in_bash(r.polygraphy_reference, tmp_path)) == 2
    assert not list(tmp_path.iterdir())  # nothing was executed


def _unnamed_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])
    nodes = [helper.make_node("Relu", ["x"], ["a"]),                   # unnamed
             helper.make_node("Sigmoid", ["a"], ["b"], name="dup"),
             helper.make_node("Tanh", ["b"], ["c"], name="dup"),
             helper.make_node("Abs", ["c"], ["y"], name="keep me")]
    graph = helper.make_graph(nodes, "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_trt_layer_names_for_unnamed_duplicate_and_rewritten_nodes(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_unnamed_model(), path)
    plan_names = [n.name for n in load_model(path).graph.node]
    names = trt_layer_names(path)
    assert list(names) == plan_names
    assert names == {"Relu_0": "node_of_a", "dup": None, "Tanh_2": None, "keep me": "keep me"}
    r = build_recipes("f.onnx", path, _plan(plan_names + ["fused_ln"]), "fp16", False,
                      {"x": [2, 4]}, layer_names=names)
    assert r.fp32_layers == ("node_of_a", "keep me")  # plan order (sorted plan names)
    assert {n for n, _ in r.skipped} == {"dup", "Tanh_2", "fused_ln"}
    ok = build_recipes("f.onnx", path, _plan(["Relu_0", "keep me"]), "fp16", False,
                       {"x": [2, 4]}, layer_names=names)
    assert "--layerPrecisions=node_of_a:fp32,keep me:fp32" in _argv(ok.trtexec_weak)[0]


def test_real_detector_layer_names(shared_dir):
    path = shared_dir / "models/ppocrv4/det.onnx"
    model = load_model(path)
    names = trt_layer_names(path)
    assert list(names) == [n.name for n in model.graph.node]
    bns = [n.name for n in model.graph.node if n.op_type == "BatchNormalization"]
    assert bns and all(names[b] == b for b in bns)
    unnamed = [v for k, v in names.items() if k.startswith("Constant_")]
    assert unnamed and all(v.startswith("node_of_") for v in unnamed)
    r = build_recipes(path.with_name("det.fixed.onnx"), path, _plan(bns[:1]), "fp16", False,
                      {"x": [[1, 3, 640, 640], [1, 3, 960, 736]]}, layer_names=names)
    weak = _argv(r.trtexec_weak)[0]
    assert f"--layerPrecisions={bns[0]}:fp32" in weak
    assert "--maxShapes=x:1x3x960x736" in weak and not r.skipped
