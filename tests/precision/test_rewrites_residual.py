"""prescale-normalized-residual: a residual stream read only by normalizations, scaled by 2^-k
through its producers' constants, gives bit-identical FP32 outputs and fits FP16 with no node
in FP32; every check names what blocks it."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import precision_doctor as pd
from precision_doctor.formats import Precision
from precision_doctor.inputs.feeds import Sample
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.precision.rewrites import apply_rewrites
from precision_doctor.precision.rewrites.ranges.residual import HEADROOM, shift_for
from precision_doctor.repair.rewrites_proof import prove_rewrites, stream_maxima
from precision_doctor.runners.emulator import EmulatorRunner

RULE = "prescale-normalized-residual"
C = 64


class _Graph:
    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def const(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def node(self, op: str, inputs: list[str], output: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def conv(self, x: str, name: str, cin: int, cout: int, std: float) -> str:
        w = self.const(f"{name}_w", self.rng.normal(0, std / np.sqrt(9 * cin), (cout, cin, 3, 3)))
        b = self.const(f"{name}_b", self.rng.normal(0, 1, cout))
        return self.node("Conv", [x, w, b], name, pads=[1, 1, 1, 1])

    def norm(self, x: str, name: str, op: str = "GroupNormalization", channels: int = C) -> str:
        s = self.const(f"{name}_s", np.ones(channels))
        b = self.const(f"{name}_b", np.zeros(channels))
        attrs = {"num_groups": 2} if op == "GroupNormalization" else {}
        return self.node(op, [x, s, b], name, epsilon=1e-5, **attrs)

    def model(self, output: str, channels: int = 3) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, "stream",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
            [helper.make_tensor_value_info(output, TensorProto.FLOAT, [1, channels, 16, 16])],
            self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
        model.ir_version = 10
        onnx.checker.check_model(model, full_check=True)
        return model


def vae_stream(blocks: int = 6, op: str = "GroupNormalization", extra: str = "") -> onnx.ModelProto:
    """A VAE decoder's residual stream in miniature, 64 channels: ``h0 = Conv(x)``; per block
    ``h += Conv(SiLU(Norm(h)))``, each block's Conv 1.6x the last, so that the stream reaches
    about 1e6 with every weight inside FP16's range (|w| < 4e4); output ``Conv(Norm(h))``
    float32 ``[1, 3, 16, 16]``. ``extra``:
    ``shortcut`` adds a Conv that reads the stream directly (a linear part of it),
    ``sigmoid`` a Sigmoid of the stream added to the output (blocks it)."""
    g = _Graph()
    h = g.conv("x", "conv_in", 3, C, 2e4)
    for i in range(blocks):
        n = g.norm(h, f"norm{i}", op)
        a = g.node("Mul", [n, g.node("Sigmoid", [n], f"sig{i}")], f"silu{i}")
        r = g.conv(a, f"conv{i}", C, C, 2e4 * 1.6 ** i)
        if extra == "shortcut" and i == 2:
            h = g.conv(h, "shortcut", C, C, 1.0)
        h = g.node("Add", [h, r], f"h{i + 1}")
    y = g.conv(g.norm(h, "norm_out", op), "conv_out", C, 3, 1.0)
    if extra == "sigmoid":
        gate = g.conv(g.node("Sigmoid", [h], "gate"), "gate_conv", C, 3, 1.0)
        y = g.node("Add", [y, gate], "y_gated")
    return g.model(y)


def _samples(n: int = 2) -> list[Sample]:
    rng = np.random.default_rng(1)
    return [Sample(f"s{i}", {"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)})
            for i in range(n)]


def _run(model: onnx.ModelProto, samples: list[Sample]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [session.run(None, s.feeds)[0] for s in samples]


def _rel(outs: list[np.ndarray], refs: list[np.ndarray]) -> float:
    out = np.concatenate([o.ravel() for o in outs]).astype(np.float64)
    ref = np.concatenate([r.ravel() for r in refs]).astype(np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def _fp16(model: onnx.ModelProto, samples: list[Sample]) -> list[np.ndarray]:
    with EmulatorRunner(model, PrecisionPlan(Precision.FP16)) as runner:
        name = model.graph.output[0].name
        return [runner.run(s.feeds)[name] for s in samples]


def test_shift_puts_the_maximum_under_the_headroom() -> None:
    assert shift_for(HEADROOM) == 0 and shift_for(float("inf")) == 0
    assert shift_for(HEADROOM * 2 ** 7 + 1) == 8
    assert shift_for(1e6) * 0 + 1e6 * 2.0 ** -shift_for(1e6) <= HEADROOM


def test_groupnorm_stream_is_bit_exact_in_fp32_and_fits_fp16() -> None:
    model, samples = vae_stream(), _samples()
    maxima = stream_maxima(model, samples)
    assert 5e5 < max(maxima.values()) < 5e6  # the stream reaches about 1e6
    weights = [numpy_helper.to_array(t) for t in model.graph.initializer]
    assert max(float(np.abs(w).max()) for w in weights) < 4e4  # every weight fits FP16
    rewritten, report = apply_rewrites(model, target=Precision.FP16, max_abs=maxima)
    [record] = report.applied(RULE)
    assert record.details["shift"] == shift_for(max(maxima.values()))
    assert record.details["max_abs_after"] <= HEADROOM and record.keep_fp32 == ()
    assert not report.fp32_decisions()
    ref = _run(model, samples)
    assert all(np.array_equal(a, b) for a, b in zip(ref, _run(rewritten, samples)))
    naive = _fp16(model, samples)
    assert not any(np.isfinite(o).any() for o in naive)  # all NaN/inf in FP16 before
    assert _rel(_fp16(rewritten, samples), ref) < 2e-3  # 6.5e-4: within FP16 rounding after


def test_epsilon_is_scaled_by_the_square_of_the_scale() -> None:
    model, samples = vae_stream(blocks=2), _samples(1)
    rewritten, report = apply_rewrites(model, [RULE], target=Precision.FP16,
                                       max_abs=stream_maxima(model, samples))
    [record] = report.applied(RULE)
    k = int(record.details["shift"])
    eps = {n.name: helper.get_attribute_value(a) for n in rewritten.graph.node
           for a in n.attribute if a.name == "epsilon"}
    assert eps and all(e == np.float32(np.ldexp(np.float32(1e-5), -2 * k)) for e in eps.values())


def test_instance_and_layer_norm_streams_too() -> None:
    samples = _samples(1)
    for op in ("InstanceNormalization",):
        model = vae_stream(blocks=3, op=op)
        rewritten, report = apply_rewrites(model, [RULE], target=Precision.FP16,
                                           max_abs=stream_maxima(model, samples))
        assert report.applied(RULE)
        assert all(np.array_equal(a, b) for a, b in zip(_run(model, samples),
                                                         _run(rewritten, samples)))
    g = _Graph()  # a transformer's stream: tokens [1, 48, 16], MatMul -> Add -> LayerNorm
    g.inits.append(numpy_helper.from_array(np.array([1, 48, 16], np.int64), "shape"))
    x = g.node("Reshape", ["x", "shape"], "tokens")
    h = g.node("MatMul", [x, g.const("w_in", g.rng.normal(0, 3e4, (16, 16)))], "h0")
    for i in range(3):
        n = g.node("LayerNormalization", [h, g.const(f"ln{i}_s", np.ones(16))], f"ln{i}",
                   axis=-1, epsilon=1e-5)
        w = g.const(f"w{i}", g.rng.normal(0, 3e4, (16, 16)))
        h = g.node("Add", [h, g.node("MatMul", [n, w], f"mm{i}")], f"h{i + 1}")
    y = g.node("LayerNormalization", [h, g.const("lno_s", np.ones(16))], "y", axis=-1)
    graph = helper.make_graph(g.nodes, "ln", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, 16, 16])], [helper.make_tensor_value_info(
            y, TensorProto.FLOAT, [1, 48, 16])], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    rewritten, report = apply_rewrites(model, [RULE], target=Precision.FP16,
                                       max_abs=stream_maxima(model, samples))
    [record] = report.applied(RULE)
    assert record.details["norms"] == 4
    assert all(np.array_equal(a, b) for a, b in zip(_run(model, samples),
                                                     _run(rewritten, samples)))


def test_pytorch_groupnorm_before_opset_18_is_a_normalization_too() -> None:
    """torch.onnx's GroupNorm at opset < 18: Reshape(x, [N, G, -1]) (N from Shape(x)) ->
    InstanceNormalization(ones, zeros) -> Reshape(x's shape) -> Mul(gamma) -> Add(beta)."""
    g = _Graph()
    g.inits += [numpy_helper.from_array(np.array([0], np.int64), "zero"),
                numpy_helper.from_array(np.array([2, -1], np.int64), "g_rest")]
    h = g.conv("x", "conv_in", 3, C, 2e4)
    for i in range(3):
        shape = g.node("Shape", [h], f"shape{i}")
        n = g.node("Gather", [shape, "zero"], f"batch{i}", axis=0)
        grouped = g.node("Reshape", [h, g.node("Concat", [n, "g_rest"], f"gshape{i}", axis=0)],
                         f"grouped{i}")
        inorm = g.norm(grouped, f"inorm{i}", "InstanceNormalization", channels=2)
        back = g.node("Reshape", [inorm, shape], f"back{i}")
        gamma = g.const(f"gamma{i}", np.ones((C, 1, 1)))
        beta = g.const(f"beta{i}", np.zeros((C, 1, 1)))
        n = g.node("Add", [g.node("Mul", [back, gamma], f"scaled{i}"), beta], f"gn{i}")
        h = g.node("Add", [h, g.conv(n, f"conv{i}", C, C, 2e4 * 1.6 ** i)], f"h{i + 1}")
    model = g.model(g.conv(g.norm(h, "norm_out"), "conv_out", C, 3, 1.0))
    samples = _samples(1)
    rewritten, report = apply_rewrites(model, [RULE], target=Precision.FP16,
                                       max_abs=stream_maxima(model, samples))
    [record] = [r for r in report.records if r.applied]
    assert {"inorm0", "inorm1", "inorm2", "norm_out"} <= set(record.nodes)
    assert all(np.array_equal(a, b) for a, b in zip(_run(model, samples),
                                                     _run(rewritten, samples)))


def test_a_conv_reading_the_stream_is_part_of_it() -> None:
    model, samples = vae_stream(extra="shortcut"), _samples(1)
    rewritten, report = apply_rewrites(model, [RULE], target=Precision.FP16,
                                       max_abs=stream_maxima(model, samples))
    [record] = report.applied(RULE)
    assert "shortcut" in record.nodes
    weights = {i.name for i in rewritten.graph.initializer}
    assert "shortcut_w" in weights and "shortcut_b" not in weights  # only its bias scaled
    assert all(np.array_equal(a, b) for a, b in zip(_run(model, samples),
                                                     _run(rewritten, samples)))


def test_checks_name_what_blocks_the_stream() -> None:
    model = vae_stream(extra="sigmoid")
    _, report = apply_rewrites(model, [RULE], target=Precision.FP16,
                               max_abs={f"h{i}": 1e6 for i in range(7)})
    [record] = report.skipped(RULE)
    assert record.reason == "Sigmoid 'gate' reads 'h6' (input 0) and is not scale-invariant"
    model = vae_stream(blocks=2)
    _, report = apply_rewrites(model, [RULE], target=Precision.FP16)
    [record] = report.skipped(RULE)
    assert record.details["candidate"] and "no calibration maxima" in record.reason
    _, report = apply_rewrites(model, [RULE], target=Precision.BF16)
    assert "no stream overflows it" in report.skipped(RULE)[0].reason
    _, report = apply_rewrites(model, [RULE], target=Precision.FP16, max_abs={"conv_in": 100.0})
    assert "within the headroom" in report.skipped(RULE)[0].reason
    assert apply_rewrites(model, [RULE])[1].records == ()
    g = _Graph()  # a stream a Sigmoid writes: nothing scales it
    g.norm(g.node("Sigmoid", ["x"], "gate"), "y", "InstanceNormalization", channels=3)
    _, report = apply_rewrites(g.model("y"), [RULE], target=Precision.FP16)
    assert report.skipped(RULE)[0].reason == ("Sigmoid 'gate' produces 'gate' and has no "
                                              "constant to scale it by")


def test_fix_measures_the_stream_and_keeps_nothing_in_fp32() -> None:
    model, samples = vae_stream(), _samples(3)
    out = model.graph.output[0].name
    rewritten, report = apply_rewrites(model, target=Precision.FP16)
    _, proved = prove_rewrites(model, rewritten, report, samples, [out], Precision.FP16, None)
    [record] = proved.applied(RULE)
    assert record.details["max_abs"] > 5e5
    fixed = pd.fix(model, [s.feeds for s in samples], target="fp16", quiet=True, device="cpu")
    assert fixed.passed and fixed.fp32_nodes == []
    assert not np.isfinite(float(fixed.report["before"][out]["rel_l2"]))  # NaN/inf naive
    assert fixed.report["after"][out]["rel_l2"] < 2e-3  # 6.1e-4, the written model


def test_an_rms_stream_from_an_embedding_table() -> None:
    """A T5-like decoder stack: token ids -> Gather(embedding table) -> per block
    ``h += MatMul(RMSNorm(h), W)``; the stream passes 65504, the table is scaled."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.normal(0, 2e3, (50, 16)).astype(np.float32), "emb")]
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["h0"], name="embed")]
    for i in range(3):
        inits += [numpy_helper.from_array(np.ones(16, np.float32), f"g{i}"),
                  numpy_helper.from_array(rng.normal(0, 6e3, (16, 16)).astype(np.float32),
                                          f"w{i}")]
        nodes += [helper.make_node("RMSNormalization", [f"h{i}", f"g{i}"], [f"n{i}"],
                                   name=f"rms{i}", axis=-1, epsilon=1e-6),
                  helper.make_node("MatMul", [f"n{i}", f"w{i}"], [f"m{i}"], name=f"mm{i}"),
                  helper.make_node("Add", [f"h{i}", f"m{i}"], [f"h{i + 1}"], name=f"add{i}")]
    inits.append(numpy_helper.from_array(np.ones(16, np.float32), "g_out"))
    nodes.append(helper.make_node("RMSNormalization", ["h3", "g_out"], ["y"], name="rms_out",
                                  axis=-1))
    graph = helper.make_graph(
        nodes, "t5", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 12, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 11
    samples = [Sample("s", {"ids": rng.integers(0, 50, (1, 12))})]
    maxima = stream_maxima(model, samples)
    assert max(maxima.values()) > 65504
    rewritten, report = apply_rewrites(model, [RULE], target=Precision.FP16, max_abs=maxima)
    [record] = report.applied(RULE)
    assert "embed" in record.nodes and record.details["norms"] == 4
    ref = _run(model, samples)
    assert all(np.array_equal(a, b) for a, b in zip(ref, _run(rewritten, samples)))
    assert not np.isfinite(_fp16(model, samples)[0]).all()
    assert _rel(_fp16(rewritten, samples), ref) < 2e-3


def test_t5s_decomposed_rmsnorm_reads_the_stream_too() -> None:
    """T5's export of ``x * rsqrt(x.to(float32).pow(2).mean(-1) + eps)`` in three spellings
    (Reciprocal, Div(1, r), Div(x, r)) behind a Gather; epsilon is a constant input."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.normal(0, 2e3, (50, 16)).astype(np.float32), "emb"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(1e-6, np.float32), "eps")]
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["h0"], name="embed")]

    def rms(x: str, i: str, spelling: str) -> str:
        nodes.extend([
            helper.make_node("Cast", [x], [f"c{i}"], name=f"cast{i}", to=TensorProto.FLOAT),
            helper.make_node("Pow", [f"c{i}", "two"], [f"p{i}"], name=f"pow{i}"),
            helper.make_node("ReduceMean", [f"p{i}"], [f"m{i}"], name=f"mean{i}", axes=[-1]),
            helper.make_node("Add", [f"m{i}", "eps"], [f"a{i}"], name=f"add_eps{i}"),
            helper.make_node("Sqrt", [f"a{i}"], [f"r{i}"], name=f"sqrt{i}")])
        if spelling == "div":
            nodes.append(helper.make_node("Div", [x, f"r{i}"], [f"n{i}"], name=f"norm{i}"))
            return f"n{i}"
        nodes.append(helper.make_node("Reciprocal", [f"r{i}"], [f"q{i}"], name=f"inv{i}")
                     if spelling == "reciprocal" else
                     helper.make_node("Div", ["one", f"r{i}"], [f"q{i}"], name=f"inv{i}"))
        nodes.append(helper.make_node("Mul", [x, f"q{i}"], [f"n{i}"], name=f"norm{i}"))
        return f"n{i}"

    h = "h0"
    for i, spelling in enumerate(("reciprocal", "one_over", "div")):
        inits.append(numpy_helper.from_array(rng.normal(0, 6e3, (16, 16)).astype(np.float32),
                                             f"w{i}"))
        n = rms(h, str(i), spelling)
        nodes += [helper.make_node("MatMul", [n, f"w{i}"], [f"f{i}"], name=f"mm{i}"),
                  helper.make_node("Add", [h, f"f{i}"], [f"h{i + 1}"], name=f"res{i}")]
        h = f"h{i + 1}"
    y = rms(h, "_out", "reciprocal")
    graph = helper.make_graph(
        nodes, "t5", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 12])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, 12, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    samples = [Sample("s", {"ids": rng.integers(0, 50, (1, 12))})]
    maxima = stream_maxima(model, samples)
    assert max(maxima.values()) > 65504
    rewritten, report = apply_rewrites(model, [RULE], target=Precision.FP16, max_abs=maxima)
    [record] = report.applied(RULE)
    assert {"norm0", "norm1", "norm2", "norm_out"} <= set(record.nodes)
    assert record.details["max_abs_after"] <= 128  # the squares stay in FP16's range
    ref = _run(model, samples)
    assert all(np.array_equal(a, b) for a, b in zip(ref, _run(rewritten, samples)))
    assert _rel(_fp16(model, samples), ref) == 1.0  # x^2 = inf in FP16: every output 0
    assert _rel(_fp16(rewritten, samples), ref) < 2e-3


def test_a_stream_is_one_whatever_the_order_of_its_norms() -> None:
    """The norm of a Conv reading the stream comes first in node order: the stream grown from
    it meets the one grown later from the stream itself, and they are one stream, whose
    reading Conv keeps its weights (only its bias is scaled)."""
    g = _Graph()
    h = g.conv("x", "conv_in", 3, C, 2e5)
    shortcut = g.conv(h, "shortcut", C, C, 1.0)
    late = g.norm(shortcut, "norm_b")  # listed before norm_a
    early = g.norm(h, "norm_a")
    y = g.conv(g.node("Add", [early, late], "both"), "conv_out", C, 3, 1.0)
    model, samples = g.model(y), _samples(1)
    assert [n.name for n in model.graph.node][:4] == ["conv_in", "shortcut", "norm_b", "norm_a"]
    rewritten, report = apply_rewrites(model, [RULE], target=Precision.FP16,
                                       max_abs=stream_maxima(model, samples))
    [record] = report.records
    assert record.applied and {"norm_a", "norm_b"} <= set(record.nodes)
    weights = {i.name for i in rewritten.graph.initializer}
    assert "shortcut_w" in weights and "conv_in_w" not in weights
    assert all(np.array_equal(a, b) for a, b in zip(_run(model, samples),
                                                     _run(rewritten, samples)))


@settings(max_examples=12, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["GroupNormalization", "InstanceNormalization"]),
                          st.sampled_from(["conv", "layer_scale", "shortcut", "relu"])),
                min_size=1, max_size=4),
       st.integers(0, 2 ** 16))
def test_any_applied_prescale_is_bit_exact_in_fp32(blocks: list, seed: int) -> None:
    """Random streams of residual blocks (a Conv, a Conv times a constant layer scale, a Conv
    shortcut reading the stream, a Relu in the stream): where the rule applies, the FP32
    outputs are bit-identical."""
    g = _Graph(seed)
    h = g.conv("x", "conv_in", 3, C, 2e5)
    for i, (op, kind) in enumerate(blocks):
        r = g.conv(g.norm(h, f"norm{i}", op), f"conv{i}", C, C, 2e5)
        if kind == "layer_scale":
            r = g.node("Mul", [r, g.const(f"gamma{i}", g.rng.uniform(0.5, 2, (C, 1, 1)))],
                       f"scaled{i}")
        elif kind == "shortcut":
            h = g.conv(h, f"shortcut{i}", C, C, 1.0)
        elif kind == "relu":
            h = g.node("Relu", [h], f"relu{i}")
        h = g.node("Add", [h, r], f"h{i + 1}")
    model, samples = g.model(g.conv(g.norm(h, "norm_out"), "conv_out", C, 3, 1.0)), _samples(1)
    rewritten, report = apply_rewrites(model, [RULE], target=Precision.FP16,
                                       max_abs=stream_maxima(model, samples))
    assert report.applied(RULE)
    assert all(np.array_equal(a, b) for a, b in zip(_run(model, samples),
                                                     _run(rewritten, samples)))


def test_post_norm_blocks_from_a_graph_input() -> None:
    """``h = InstanceNorm(h + MatMul(h, W))`` from the graph input (a U-Net's noisy latent):
    each block's stream starts at the previous norm's output (its scale and bias scaled) and
    the first at the input (a Mul inserted); no node in FP32."""
    rng = np.random.default_rng(5)
    inits, nodes, h = [], [], "x"
    for i in range(4):
        inits += [numpy_helper.from_array(rng.normal(0, 1e4, (16, 16)).astype(np.float32),
                                          f"w{i}"),
                  numpy_helper.from_array(np.ones(8, np.float32), f"s{i}"),
                  numpy_helper.from_array(np.zeros(8, np.float32), f"b{i}")]
        nodes += [helper.make_node("MatMul", [h, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
                  helper.make_node("Add", [h, f"m{i}"], [f"a{i}"], name=f"add{i}"),
                  helper.make_node("InstanceNormalization", [f"a{i}", f"s{i}", f"b{i}"],
                                   [f"h{i}"], name=f"norm{i}")]
        h = f"h{i}"
    nodes.append(helper.make_node("Identity", [h], ["y"], name="out"))
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 8, 16]) for n in ("x", "y")]
    model = helper.make_model(helper.make_graph(nodes, "unet", io[:1], io[1:], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    samples = [Sample(f"s{i}", {"x": (80 * rng.standard_normal((1, 8, 16))).astype(np.float32)})
               for i in range(2)]
    maxima = stream_maxima(model, samples)
    assert maxima["x"] < 65504 < maxima["a0"]  # the input fits FP16; the first Add does not
    rewritten, report = apply_rewrites(model, [RULE], target=Precision.FP16, max_abs=maxima)
    records = report.applied(RULE)
    assert len(records) == 4 and records[0].new_nodes == ("x/prescale",)
    assert all(set(r.nodes) >= {f"norm{i - 1}"} for i, r in enumerate(records) if i)
    ref = _run(model, samples)
    assert all(np.array_equal(a, b) for a, b in zip(ref, _run(rewritten, samples)))
    assert np.isnan(_rel(_fp16(model, samples), ref))  # inf - inf in the first norm
    assert _rel(_fp16(rewritten, samples), ref) < 2e-3
