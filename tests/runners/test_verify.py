"""Which runner verifies a written model: ONNX Runtime's BF16 kernel gaps, the fallback chain."""

import numpy as np
import onnx
import pytest
from tiny_models import conv_bn, transformer_block

from precision_doctor.errors import BackendError, BackendUnavailable
from precision_doctor.formats import Precision
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.precision.writer import write_mixed_precision
from precision_doctor.runners.fake import FakeRunner
from precision_doctor.runners.kernels.registry import (
    bf16_op_gaps,
    describe_missing,
    is_missing_kernel,
    missing_kernels,
    refuse_cpu_bf16,
)
from precision_doctor.runners.verify import VerifiedBy, verifying_runner

NEEDS_REGISTRY = pytest.mark.skipif(
    missing_kernels(conv_bn()) is None,
    reason="this onnxruntime does not expose its kernel registry (get_all_opkernel_def)")


def _written(model, precision=Precision.BF16):
    return write_mixed_precision(model, PrecisionPlan(precision), validate=False)[0]


@NEEDS_REGISTRY
def test_cpu_has_no_bf16_conv_or_matmul_kernel():
    conv = missing_kernels(_written(conv_bn(var_max=50.0)))
    assert conv is not None and conv[0].op == "Conv(22)" and conv[0].nodes == ("conv",)
    matmul = missing_kernels(_written(transformer_block(hot_value=1.0)))
    assert matmul is not None and "MatMul(13)" in [m.op for m in matmul]
    assert "LayerNormalization" not in describe_missing(matmul)  # it has a BF16 CPU kernel
    assert missing_kernels(conv_bn()) == []  # FP32: nothing reads or writes BF16
    assert bf16_op_gaps(conv_bn()) == ["Conv", "BatchNormalization", "Relu"]


def test_missing_kernel_messages():
    assert is_missing_kernel("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an "
                             "implementation for Conv(22) node with name 'conv'")
    assert not is_missing_kernel("INVALID_ARGUMENT : Unexpected input data type")


def test_bf16_model_on_cpu_is_verified_by_its_exact_emulation():
    written = _written(conv_bn(var_max=50.0))
    runner = verifying_runner(written)
    x = np.random.default_rng(0).normal(0, 1, (1, 3, 8, 8)).astype(np.float32)
    with runner:
        y = runner.run({"x": x})["y"]
    v = runner.verified_by
    assert v is not None and v.runner == "emulate-written-bf16" and v.spec == "emulate-written"
    assert "round-to-nearest-even" in v.reason
    why_not = dict(v.skipped)
    assert "no CUDA execution provider" in why_not["ort-cuda-fixed"]
    assert "Conv" in why_not["ort-cpu-fixed"]
    assert VerifiedBy.from_dict(v.to_dict()) == v
    assert "not ort-cpu" in v.describe() and y.dtype == np.float32


def test_fp16_model_is_verified_by_its_exact_emulation_where_ort_cpu_would_run_fp32():
    """ONNX Runtime CPU opens an FP16 model but runs the FP16 nodes it has no kernel for in
    FP32 and drops their rounding (measured on PP-OCRv4 cls: tests/acceptance/
    test_fp16_verification.py), so it does not verify; a requested runner is used as asked."""
    written = _written(conv_bn(var_max=50.0), Precision.FP16)
    runner = verifying_runner(written)
    if missing_kernels(written, precision=Precision.FP16) == []:
        pytest.skip("this ONNX Runtime CPU has an FP16 kernel for every node: it verifies")
    with runner:
        assert runner.name == "emulate-written-fp16"
        assert runner.run({"x": np.ones((1, 3, 8, 8), np.float32)})["y"].dtype == np.float32
    v = runner.verified_by
    assert v is not None and "FP16" in v.reason
    if missing_kernels(written, precision=Precision.FP16) is not None:
        assert "drop their FP16 rounding" in dict(v.skipped)["ort-cpu-fixed"]
    fake = FakeRunner([], ["y"], lambda feeds: {"y": feeds["x"]}, name="ort:cuda,tf32=0")
    asked = verifying_runner(written, fake)
    with asked:
        assert asked.run({"x": np.ones(2, np.float32)})["y"].shape == (2,)
    assert asked.verified_by is not None
    assert asked.verified_by.runner == "ort:cuda,tf32=0"
    assert "--runner ort:cuda,tf32=0" in asked.verified_by.reason


def test_a_requested_runner_that_fails_is_not_replaced():
    class Broken(FakeRunner):
        def __enter__(self):
            raise BackendError("ort-cuda: NOT_IMPLEMENTED: Could not find an implementation")

    runner = verifying_runner(_written(conv_bn(var_max=50.0)),
                              Broken([], ["y"], dict, name="ort:cuda"))
    with pytest.raises(BackendError, match="NOT_IMPLEMENTED"):
        runner.__enter__()


@NEEDS_REGISTRY
def test_ort_cpu_asked_to_run_bf16_is_refused_with_what_to_use():
    model = conv_bn()
    with pytest.raises(BackendUnavailable, match="compare FP32 with FP32") as exc:
        refuse_cpu_bf16("ort:cpu", model)
    assert "--runner emulate" in str(exc.value) and "ort:cuda" in str(exc.value)
    with pytest.raises(BackendUnavailable, match=r"Conv\(22\) \(1 node\)"):
        refuse_cpu_bf16("ort:cpu", model, _written(conv_bn(var_max=50.0)))
    with pytest.raises(BackendUnavailable, match="Leave --runner out"):
        refuse_cpu_bf16("ort:cpu", model, command="fix")
    refuse_cpu_bf16("ort:cuda,tf32=0", model)  # not ONNX Runtime CPU: nothing to refuse
    refuse_cpu_bf16("emulate", model)


def test_without_the_kernel_registry_the_session_error_decides(monkeypatch):
    import precision_doctor.runners.verify as verify

    monkeypatch.setattr(verify, "missing_kernels", lambda model, provider="", precision=None: None)
    runner = verifying_runner(_written(conv_bn(var_max=50.0)))
    with runner:
        assert runner.name == "emulate-written-bf16"
    assert runner.verified_by is not None
    why_not = dict(runner.verified_by.skipped)
    assert "NOT_IMPLEMENTED" in why_not["ort-cpu-fixed"]  # tried, and skipped for that reason


@NEEDS_REGISTRY
def test_diagnose_with_ort_cpu_as_the_fp16_candidate_says_what_it_measures(tmp_path):
    import precision_doctor as pd

    model = conv_bn(var_max=50.0)
    path, fp16 = tmp_path / "m.onnx", tmp_path / "m_fp16.onnx"
    onnx.save(model, str(path))
    onnx.save(_written(model, Precision.FP16), str(fp16))
    data = "random:seed=0,count=2,shape=x:1x3x8x8"
    with_model = pd.diagnose(str(path), data, runner="ort:cpu", candidate_model=str(fp16),
                             quiet=True, layerwise=False, noise=False)
    assert any("drops their FP16 rounding" in w and "Conv" in w for w in with_model.warnings)
    alone = pd.diagnose(str(path), data, runner="ort:cpu", quiet=True, layerwise=False,
                        noise=False)
    assert any("compares two FP32 runs" in w for w in alone.warnings)
    emulated = pd.diagnose(str(path), data, quiet=True, layerwise=False, noise=False)
    assert not any("FP32 runs" in w or "FP16 rounding" in w for w in emulated.warnings)
