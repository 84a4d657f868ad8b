"""Transformer headroom analysis and the stress probe, on a one-block attention model."""

import json
import math

import numpy as np
import pytest
from onnx import TensorProto, helper
from tiny_models import make_model, tensor

from precision_doctor.diagnosis.headroom.probe import analyze_transformer, layernorm_statistics
from precision_doctor.diagnosis.headroom.records import TransformerReport
from precision_doctor.diagnosis.headroom.sites import find_attention, find_layernorms
from precision_doctor.diagnosis.headroom.stress import StressResult, stress_probe
from precision_doctor.formats import Precision
from precision_doctor.graph.outputs import mark_outputs
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners.emulator import EmulatorRunner

D, T = 16, 6


def attention_block(fused: bool = False, post_scale: bool = True, stash_type: int = 1,
                    q_gain: float = 1.0):
    """x -> LayerNorm -> Q, K, V -> softmax(QK^T / sqrt(D)) V -> + x (one head, no mask).

    ``fused``: one LayerNormalization (opset 17) instead of the opset-13 chain. ``post_scale``:
    scale after the MatMul (the eager-export shape) instead of none. ``q_gain`` multiplies Wq
    (large scores).
    """
    rng = np.random.default_rng(0)
    w = {k: rng.normal(0, 1 / math.sqrt(D), (D, D)).astype(np.float32) for k in "qkv"}
    w["q"] *= q_gain
    inits = [tensor(f"w{k}", v) for k, v in w.items()]
    inits += [tensor("gamma", np.ones(D)), tensor("beta", np.zeros(D)),
              tensor("two", 2.0), tensor("eps", 1e-5), tensor("sqrt_d", math.sqrt(D))]
    if fused:
        nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln"],
                                  name="ln/fused", axis=-1, epsilon=1e-5,
                                  stash_type=stash_type)]
    else:
        nodes = [
            helper.make_node("ReduceMean", ["x"], ["mean"], name="ln/mean", axes=[-1]),
            helper.make_node("Sub", ["x", "mean"], ["d"], name="ln/sub"),
            helper.make_node("Pow", ["d", "two"], ["d2"], name="ln/pow"),
            helper.make_node("ReduceMean", ["d2"], ["var"], name="ln/var", axes=[-1]),
            helper.make_node("Add", ["var", "eps"], ["ve"], name="ln/add_eps"),
            helper.make_node("Sqrt", ["ve"], ["std"], name="ln/sqrt"),
            helper.make_node("Div", ["d", "std"], ["n"], name="ln/div"),
            helper.make_node("Mul", ["n", "gamma"], ["ng"], name="ln/scale"),
            helper.make_node("Add", ["ng", "beta"], ["ln"], name="ln/shift")]
    nodes += [helper.make_node("MatMul", ["ln", f"w{k}"], [k], name=f"attn/{k}") for k in "qkv"]
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], name="attn/kt", perm=[0, 2, 1]),
              helper.make_node("MatMul", ["q", "kt"], ["s"], name="attn/qk")]
    if post_scale:
        nodes.append(helper.make_node("Div", ["s", "sqrt_d"], ["ss"], name="attn/scale"))
    nodes += [helper.make_node("Softmax", ["ss" if post_scale else "s"], ["p"], name="attn/softmax",
                               axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["o"], name="attn/pv"),
              helper.make_node("Add", ["o", "x"], ["y"], name="residual")]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, T, D])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, T, D])],
                      inits, opset=17 if fused else 13)


def _x(scale: float = 1.0, seed: int = 1) -> dict:
    return {"x": (np.random.default_rng(seed).normal(0, 1, (1, T, D)) * scale).astype(np.float32)}


def test_sites_are_found_in_decomposed_and_fused_blocks():
    for fused in (False, True):
        model = attention_block(fused=fused)
        (ln,) = find_layernorms(model)
        assert ln.kind == ("fused" if fused else "decomposed") and ln.input == "x"
        assert ln.square == (None if fused else "d2")
        (att,) = find_attention(model)
        assert (att.matmul, att.scores, att.softmax_input) == ("attn/qk", "s", "ss")
        assert att.scale == pytest.approx(1 / math.sqrt(D))


def test_layernorm_statistics_fp16_overflow_above_255_9():
    x = np.zeros((1, 2, D), np.float32)
    x[..., 0] = 300.0  # |x - mean| = 281 > 255.9 -> d^2 = 79,000 > 65504
    st = layernorm_statistics(x, -1, 1e-5)
    assert st["dev_max"] == pytest.approx(300 * (1 - 1 / D))
    # variance = inf -> d / inf = 0: the normalized rows collapse to zero (relative error 1)
    assert st["fp16_stats_overflow"] == 1.0 and st["fp16_stats_rel_l2"] == pytest.approx(1.0)
    assert st["fp32_stats_rel_l2"] < 1e-3
    ok = layernorm_statistics(x / 2, -1, 1e-5)  # 140 < 255.9
    assert ok["fp16_stats_overflow"] == 0.0 and ok["fp16_stats_rel_l2"] < 1e-2


def test_headroom_table_names_the_limiting_site_and_round_trips():
    report = analyze_transformer(attention_block(), [_x(200.0)])
    (ln,), (att,) = report.layernorms, report.attention
    assert ln.statistics == "fp16" and ln.fp16_stats_overflow
    assert ln.variance_headroom < 1 < ln.input_headroom
    (block,) = report.blocks
    assert (block.limiting, block.node) == ("variance", "ln/mean")
    assert att.scores_max > 0 and att.scale == pytest.approx(0.25)
    again = TransformerReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again == report
    fused = analyze_transformer(attention_block(fused=True), [_x(200.0)])
    assert fused.layernorms[0].statistics == "fp32"
    assert fused.blocks[0].limiting != "variance"  # FP32 statistics: x itself fits
    assert any("FP32 statistics assumed" in s for s in fused.statistics)
    stash0 = analyze_transformer(attention_block(fused=True, stash_type=0), [_x(200.0)])
    assert stash0.layernorms[0].statistics == "fp16" and stash0.blocks[0].limiting == "variance"


def test_stress_factor_is_checked_by_the_emulator():
    """At the reported factor the FP16 emulator overflows at the named tensor; below, not."""
    model, feeds = attention_block(), _x(1.0)
    result = stress_probe(model, [feeds])
    assert result.kind == "variance" and result.node == "ln/mean" and result.tensor == "d2"
    assert result.verified is True
    assert 1.0 < result.safe_factor < result.factor < result.safe_factor * 1.05
    dev = float(np.abs(feeds["x"] - feeds["x"].mean(-1, keepdims=True)).max())
    assert result.factor == pytest.approx(255.94 / dev, rel=0.03)  # sqrt(65520) / max|x - mean|
    for factor, overflows in ((result.safe_factor * 0.97, False), (result.factor, True)):
        with EmulatorRunner(mark_outputs(model, ["d2"]), PrecisionPlan(Precision.FP16)) as r:
            got = r.run({"x": feeds["x"] * np.float32(factor)}, ["d2"])["d2"]
        assert (not np.isfinite(got).all()) is overflows
    assert StressResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result


def test_stress_scales_the_tightest_layernorm_input_of_a_token_model():
    """Integer inputs (token ids -> embedding Gather): the residual entering the LayerNorm with
    the least headroom is scaled; the factor is sqrt(65520) / max|x - mean| there."""
    model = attention_block()
    table = np.random.default_rng(5).normal(0, 30, (50, D)).astype(np.float32)
    model.graph.initializer.append(tensor("emb", table))
    model.graph.node.insert(0, helper.make_node("Gather", ["emb", "ids"], ["x"], name="embed"))
    del model.graph.input[:]
    model.graph.input.append(helper.make_tensor_value_info("ids", TensorProto.INT64, [1, T]))
    ids = {"ids": np.arange(T, dtype=np.int64)[None] * 7 % 50}
    report = analyze_transformer(model, [ids])
    result = stress_probe(model, [ids], report)
    assert result.scaled == "tensor: x" and result.node == "ln/mean" and result.verified
    x = table[ids["ids"][0]]
    dev = float(np.abs(x - x.mean(-1, keepdims=True)).max())
    assert result.factor == pytest.approx(255.94 / dev, rel=0.03)


def test_stress_on_attention_scores_when_layernorm_is_fused():
    """FP32 statistics: the first overflow is QK^T (scores grow as factor^0 after LN, so a
    large Wq is what pushes them): the probe reports no overflow up to its maximum."""
    result = stress_probe(attention_block(fused=True, q_gain=1.0), [_x(1.0)])
    assert result.factor is None and result.safe_factor == result.max_factor


def test_diagnose_reports_the_headroom_table_in_json_and_html():
    from tiny_models import S

    from precision_doctor.diagnosis.diagnose import diagnose
    from precision_doctor.diagnosis.report import DiagnosisReport
    from precision_doctor.layerwise.candidates import emulated
    from precision_doctor.report.html import render_html

    model = attention_block()
    report = diagnose(model, [S("s0", _x(200.0))], Precision.FP16,
                      emulated(PrecisionPlan(Precision.FP16)), noise=False, stress=True)
    t = report.transformer
    assert t["blocks"][0]["limiting"] == "variance" and t["blocks"][0]["node"] == "ln/mean"
    assert t["stress"]["factor"] == 1.0  # the real input already overflows
    again = DiagnosisReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again.transformer == t
    html = render_html(report)
    assert 'id="transformer"' in html and "Transformer headroom" in html and "ln/mean" in html
    plain = diagnose(model, [S("s0", _x(1.0))], Precision.FP16,
                     emulated(PrecisionPlan(Precision.FP16)), noise=False, layerwise=False)
    assert plain.transformer["stress"] is None and plain.verdict == "pass"
