import onnx
import pytest
from tiny_models import conv_bn, random_samples, transformer_block
from typer.testing import CliRunner

from precision_doctor.cli import app
from precision_doctor.compare.tasks.registry import get_metric
from precision_doctor.compare.tolerance import Tolerance
from precision_doctor.errors import MetricError, PlanError, TargetNotMetError
from precision_doctor.formats import Precision
from precision_doctor.repair.pipeline import fix
from precision_doctor.search.objective import Objective

TOL = Objective(tolerances={"*": Tolerance(rel_l2=1e-2)})


def test_layernorm_overflow_fixed_by_fusion_alone():
    """Field reports 1/2: fusing the decomposed LayerNorm (FP32 statistics) is enough."""
    model = transformer_block(hot_value=1000.0, opset=13)
    result = fix(model, random_samples((1, 8, 16)), Precision.FP16, TOL)
    assert result.passed and result.score_before.value > 1
    assert result.search.kept == ()  # no FP32 fallback needed
    fused = [r for r in result.rewrites["records"]
             if r["rule"] == "fuse-layernorm" and r["applied"]]
    assert len(fused) == 1
    assert any("FP32 statistics" in w for w in result.notes)
    ops = [n.op_type for n in result.model.graph.node]
    assert "LayerNormalization" in ops and "Pow" not in ops
    onnx.checker.check_model(result.model, full_check=True)


def test_search_keeps_the_nodes_that_need_fp32():
    # without rewrites the decomposed LayerNorm must stay FP32: the search finds it
    model = transformer_block(hot_value=1000.0, opset=13)
    result = fix(model, random_samples((1, 8, 16)), Precision.FP16, TOL, rewrites=[])
    assert result.passed
    assert "ln/pow" in result.search.kept
    assert 0 < len(result.search.kept) <= 7  # at most the LayerNorm's own nodes
    assert result.search.evaluations <= 20


def test_batchnorm_folded_and_io_kept_fp32():
    model = conv_bn()
    result = fix(model, random_samples((1, 3, 8, 8)), Precision.FP16, TOL)
    assert result.passed and result.search.kept == ()
    g = result.model.graph
    assert [i.name for i in g.input] == ["x"] and [o.name for o in g.output] == ["y"]
    assert g.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert not any(n.op_type == "BatchNormalization" for n in g.node)


def test_bad_requests():
    model = conv_bn()
    samples = random_samples((1, 3, 8, 8))
    with pytest.raises(PlanError, match="nosuchnode"):
        fix(model, samples, Precision.FP16, TOL, keep=["nosuchnode"])
    impossible = Objective(metric=get_metric("top1"), threshold=1.5)
    with pytest.raises(TargetNotMetError):
        fix(model, samples, Precision.FP16, impossible, rewrites=[])

    def nan_metric(reference, candidate):
        return float("nan")

    import sys
    import types

    mod = types.ModuleType("pd_test_metrics")
    mod.nan_metric = nan_metric
    sys.modules["pd_test_metrics"] = mod
    with pytest.raises(MetricError, match="nan_metric"):
        fix(model, samples, Precision.FP16,
            Objective(metric=get_metric("pd_test_metrics:nan_metric"), threshold=0.5))


def test_cli_fix_writes_model_plan_recipes_and_never_overwrites(tmp_path):
    model_path = tmp_path / "m.onnx"
    onnx.save(transformer_block(hot_value=1000.0), str(model_path))
    out = tmp_path / "fixed.onnx"
    runner = CliRunner()
    args = ["fix", str(model_path), "-o", str(out), "--data",
            "random:seed=0,low=-1,high=1,count=2,shape=x:1x8x16"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    for suffix in (".plan.json", ".recipes.md", ".report.json", ".rewritten-fp32.onnx"):
        assert (tmp_path / f"fixed{suffix}").exists()
    assert "trtexec" in (tmp_path / "fixed.recipes.md").read_text()
    before = out.read_bytes()
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and "--force" in res.output
    assert out.read_bytes() == before
    res = runner.invoke(app, ["fix", str(model_path), "-o", str(tmp_path / "n.onnx"), "--data",
                              "random:count=1,shape=x:1x8x16", "--metric", "top1",
                              "--threshold", "2"])
    assert res.exit_code == 1 and "not met" in res.output
    assert not (tmp_path / "n.onnx").exists()


def test_near_tie_samples_are_listed_and_left_out():
    import numpy as np
    from onnx import TensorProto, helper
    from tiny_models import S, make_model, tensor

    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"], name="mm"),
             helper.make_node("Softmax", ["logits"], ["p"], name="sm", axis=-1)]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                       [helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, 4])],
                       [tensor("w", np.eye(4))])
    tie = S("tie", {"x": np.array([[2.0, 2.0, 0.0, 0.0]], np.float32)})
    clear = S("clear", {"x": np.array([[3.0, 0.0, 0.0, 0.0]], np.float32)})
    result = fix(model, [tie, clear], Precision.FP16,
                 Objective(metric=get_metric("top1"), threshold=1.0))
    assert [t.sample for t in result.near_ties] == ["tie"]
    assert result.near_ties[0].margin == 0.0
    assert result.passed and result.to_dict()["near_ties"][0]["sample"] == "tie"
