"""``diagnose`` as named stages (``diagnosis.stages``): each stage's frozen result, and the chain
equal to ``diagnosis.diagnose.diagnose``."""

from __future__ import annotations

import dataclasses

import pytest
from tiny_models import random_samples, transformer_block

from precision_doctor.diagnosis import stages
from precision_doctor.diagnosis.diagnose import diagnose
from precision_doctor.formats import Precision
from precision_doctor.layerwise.candidates import emulated
from precision_doctor.precision.plan import PrecisionPlan


def _request():
    model = transformer_block(hot_value=1000.0, opset=13)
    return stages.DiagnoseRequest(model, random_samples((1, 8, 16)), Precision.FP16,
                                  emulated(PrecisionPlan(Precision.FP16)))


def test_each_stage_returns_a_frozen_result_and_the_chain_is_diagnose():
    request = _request()
    reference = stages.run_reference(request)
    candidate = stages.run_candidate(request, reference)
    compared = stages.compare(request, reference, candidate)
    read = stages.read_decisions(request, reference, candidate, compared)
    localized = stages.localize(request, read)
    causes = stages.find_causes(request, reference, candidate, compared, read, localized)
    assessed = stages.assess_stage(request, reference, compared, read, causes)
    report = stages.build_report(request, reference, candidate, compared, read, localized,
                                 causes, assessed)
    for result in (request, reference, candidate, compared, read, localized, causes, assessed):
        assert dataclasses.is_dataclass(result)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(result, dataclasses.fields(result)[0].name, None)
    assert compared.verdict == "fail" and localized.layerwise is not None
    assert causes.explanation.findings[0].kind == "activation-overflow"
    assert list(report.timings_s)[:4] == ["reference", "candidate", "noise_floor", "layerwise"]
    direct = diagnose(request.model, request.samples, request.target, request.candidate)
    mine, theirs = report.to_dict(), direct.to_dict()
    for d in (mine, theirs):
        d.pop("timings_s")
    assert mine == theirs


def test_without_layerwise_the_localize_stage_is_skipped():
    request = dataclasses.replace(_request(), layerwise=False)
    reference = stages.run_reference(request)
    candidate = stages.run_candidate(request, reference)
    compared = stages.compare(request, reference, candidate)
    read = stages.read_decisions(request, reference, candidate, compared)
    assert stages.localize(request, read) == stages.Localized(None, None, None)
