"""prescale-attention and layernorm-fp32-stats on one-block attention models built here."""

import math
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "diagnosis"))
from test_transformer import D, T, attention_block  # noqa: E402

from precision_doctor.formats import Precision  # noqa: E402
from precision_doctor.graph.outputs import mark_outputs  # noqa: E402
from precision_doctor.layerwise.candidates import reference_factory  # noqa: E402
from precision_doctor.precision.plan import PrecisionPlan  # noqa: E402
from precision_doctor.precision.rewrites import apply_rewrites  # noqa: E402
from precision_doctor.runners.emulator import EmulatorRunner  # noqa: E402


def _x(scale=1.0):
    return {"x": (np.random.default_rng(3).normal(0, 1, (1, T, D)) * scale).astype(np.float32)}


def _run(model, feeds, names=("y",)):
    with reference_factory(model) as r:
        return r.run(feeds, list(names))


def _emulate(model, feeds, names=("y",)):
    with EmulatorRunner(mark_outputs(model, names), PrecisionPlan(Precision.FP16)) as r:
        return r.run(feeds, list(names))


def _rel(a, b):
    if not np.isfinite(b).all():
        return math.inf
    return float(np.linalg.norm(b - a) / np.linalg.norm(a))


def test_prescale_folds_the_scale_into_wq_and_cures_qk_overflow():
    """Wq gain 8000: QK^T peaks above 65504, QK^T / 4 does not (Q itself fits)."""
    model = attention_block(fused=True, q_gain=8000.0)
    feeds = _x(1.0)
    scores = _run(mark_outputs(model, ["s"]), feeds, ["s"])["s"]
    assert 65520 < np.abs(scores).max() < 4 * 65504  # overflows before the scale only
    out, report = apply_rewrites(model, ["prescale-attention"])
    (rec,) = report.applied("prescale-attention")
    assert "weights of MatMul 'attn/q'" in rec.reason and rec.details["scale"] == 0.25
    assert "attn/scale" not in {n.name for n in out.graph.node}
    assert len(out.graph.node) == len(model.graph.node) - 1  # no node added
    ref, new = _run(model, feeds)["y"], _run(out, feeds)["y"]
    np.testing.assert_allclose(new, ref, rtol=1e-5, atol=1e-5)  # FP32 unchanged
    before, after = _rel(ref, _emulate(model, feeds)["y"]), _rel(ref, _emulate(out, feeds)["y"])
    assert before > 0.1 and after < 1e-2


def test_prescale_inserts_a_mul_when_q_is_not_a_constant_projection():
    model = attention_block(fused=True, q_gain=8000.0)
    # make Q's weight a graph input: the scale cannot be folded, a Mul goes on Q instead
    wq = next(i for i in model.graph.initializer if i.name == "wq")
    model.graph.input.append(onnx.helper.make_tensor_value_info("wq", onnx.TensorProto.FLOAT,
                                                                 [D, D]))
    arr = onnx.numpy_helper.to_array(wq)
    model.graph.initializer.remove(wq)
    feeds = {**_x(1.0), "wq": arr}
    out, report = apply_rewrites(model, ["prescale-attention"])
    (rec,) = report.applied("prescale-attention")
    assert "a Mul" in rec.reason and rec.new_nodes
    np.testing.assert_allclose(_run(out, feeds)["y"], _run(model, feeds)["y"], rtol=1e-5,
                               atol=1e-5)
    assert _rel(_run(model, feeds)["y"], _emulate(out, feeds)["y"]) < 1e-2


def test_prescale_says_why_it_does_not_fire():
    _, report = apply_rewrites(attention_block(post_scale=False), ["prescale-attention"])
    (rec,) = report.skipped("prescale-attention")
    assert "already pre-scaled, or unscaled" in rec.reason


def test_layernorm_fp32_stats_sets_stash_type_and_cures_the_variance_overflow():
    """stash_type=0 on an FP16 engine = FP16 statistics: |x - mean| ~ 600 overflows d^2."""
    model = attention_block(fused=True, stash_type=0)
    feeds = _x(200.0)
    out, report = apply_rewrites(model, ["layernorm-fp32-stats"])
    (rec,) = report.applied("layernorm-fp32-stats")
    assert rec.nodes == ("ln/fused",) and rec.details["stash_type"] == 0
    ln = next(n for n in out.graph.node if n.op_type == "LayerNormalization")
    assert {a.name: a.i for a in ln.attribute}["stash_type"] == 1
    np.testing.assert_array_equal(_run(out, feeds)["y"], _run(model, feeds)["y"])
    ln_out = ("ln",)  # the emulator expands stash_type=0 into its FP16 statistics chain
    ref = _run(mark_outputs(model, ln_out), feeds, ln_out)["ln"]
    assert _rel(ref, _emulate(model, feeds, ln_out)["ln"]) > 0.5  # d^2 = inf: rows collapse
    assert _rel(ref, _emulate(out, feeds, ln_out)["ln"]) < 5e-3
    _, again = apply_rewrites(out, ["layernorm-fp32-stats"])
    assert "already 1" in again.skipped("layernorm-fp32-stats")[0].reason


def test_decomposed_layernorm_overflow_is_cured_by_fusion_with_fp32_statistics():
    """Opset 13 chain, |x - mean| > 255.9: fuse-layernorm raises the opset and fuses with
    stash_type=1; the emulated FP16 error drops from total loss to rounding."""
    model, feeds = attention_block(fused=False), _x(200.0)
    out, report = apply_rewrites(model, ["fuse-layernorm", "layernorm-fp32-stats"])
    assert report.applied("fuse-layernorm") and report.opset_after == 17
    ln = ("ln",)  # the LayerNorm output (y = attention + x is dominated by x)
    ref = _run(mark_outputs(model, ln), feeds, ln)["ln"]
    np.testing.assert_allclose(_run(mark_outputs(out, ln), feeds, ln)["ln"], ref, rtol=1e-4,
                               atol=1e-4)
    assert _rel(ref, _emulate(model, feeds, ln)["ln"]) > 0.5
    assert _rel(ref, _emulate(out, feeds, ln)["ln"]) < 5e-3


@pytest.mark.parametrize("rules", [None])
def test_all_rewrites_run_together_on_a_block(rules):
    out, report = apply_rewrites(attention_block(fused=False, q_gain=8000.0), rules)
    assert {r.rule for r in report.applied()} >= {"prescale-attention", "fuse-layernorm"}


def test_fix_keeps_only_the_statistics_in_fp32_when_the_layernorm_is_not_fused():
    """Opset 13 kept (fuse-layernorm not run): fix puts Casts around the statistics chain
    (6 nodes: mean, Sub, Pow, variance, +eps, Sqrt) instead of searching; target met."""
    from tiny_models import S

    from precision_doctor.compare.tolerance import Tolerance
    from precision_doctor.repair.pipeline import fix
    from precision_doctor.search.objective import Objective

    model = attention_block(fused=False)
    samples = [S(f"s{i}", {"x": _x(200.0)["x"] * (1 + i / 10)}) for i in range(2)]
    result = fix(model, samples, Precision.FP16,
                 Objective(tolerances={"*": Tolerance(rel_l2=1e-2)}),
                 rewrites=["prescale-attention", "layernorm-fp32-stats"])
    assert result.passed
    kept = {n for n, d in result.plan.overrides.items() if d.precision is Precision.FP32}
    assert kept == {"ln/mean", "ln/sub", "ln/pow", "ln/var", "ln/add_eps", "ln/sqrt"}
    assert all(result.plan.overrides[n].reason == "rewrite" for n in kept)
    assert result.search.evaluations <= 1
