"""Reading trtexec profiles and attaching times to layers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from precision_doctor.audit.layers import parse_layer_info
from precision_doctor.audit.profile import attach_profile, read_profile
from precision_doctor.errors import DataFormatError


def test_read_profile(trt84_prof: list, tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(trt84_prof))
    prof = read_profile(path)
    assert prof.count == 10 and len(prof.times) == 4
    assert prof.total_ms == pytest.approx(1.0)
    assert prof.times[1].average_ms == 0.4 and prof.times[1].share == pytest.approx(0.4)


def test_read_profile_fallbacks() -> None:
    prof = read_profile([{"count": 4}, {"name": "a", "timeMs": 4.0}, {"name": "b",
                         "averageMs": 3.0}, {"bogus": 1}, "x", {"name": "c"}])
    assert [t.average_ms for t in prof.times] == [1.0, 3.0]
    assert [round(t.share, 2) for t in prof.times] == [0.25, 0.75]
    assert len(prof.warnings) == 3
    assert read_profile([[{"count": 1}, {"name": "a", "averageMs": 1.0}]]).times[0].name == "a"


def test_read_profile_rejects_layer_info(trt84: dict) -> None:
    with pytest.raises(DataFormatError, match="layer information"):
        read_profile(trt84)
    with pytest.raises(DataFormatError, match="not a trtexec profile"):
        read_profile({"a": 1})


def test_attach_profile(trt84: dict, trt84_prof: list) -> None:
    layers, warnings = attach_profile(parse_layer_info(trt84).layers, trt84_prof)
    times = {x.name: x.time_ms for x in layers}
    assert times["Conv_0 + Relu_1"] == 0.4 and times["MysteryLayer_4"] is None
    assert warnings == ()


def test_attach_profile_duplicates_and_mismatch() -> None:
    info = parse_layer_info({"Layers": [{"Name": "a"}, {"Name": "a"}, {"Name": "b"}]})
    layers, _ = attach_profile(info.layers, [{"count": 1}, {"name": "a", "averageMs": 1.0},
                                             {"name": "a", "averageMs": 2.0}])
    assert [x.time_ms for x in layers] == [1.0, 2.0, None]
    _, warnings = attach_profile(info.layers, [{"name": "zzz", "averageMs": 1.0}])
    assert any("name no layer" in w for w in warnings)
    assert any("different build" in w for w in warnings)
