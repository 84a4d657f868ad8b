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
    else:
        assert all(np.isfinite(y).all() for y in ref)
    if name == "magika":  # the files are what magika says they are in FP32
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
