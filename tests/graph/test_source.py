"""graph.source: the Python file, line, code and module path of an ONNX node, read from the
dynamo exporter's metadata (set here by hand) or a TorchScript node name; nodes named by the
modules that hold them."""

from __future__ import annotations

import json

import onnx
import pytest
from onnx import TensorProto, helper
from tiny_models import IR_VERSION

from precision_doctor.graph.source import (
    CLASS_HIERARCHY,
    NAME_SCOPES,
    STACK_TRACE,
    Source,
    group_by_module,
    in_module,
    inherit_metadata,
    is_torch_file,
    module_classes,
    module_from_name,
    module_from_scopes,
    node_modules,
    parse_stack_trace,
    select_by_module,
    source_of,
    sources,
    user_frame,
)

TORCH = "/venv/lib/python3.11/site-packages/torch"
STACK = (f'File "/home/me/net.py", line 12, in forward\n    return self.stats(h)\n'
         f'  File "/home/me/net.py", line 4, in forward\n    return (h * h).mean(-1)\n'
         f'  File "{TORCH}/nn/modules/module.py", line 1786, in _call_impl\n'
         f'    return forward_call(*args, **kwargs)')


def _node(op: str, name: str, props: dict[str, str] | None = None) -> onnx.NodeProto:
    node = helper.make_node(op, ["x", "x"] if op in ("Mul", "Add") else ["x"], [f"{name}_out"],
                            name=name)
    for key, value in (props or {}).items():
        entry = node.metadata_props.add()
        entry.key, entry.value = key, value
    return node


def _model(nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    outs = [helper.make_tensor_value_info(n.output[0], TensorProto.FLOAT, [2]) for n in nodes]
    graph = helper.make_graph(nodes, "g", [x], outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    return model


def test_stack_trace_frames_and_the_innermost_one_outside_torch() -> None:
    frames = parse_stack_trace(STACK)
    assert frames == [("/home/me/net.py", 12, "return self.stats(h)"),
                      ("/home/me/net.py", 4, "return (h * h).mean(-1)"),
                      (f"{TORCH}/nn/modules/module.py", 1786,
                       "return forward_call(*args, **kwargs)")]
    assert user_frame(STACK) == ("/home/me/net.py", 4, "return (h * h).mean(-1)")
    # Python 3.11+ caret lines are not code; a frame without a code line keeps None
    text = ('File "/a/m.py", line 3, in f\n    y = g(x)\n        ^^^^\n'
            '  File "/a/m.py", line 9, in g')
    assert parse_stack_trace(text) == [("/a/m.py", 3, "y = g(x)"), ("/a/m.py", 9, None)]
    assert user_frame(f'File "{TORCH}/x.py", line 1, in f\n    pass') is None


def test_torch_files_are_the_torch_package_and_pseudo_files() -> None:
    assert is_torch_file(f"{TORCH}/nn/functional.py")
    assert is_torch_file("/usr/lib/python3/dist-packages/torch/_dynamo/eval_frame.py")
    assert is_torch_file("<eval_with_key>.3")
    assert not is_torch_file("/venv/lib/python3.11/site-packages/transformers/models/bert/"
                             "modeling_bert.py")
    assert not is_torch_file("/home/me/torch/net.py")  # a user's folder named torch


@pytest.mark.parametrize("scopes, module", [
    (["", "stats", "mul"], "stats"),
    (["", "encoder", "encoder.layer.0", "encoder.layer.0.attention", "linear"],
     "encoder.layer.0.attention"),
    (["", "encoder", "layer.0", "attention", "linear"], "encoder.layer.0.attention"),
    (["", "mul"], ""),
    ([], None),
])
def test_module_path_from_name_scopes(scopes: list[str], module: str | None) -> None:
    assert module_from_scopes(scopes) == module


@pytest.mark.parametrize("name, module", [
    ("/encoder/layer.3/attention/self/MatMul_1", "encoder.layer.3.attention.self"),
    ("/embeddings/LayerNorm/LayerNormalization", "embeddings.LayerNorm"),
    ("/Mul_1", ""),
    ("node_mul_3", None),
    ("onnx::MatMul_12", None),
    ("/", None),
    ("/a//b", None),
])
def test_module_path_from_a_torchscript_node_name(name: str, module: str | None) -> None:
    assert module_from_name(name) == module


def test_source_of_a_dynamo_node_reads_all_three_keys() -> None:
    node = _node("Mul", "node_mul_3", {
        STACK_TRACE: STACK, NAME_SCOPES: "['', 'stats', 'mul_3']",
        CLASS_HIERARCHY: "['__main__.Net', '__main__.Stats', 'aten.mul.Tensor']"})
    source = source_of(node)
    assert source == Source("/home/me/net.py", 4, "return (h * h).mean(-1)", "stats")
    assert module_classes(node) == ["__main__.Net", "__main__.Stats"]
    assert source.location() == "net.py:4"
    assert source.describe() == "net.py:4 stats: return (h * h).mean(-1)"


def test_source_of_falls_back_to_the_node_name_and_says_none_when_nothing_is_known() -> None:
    assert source_of(_node("MatMul", "/encoder/layer.3/attention/self/MatMul_1")) == Source(
        module="encoder.layer.3.attention.self")
    assert source_of(_node("Relu", "Relu_0")) is None
    # a malformed scope list is ignored, not fatal: the name still gives the module
    assert source_of(_node("Relu", "/a/Relu", {NAME_SCOPES: "not a list ["})) == Source(
        module="a")
    top = source_of(_node("Relu", "n", {NAME_SCOPES: "['', 'relu']"}))
    assert top == Source(module="") and top.describe() == "(top-level module)"


def test_source_round_trips_through_json() -> None:
    source = Source("/home/me/net.py", 4, "return (h * h).mean(-1)", "stats")
    data = json.loads(json.dumps(source.to_dict()))
    assert set(data) == {"file", "line", "code", "module"}
    assert Source.from_dict(data) == source
    assert Source.from_dict(Source(module="a").to_dict()) == Source(module="a")
    with pytest.raises(ValueError, match="integer"):
        Source.from_dict({"line": 3.5})


def test_sources_and_node_modules_of_a_model() -> None:
    model = _model([
        _node("Mul", "node_mul", {STACK_TRACE: STACK, NAME_SCOPES: "['', 'stats', 'mul']"}),
        _node("Relu", "/head/Relu"),
        _node("Relu", "Relu_2"),
    ])
    assert list(sources(model)) == ["node_mul", "/head/Relu"]
    assert node_modules(model) == {"node_mul": "stats", "/head/Relu": "head", "Relu_2": None}


def _unet_modules() -> dict[str, str | None]:
    """Node -> module of a small UNet-like model: a time embedding (Linear, SiLU, Linear),
    3 output blocks each with a norm and a conv, and a node of unknown origin."""
    modules: dict[str, str | None] = {"t0": "time_embed.0", "t1": "time_embed.1",
                                      "t2": "time_embed.2"}
    for i in range(3):
        modules[f"n{i}a"] = f"output_blocks.{i}.norm"
        modules[f"n{i}b"] = f"output_blocks.{i}.norm"
        modules[f"c{i}"] = f"output_blocks.{i}.conv"
    modules["out"] = None
    return modules


def test_groups_name_whole_modules_and_indexed_siblings() -> None:
    modules = _unet_modules()
    chosen = ["t0", "t1", "t2", "n0a", "n0b", "n1a", "n1b", "n2a", "n2b", "out"]
    groups = group_by_module(chosen, modules)
    assert groups == {"time_embed": ["t0", "t1", "t2"],
                      "output_blocks.*.norm": ["n0a", "n0b", "n1a", "n1b", "n2a", "n2b"]}
    assert select_by_module(groups, modules) == [n for n in chosen if n != "out"]


def test_groups_keep_exact_paths_where_a_pattern_would_say_too_much() -> None:
    modules = _unet_modules()
    # two of three norms: `output_blocks.*.norm` would claim the third
    assert group_by_module(["n2a", "n0a"], modules) == {
        "output_blocks.2.norm": ["n2a"], "output_blocks.0.norm": ["n0a"]}
    # part of time_embed: its modules by name, not the whole
    assert group_by_module(["t0", "t2"], modules) == {"time_embed.0": ["t0"],
                                                       "time_embed.2": ["t2"]}
    # a whole block rises to it
    assert group_by_module(["n1a", "n1b", "c1"], modules) == {
        "output_blocks.1": ["n1a", "n1b", "c1"]}
    assert group_by_module(["x", "out"], modules) == {}


def test_in_module_matches_prefixes_by_component() -> None:
    assert in_module("encoder.layer.3.output", "encoder.layer.*")
    assert in_module("encoder.layer.3", "encoder.layer.3")
    assert not in_module("encoder.layer.30", "encoder.layer.3.output")
    assert not in_module("encoder.layers", "encoder.layer")
    assert in_module("", "") and in_module("a", "")
    assert not in_module("", "a")


def test_nodes_a_rewrite_made_inherit_the_metadata_of_the_nodes_they_replace() -> None:
    scopes = {NAME_SCOPES: "['', 'norm', 'mean']", STACK_TRACE: STACK}
    original = _model([_node("Relu", "first"), _node("ReduceMean", "mean", scopes),
                       _node("Sqrt", "sqrt", {NAME_SCOPES: "['', 'norm', 'sqrt']"})])
    fused = _model([_node("Relu", "first"), _node("Softmax", "mean/LN"),
                    _node("Relu", "own", {NAME_SCOPES: "['', 'head', 'relu']"})])
    origins = {"mean/LN": ["gone", "first", "mean", "sqrt"], "own": ["sqrt"]}
    assert inherit_metadata(fused, origins, original) == 1
    assert node_modules(fused) == {"first": None, "mean/LN": "norm", "own": "head"}
    assert source_of(fused.graph.node[1]).line == 4
