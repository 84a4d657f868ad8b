"""Fixtures: layer information in the schemas TensorRT writes (see engine_fixtures.py)."""

from __future__ import annotations

import pytest
from engine_fixtures import trt10_layers, trt84_layers, trt84_profile, trt86_layers, trt86_profile


@pytest.fixture
def trt84() -> dict:
    return trt84_layers()


@pytest.fixture
def trt84_prof() -> list:
    return trt84_profile()


@pytest.fixture
def trt86() -> dict:
    return trt86_layers()


@pytest.fixture
def trt86_noformats() -> dict:
    return trt86_layers(with_formats=False)


@pytest.fixture
def trt86_prof() -> list:
    return trt86_profile()


@pytest.fixture
def trt10() -> dict:
    return trt10_layers()


@pytest.fixture
def names_only() -> dict:
    return {"Layers": ["Reformatting CopyNode for Input Tensor 0 to Conv_0 + Relu_1",
                       "Conv_0 + Relu_1", "Softmax_3"], "Bindings": ["input.1", "out"]}
