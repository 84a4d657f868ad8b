"""Periodic functions of large arguments, and the report of a model destroyed by range, on the
tiny models of ``periodic_models`` (a diffusion UNet's timestep embedding and residual blocks)."""

from __future__ import annotations

import math

import pytest
from periodic_models import timestep_embedding, timestep_samples

import precision_doctor as pd
from precision_doctor.diagnosis.causes.mechanisms import (
    NodeFacts,
    name_mechanism,
    periodic_rule,
    phase_limit,
    spacing,
)


def test_spacing_and_the_phase_limit():
    u16, ubf16 = 2.0 ** -11, 2.0 ** -8
    assert spacing(1000.0, u16) == 0.5  # FP16 numbers in [512, 1024) are 0.5 apart
    assert spacing(127.9, u16) == 2.0 ** -4 and spacing(128.0, u16) == 2.0 ** -3
    assert phase_limit(u16) == 128.0 and phase_limit(ubf16) == 16.0
    assert periodic_rule("Sin", 127.9, u16) is None
    assert "0.125 rad" in periodic_rule("Cos", 128.0, u16)
    assert periodic_rule("Exp", 1e3, u16) is None
    assert spacing(0.0, u16) == 0.0 and spacing(math.inf, u16) == 0.0


def test_name_mechanism_reads_the_argument():
    import numpy as np

    big = NodeFacts("s", "Sin", gain=1.0, ref_inputs=[np.array([10.0, -900.0])])
    named = name_mechanism(big)
    assert named is not None and named.kind == "periodic-argument"
    assert named.evidence["argument_max_abs"] == 900.0
    small = NodeFacts("s", "Sin", gain=1.0, ref_inputs=[np.array([10.0, -90.0])])
    assert name_mechanism(small) is None


@pytest.fixture(scope="module")
def embedding():
    return pd.diagnose(timestep_embedding(), [s.feeds for s in timestep_samples()],
                       target="fp16", quiet=True, device="cpu")


def test_timestep_embedding_is_a_periodic_argument_defect(embedding):
    d = embedding
    assert d.verdict == "fail" and d.assessment.kind == "defect"
    top = d.findings[0]
    assert top.kind == "periodic-argument" and top.group == "main"
    # the cure keeps the argument FP32 through Sin and Cos: the Mul and both periodic ops
    assert set(top.nodes) == {"/time_embed/Mul", "/time_embed/Sin", "/time_embed/Cos"}
    assert top.impact is not None and top.impact > 0.9
    assert top.evidence["argument_max_abs"] == pytest.approx(1000.0)
    assert top.evidence["spacing"] == 0.5
    assert "reduce-periodic-argument" in top.remedy
    assert d.assessment.evidence["defect_kind"] == "periodic-argument"
    assert not [f for f in d.findings if f.kind == "unnamed-mechanism"]
