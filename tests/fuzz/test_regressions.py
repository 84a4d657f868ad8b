"""The graph fuzzer's findings, each shrunk to its smallest graph and kept as a named test.

Each test says which invariant of ``test_invariants.py`` the graph broke. Tests of bugs that
are still open are marked ``xfail(strict=False)`` with the reason; they pass once it is fixed
(remove the mark, and the piece from ``test_invariants.OPEN_BUGS``).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from graphs import IR_VERSION, OPSET, SHAPE, Case, Sample
from onnx import TensorProto, helper, numpy_helper
from test_invariants import check_fp32_plan, check_writer, reference, run

import precision_doctor as pd
from precision_doctor.compare.metrics import relative_l2
from precision_doctor.errors import ReferenceError_
from precision_doctor.formats import Precision
from precision_doctor.precision.plan import PrecisionPlan, candidate_nodes
from precision_doctor.precision.writer import write_mixed_precision
from precision_doctor.runners.ort import OrtRunner
from precision_doctor.runners.verify import VerifiedBy, verified_again

F = TensorProto.FLOAT


def case(nodes, initializers, output: str, domains=(), scale: float = 0.1) -> Case:
    """A one-input (``x``, float32 ``SHAPE``) one-output model and two seeded samples;
    ``domains``: opset-1 imports besides the default domain."""
    graph = helper.make_graph(
        nodes, "regression", [helper.make_tensor_value_info("x", F, SHAPE)],
        [helper.make_tensor_value_info(output, F, SHAPE)],
        [numpy_helper.from_array(np.asarray(v, d), n) for n, (v, d) in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)] + [
        helper.make_opsetid(d, 1) for d in domains], ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    rng = np.random.default_rng(0)
    return Case(model, [Sample(f"s{i}", {"x": rng.normal(0, scale, SHAPE).astype(np.float32)})
                        for i in range(2)])


def node(op, inputs, output, **attrs):
    return helper.make_node(op, inputs, [output], name=output, **attrs)


F32 = np.float32


def decomposed_layernorm() -> Case:
    """x * 1 -> ReduceMean, Sub, Pow, ReduceMean, Add eps, Sqrt, Div, Mul gamma, Add beta."""
    return case([
        node("Mul", ["x", "one"], "scaled"),
        node("ReduceMean", ["scaled"], "mean", axes=[-1]),
        node("Sub", ["scaled", "mean"], "d"),
        node("Pow", ["d", "two"], "sq"),
        node("ReduceMean", ["sq"], "var", axes=[-1]),
        node("Add", ["var", "eps"], "var_eps"),
        node("Sqrt", ["var_eps"], "sd"),
        node("Div", ["d", "sd"], "n"),
        node("Mul", ["n", "gamma"], "ng"),
        node("Add", ["ng", "beta"], "y"),
    ], {"one": (1.0, F32), "two": (2.0, F32), "eps": (1e-6, F32),
        "gamma": (np.linspace(0.9, 1.1, SHAPE[-1]), F32),
        "beta": (np.linspace(-0.1, 0.1, SHAPE[-1]), F32)}, "y")


def test_fp16_decomposed_layernorm_after_a_cast_loads_in_onnx_runtime() -> None:
    """(b) A decomposed LayerNorm written all-FP16 behind the input's Cast to FP16: ONNX
    Runtime 1.32's CPU LayerNorm fusion makes a LayerNormalization with float and float16
    inputs, and the session fails ("Type parameter (T) of Optype (LayerNormalization) bound to
    different types"). Fixed in the writer's validation and ``OrtRunner``: the model loads with
    graph optimizations off, with a warning naming the fusion."""
    c = decomposed_layernorm()
    written, report = write_mixed_precision(c.model, PrecisionPlan(Precision.FP16))
    assert report.ort_validated
    with OrtRunner(written, ("cpu",)) as runner:
        out = runner.run(c.samples[0].feeds)["y"]
    if runner.optimizer_note is not None:  # the ONNX Runtime defect is still there
        assert "LayerNormFusion" in runner.optimizer_note
        assert any("LayerNormFusion" in w for w in report.warnings)
    ref = reference(c)["y"][0]
    assert np.abs(out - ref).max() < 1e-2 * np.abs(ref).max()
    check_writer(c, PrecisionPlan(Precision.FP16))


def test_bf16_decomposed_layernorm_is_written_despite_the_fusion_defect() -> None:
    """(b) The same graph in BF16: with the fusion off, ONNX Runtime CPU still has no BF16
    kernel; the writer reported a BackendError instead of its BF16 warning."""
    c = decomposed_layernorm()
    _, report = write_mixed_precision(c.model, PrecisionPlan(Precision.BF16))
    assert any("BF16 kernel" in w for w in report.warnings)
    check_writer(c, PrecisionPlan(Precision.BF16))


def test_constant_through_data_movement_is_rounded() -> None:
    """(b) y = Where(a > 0, a, Expand(b, Shape(a))), a = x * 1 in FP16, b a [1, 1, 8] constant
    below FP16's smallest subnormal (and one value that FP16 rounds)."""
    b = np.full((1, 1, SHAPE[-1]), 1e-9, F32)
    b[0, 0, 0] = 0.1
    c = case([
        node("Mul", ["x", "one"], "a"),
        node("Shape", ["a"], "shape"),
        node("Expand", ["b", "shape"], "e"),
        node("Greater", ["a", "zero"], "positive"),
        node("Where", ["positive", "a", "e"], "y"),
    ], {"one": (1.0, F32), "zero": (0.0, F32), "b": (b, F32)}, "y")
    check_writer(c, PrecisionPlan(Precision.FP16))


def test_checks_run_on_the_regression_graphs() -> None:
    """The shared checks themselves: (a) holds on a graph without integer paths."""
    check_fp32_plan(decomposed_layernorm())
    assert run(OrtRunner(decomposed_layernorm().model, ("cpu",)), decomposed_layernorm())


def contrib_gelu() -> Case:
    """a = x * 1 (FP16), g = com.microsoft.Gelu(a) (opaque: FP32), y = g + a (FP16)."""
    return case([
        node("Mul", ["x", "one"], "a"),
        helper.make_node("Gelu", ["a"], ["g"], name="g", domain="com.microsoft"),
        node("Add", ["g", "a"], "y"),
    ], {"one": (1.0, F32)}, "y", domains=["com.microsoft"])


def test_contrib_output_into_fp16_node_is_cast() -> None:
    """(b) The writer left the output of an op without an ONNX schema (com.microsoft.Gelu:
    ONNX shape inference gives it no element type) uncast where an FP16 node read it, and ONNX
    Runtime rejected the written model ("Type parameter (T) of Optype (Add) bound to different
    types"). Fixed: ``inferred_dtypes`` types contrib outputs from ONNX Runtime's schemas."""
    c = contrib_gelu()
    written, report = write_mixed_precision(c.model, PrecisionPlan(Precision.FP16))
    assert report.ort_validated
    assert any(n.op_type == "Cast" and n.input[0] == "g" for n in written.graph.node)
    run(OrtRunner(written, ("cpu",)), c)


def test_contrib_output_is_rounded_by_the_plan_emulation() -> None:
    """(b) The same graph: the emulation of the plan rounds g where the FP16 Add reads it."""
    check_writer(contrib_gelu(), PrecisionPlan(Precision.FP16))


_TRANSPOSE_CAST_MATMUL = """
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import precision_doctor as pd
from precision_doctor.errors import ReferenceError_
from precision_doctor.formats import Precision
from precision_doctor.compare.metrics import relative_l2
from precision_doctor.precision.plan import PrecisionPlan, candidate_nodes
from precision_doctor.precision.writer import write_mixed_precision

f = TensorProto.FLOAT
w = numpy_helper.from_array(np.eye(8, dtype=np.float32), "w")
one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
graph = helper.make_graph([
    helper.make_node("Mul", ["x", "one"], ["a"], name="a"),
    helper.make_node("Transpose", ["a"], ["t"], name="t", perm=[1, 0, 2]),
    helper.make_node("MatMul", ["t", "w"], ["y"], name="y"),
], "g", [helper.make_tensor_value_info("x", f, [1, 4, 8])],
    [helper.make_tensor_value_info("y", f, [4, 1, 8])], [w, one])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
_, report = write_mixed_precision(model, PrecisionPlan(Precision.FP16).keep_fp32(["y"], "user"))
assert report.ort_validated and any("MatmulTransposeFusion" in w for w in report.warnings)
print("written")
"""


def test_fp16_batch_transpose_into_fp32_matmul_does_not_crash() -> None:
    """(b)/(d) a = x * 1 (FP16), t = Transpose(a, [1, 0, 2]), y = MatMul(t, w) kept FP32:
    the writer writes Transpose -> Cast(float) -> MatMul, and onnxruntime 1.32 CPU crashed
    (SIGSEGV) creating its session at ORT_ENABLE_ALL (its MatmulTransposeFusion), killing
    the process in the writer's validation. Fixed: sessions of such models turn that fusion
    off (``precision.writer.validate.crashing_fusions``), with a warning. Run in a subprocess,
    since a crash kills the process."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _TRANSPOSE_CAST_MATMUL], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "written" in done.stdout, (
        f"exit status {done.returncode}: {done.stderr[-300:]}")


def test_joint_cure_is_not_unexplained() -> None:
    """(c) y = (x * 1e-9) * 1e-4: x * 1e-9 flushes to 0 in FP16, and so would the second
    product of the unrounded first one; the diagnosis must name the joint cure, not call the
    error unexplained."""
    c = case([node("Mul", ["x", "tiny"], "a"), node("Mul", ["a", "small"], "y")],
             {"tiny": (1e-9, F32), "small": (1e-4, F32)}, "y")
    d = pd.diagnose(c.model, [s.feeds for s in c.samples], target="fp16", quiet=True,
                    device="cpu", noise=False)
    assert d.explained_share is not None and d.explained_share >= 0.9
    assert d.assessment is not None and d.assessment.kind != "unexplained", d.assessment.summary


def test_fix_on_a_non_finite_reference_says_so() -> None:
    """(d) y = (x * 1e30) * 1e30 is inf in FP32 already."""
    c = case([node("Mul", ["x", "big"], "a"), node("Mul", ["a", "big"], "y")],
             {"big": (1e30, F32)}, "y")
    with pytest.raises(ReferenceError_, match="'y'"):
        pd.fix(c.model, [s.feeds for s in c.samples], target="fp16", quiet=True, device="cpu")


def test_fix_checks_the_cuts_on_every_sample() -> None:
    """(d) Q -> DQ -> MatMul <- DQ(int8 weights): ONNX Runtime fuses the whole graph into
    ``MatMulIntegerToFloat``, whose x86 u8 x s8 kernel saturates pairs of products at the int16
    limit when the quantized input is large (the second sample here, not the first); the
    search's segments run the chain unfused. The cuts were checked on the first sample only,
    so the all-FP32 plan evaluated 0.14 relative L2 from the reference and ``fix`` gave up
    (found with ``benchmarks/fuzz.py --seed 11``).

    On a CPU with AVX512-VNNI the fused kernel is exact, the cuts pass their check and the
    search runs on segments; with Q and DQ in FP16 the whole written graph runs
    ``DQ(weights) -> MatMul`` as ``MatMulNBits`` (8-bit activations), the segments in float:
    the search's plan (w, y) scored 0.0217 relative L2 on the written model and ``fix`` failed
    where its own candidates dq, w, y pass. ``repair.recheck`` searches again judged by the
    verifying runner. Checked as a property, whatever kernels ONNX Runtime picks on this CPU:
    ``fix`` passes, keeps only candidates, and a runner like the verifying one agrees."""
    weights = np.tile(np.array([[120], [125], [-119], [-110]], np.int8), (2, 8))
    c = case([node("QuantizeLinear", ["x", "s", "zp"], "q"),
              node("DequantizeLinear", ["q", "s", "zp"], "dq"),
              node("DequantizeLinear", ["wq", "ws", "wzp"], "w"),
              node("MatMul", ["dq", "w"], "y")],
             {"s": (0.001, F32), "zp": (128, np.uint8), "wq": (weights, np.int8),
              "ws": (7.874016e-12, F32), "wzp": (0, np.int8)}, "y")
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.normal(0, 0.001, SHAPE).astype(F32)},  # q near 128: no saturation
             {"x": rng.uniform(0.1, 0.127, SHAPE).astype(F32)}]  # q near 255: saturation
    fixed = pd.fix(c.model, feeds, target="fp16", quiet=True, device="cpu")
    assert fixed.verdict == "pass", fixed.result.warnings
    result = fixed.result
    assert set(fixed.plan.fp32_nodes()) <= {n.name for n in candidate_nodes(result.rewritten)}
    verifier = verified_again(VerifiedBy.from_dict(result.verification), result.model)
    with OrtRunner(c.model, ("cpu",)) as ref, verifier as got:
        err = max(relative_l2([ref.run(f)["y"]], [got.run(f)["y"]]) for f in feeds)
    assert err <= 1e-2  # fix's default tolerance (relative L2 per output)


def test_a_flushed_output_cured_in_fp32_is_a_defect() -> None:
    """(c) y = x * 1e-9: the weight flushes to zero in FP16 and so does every output. The
    underflow finding is a warning by its static rule, but its measured cure removes all the
    error: a defect, not "unexplained" (found with ``benchmarks/fuzz.py --seed 13``)."""
    c = case([node("Mul", ["x", "tiny"], "y")], {"tiny": (1e-9, F32)}, "y")
    d = pd.diagnose(c.model, [s.feeds for s in c.samples], target="fp16", quiet=True,
                    device="cpu", noise=False)
    assert d.assessment is not None and d.assessment.kind == "defect", d.assessment.summary
    assert "underflow" in d.assessment.summary and d.explained_share == pytest.approx(1.0)


def test_a_bf16_quantizelinear_is_written_for_engines_that_run_it() -> None:
    """(b) A plan with only QuantizeLinear in BF16: its input is a boundary Cast to BF16 and
    its scale a converted weight, neither among the writer's storage decisions, so the
    writer did not know the model stores BF16 and raised on ONNX Runtime CPU's missing kernel
    instead of noting it (found with ``benchmarks/fuzz.py --seed 13``)."""
    c = case([node("Div", ["x", "two"], "d"), node("QuantizeLinear", ["d", "s", "zp"], "q"),
              node("DequantizeLinear", ["q", "s", "zp"], "y")],
             {"two": (2.0, F32), "s": (0.001, F32), "zp": (128, np.uint8)}, "y")
    plan = PrecisionPlan(Precision.BF16).keep_fp32(["d", "y"], "test")
    check_writer(c, plan)
    _, report = write_mixed_precision(c.model, plan)
    assert report.node_precisions["q"] == "bf16"


def test_a_data_movement_node_the_plan_names_fp32_keeps_its_constant_fp32() -> None:
    """(b) Where(d > 0, Gather(d), e), d = x / 2 in FP16, e up to 1.3e5 (inf in FP16), the
    Where named FP32 by the plan (as ``fix`` does for a parameter out of range): written in
    FP32 with e in FP32, but the effective plan did not name it, so its emulation followed the
    FP16 Gather and rounded e to inf (found with ``benchmarks/fuzz.py --seed 17``)."""
    e = np.array([[[-53566.9, 36159.5, 130400.0, 94708.1, -70373.5, -126542.1, -62327.4,
                    4132.6]]], F32)
    c = case([node("Div", ["x", "two"], "d"), node("Gather", ["d", "idx"], "g", axis=2),
              node("Greater", ["d", "zero"], "gt"), node("Where", ["gt", "g", "e"], "y")],
             {"two": (2.0, F32), "idx": ([2, 4, 3, 6, 5, 0, 1, 7], np.int64),
              "zero": (0.0, F32), "e": (e, F32)}, "y", scale=1.0)
    check_writer(c, PrecisionPlan(Precision.FP16).keep_fp32(["y"], "test"))
