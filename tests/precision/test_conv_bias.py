"""Where the engine adds a convolution's bias (``precision.conv_bias``): one rounding of the
FP32 sum (TensorRT, the default) or the rounded convolution plus the bias rounded again (ONNX
Runtime CUDA, measured: BENCHMARKS.md), in the plan emulation and in the exact emulation of a
written model."""

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from tiny_models import make_model, tensor

from precision_doctor.formats import Precision
from precision_doctor.precision.conv_bias import FUSED, SEPARATE, split_conv_bias
from precision_doctor.precision.emulate import emulate
from precision_doctor.precision.emulate_written import emulate_written
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.precision.writer import write_mixed_precision
from precision_doctor.repair.stages import PlanOpener
from precision_doctor.runners.kernels.engines import ENGINES

LOW = {Precision.FP16: np.float16, Precision.BF16: ml_dtypes.bfloat16}
RNG = np.random.default_rng(11)
W = RNG.standard_normal((8, 4, 3, 3)).astype(np.float32)
B = (RNG.standard_normal(8) * 30).astype(np.float32)  # a large bias: the two models part
X = RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)


def conv_relu(opset):
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["y"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["y"], ["z"], name="relu")]
    return make_model(nodes, [helper.make_tensor_value_info("x", f, [1, 4, 6, 6])],
                      [helper.make_tensor_value_info("z", f, [1, 8, 6, 6])],
                      [tensor("W", W), tensor("B", B)], opset=opset)


def _run(model, x=X):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _expected(precision):
    """Both models in numpy: ``(one rounding, two roundings)`` of Relu(Conv(x) + B)."""
    low = LOW[precision]

    def r(a):
        return a.astype(low).astype(np.float32)

    f = TensorProto.FLOAT
    conv = make_model([helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1])],
                      [helper.make_tensor_value_info("x", f, [1, 4, 6, 6])],
                      [helper.make_tensor_value_info("y", f, [1, 8, 6, 6])],
                      [tensor("W", r(W))], opset=17)
    z = _run(conv, r(X))  # FP32 accumulation of the rounded operands
    b = r(B).reshape(1, -1, 1, 1)
    return np.maximum(r(z + b), 0), np.maximum(r(r(z) + b), 0)


@pytest.mark.parametrize("precision,opset", [(Precision.FP16, 11), (Precision.FP16, 17),
                                             (Precision.BF16, 17)])
def test_plan_emulation_follows_the_engine(precision, opset):
    once, twice = _expected(precision)
    assert not np.array_equal(once, twice)  # the case tells them apart
    fused = _run(emulate(conv_relu(opset), PrecisionPlan(precision), FUSED)[0])
    separate = _run(emulate(conv_relu(opset), PrecisionPlan(precision), SEPARATE)[0])
    np.testing.assert_array_equal(fused, once)
    np.testing.assert_array_equal(separate, twice)


def test_an_fp32_conv_is_not_split():
    model = conv_relu(17)
    plan = PrecisionPlan(Precision.FP16).keep_fp32(["conv", "relu"], "user")
    split, added = split_conv_bias(model, lambda n: plan.precision_of(n.name) is not
                                   Precision.FP32)
    assert added == {} and split is model
    np.testing.assert_array_equal(_run(emulate(model, plan, SEPARATE)[0]), _run(model))


def test_written_model_emulation_follows_the_engine():
    written = write_mixed_precision(conv_relu(17), PrecisionPlan(Precision.BF16))[0]
    once, twice = _expected(Precision.BF16)
    np.testing.assert_array_equal(_run(emulate_written(written)[0]), once)
    split = emulate_written(written, SEPARATE)[0]
    np.testing.assert_array_equal(_run(split), twice)
    assert any(n.name == "conv/pd_bias" for n in split.graph.node)


def test_fix_for_ort_cuda_emulates_its_conv_bias():
    assert ENGINES["ort-cuda"].conv_bias == SEPARATE
    runner = PlanOpener(conv_relu(17), conv_bias=SEPARATE)(PrecisionPlan(Precision.FP16))
    with runner:
        np.testing.assert_array_equal(runner.run({"x": X})["z"], _expected(Precision.FP16)[1])


def test_diagnose_for_ort_cuda_emulates_its_conv_bias(tmp_path):
    import precision_doctor as pd
    from precision_doctor.compare.metrics import relative_l2

    path = tmp_path / "conv.onnx"
    path.write_bytes(conv_relu(17).SerializeToString())
    data = tmp_path / "x.npy"
    np.save(data, X)
    reference = _run(conv_relu(17))
    once, twice = _expected(Precision.FP16)
    for engine, expected, name in ((None, once, "emulate-fp16"),
                                   ("ort-cuda", twice, "emulate-fp16-ort-cuda-bias")):
        d = pd.diagnose(str(path), str(data), target="fp16", engine=engine, quiet=True,
                        layerwise=False, noise=False)
        out = d.to_dict()
        assert out["candidate"] == name
        rel = out["outputs"][0]["metrics"]["rel_l2"]
        assert rel == pytest.approx(relative_l2([reference], [expected]), rel=1e-6)
