"""Every record of a report that names a node points at the user's Python when the ONNX
carries the exporter's metadata (set here by hand, as ``torch.onnx.export(dynamo=True)``
writes it) or TorchScript node names: layerwise rows, the joint cause's members, the length
decisions, the fix's FP32 nodes; JSON ``source`` objects, a short terminal line, the code in
the HTML (escaped)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from rich.console import Console
from tiny_models import IR_VERSION

import precision_doctor as pd
from precision_doctor.api.results import Diagnosis
from precision_doctor.graph.source import NAME_SCOPES, STACK_TRACE, Source
from precision_doctor.report.html import render_html
from precision_doctor.report.terminal.diagnosis import render_diagnosis
from precision_doctor.report.terminal.sources import module_names, torch_lines

CODE = "return (h * h).mean(-1) if n < 4 else h"  # "<" must reach the HTML escaped
STACK = (f'File "/home/me/net.py", line 12, in forward\n    return self.stats(h)\n'
         f'  File "/home/me/net.py", line 4, in forward\n    {CODE}\n')


def _model(dynamo: bool) -> onnx.ModelProto:
    """x [2, 8] -> Mul(x, x) -> ReduceMean over the last axis [2]: x ~ 1e3 overflows FP16 in
    the square. With ``dynamo``, both nodes carry module ``stats`` and the line above; else
    TorchScript names (``/encoder/layer.0/stats/Mul``)."""
    names = ("node_mul", "node_mean") if dynamo else ("/encoder/layer.0/stats/Mul",
                                                     "/encoder/layer.0/stats/ReduceMean")
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"], name=names[0]),
             helper.make_node("ReduceMean", ["sq"], ["y"], name=names[1], axes=[-1],
                              keepdims=0)]
    for node in nodes if dynamo else ():
        for key, value in ((STACK_TRACE, STACK), (NAME_SCOPES, "['', 'stats', 'op']")):
            entry = node.metadata_props.add()
            entry.key, entry.value = key, value
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=IR_VERSION)


def _feeds() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"x": (rng.standard_normal((2, 8)) * 1e3).astype(np.float32)} for _ in range(2)]


@pytest.fixture(scope="module")
def diagnosed(tmp_path_factory: pytest.TempPathFactory) -> pd.Diagnosis:
    path = tmp_path_factory.mktemp("src") / "net.onnx"
    onnx.save(_model(True), path)  # a file handed in directly
    return pd.diagnose(str(path), _feeds(), target="fp16", quiet=True, noise=False)


def test_layerwise_rows_carry_the_python_line_in_json_terminal_and_html(
        diagnosed: pd.Diagnosis) -> None:
    want = {"file": "/home/me/net.py", "line": 4, "code": CODE, "module": "stats"}
    records = diagnosed.to_dict()["layerwise"]["records"]
    assert [r["source"] for r in records] == [want, want]
    again = Diagnosis.from_dict(json.loads(json.dumps(diagnosed.to_dict())))
    assert again.sources == diagnosed.sources and again.layerwise == diagnosed.layerwise
    console = Console(width=80, record=True)
    render_diagnosis(diagnosed, console)
    text = console.export_text()
    assert "  first divergence at net.py:4 (stats): return (h * h).mean(-1) if n < 4 " \
           "else h" in text
    assert "(Mul node_mul) at net.py:4 (stats)" in text  # the error jump
    assert max(len(line) for line in text.splitlines()) <= 80
    html = render_html(diagnosed)
    assert '<code class="py">return (h * h).mean(-1) if n &lt; 4 else h</code>' in html
    assert CODE not in html


def test_torchscript_names_give_the_module_only(tmp_path: Path) -> None:
    d = pd.diagnose(_model(False), _feeds(), target="fp16", quiet=True, noise=False)
    records = d.to_dict()["layerwise"]["records"]
    assert records[0]["source"] == {"file": None, "line": None, "code": None,
                                    "module": "encoder.layer.0.stats"}
    assert Source(module="encoder.layer.0.stats").at() == "(module encoder.layer.0.stats)"


def test_joint_members_and_length_decisions_round_trip_their_sources(
        diagnosed: pd.Diagnosis) -> None:
    source = diagnosed.sources["node_mul"]
    joint = {"members": [{"kind": "activation-overflow", "node": "node_mul"}],
             "nodes": ["node_mul"], "share": 1.0, "alone": [1.0], "evaluations": 1,
             "minimal": True}
    data = replace(diagnosed, joint_cause=joint).to_dict()
    assert data["joint_cause"]["members"][0]["source"] == source.to_dict()
    assert Diagnosis.from_dict(data).sources["node_mul"] == source
    # a length decision's own "source" is its float input: its Python line is "origin"
    data["lengths"] = {"changes": [], "decisions": [], "roots": [], "reading": "unknown",
                       "summary": ""}
    data["lengths"]["decisions"].append({"node": "node_mean", "origin": source.to_dict()})
    assert Diagnosis.from_dict(data).sources["node_mean"] == source


def test_module_names_and_the_recipe_lines() -> None:
    modules = {f"n{i}": f"encoder.layer.{i}.output.LayerNorm" for i in range(3)}
    modules.update(s="stats", a="encoder.layer.0.attention")  # not selected: no lift
    assert module_names(["s", "n0", "n1", "n2"], modules) == \
        "stats, encoder.layer.*.output"  # every node of each output module
    lines = torch_lines({"fp32_modules": ["stats"], "autocast_dtype": "fp16", "device": "cuda",
                         "autocast_rel_l2": {"mean": 2.6e-4},
                         "autocast_alone_rel_l2": {"mean": "inf"},
                         "plan_rel_l2": {"mean": 2.5e-4}, "note": ""})
    assert lines == ["PyTorch recipe (*.torch.py): keep stats in float32 under autocast "
                     "FP16 (cuda)",
                     "  mean: rel L2 2.60e-04 with it, inf without (ONNX plan 2.50e-04, "
                     "emulated)"]
