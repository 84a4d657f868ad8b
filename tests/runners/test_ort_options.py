"""Parsing of ``--runner ort:...`` specs into ONNX Runtime providers and options."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import helper

from precision_doctor.errors import BackendError
from precision_doctor.runners.ort import OrtRunner
from precision_doctor.runners.ort_options import (
    CUDA_OPTIONS,
    TENSORRT_OPTIONS,
    OrtSpec,
    ort_providers,
    parse_ort_spec,
    valid_options,
)


def test_cpu_has_no_fallback_and_no_options():
    assert ort_providers("ort:cpu") == (["CPUExecutionProvider"], [{}])


def test_cuda_tf32_short_name_maps_to_use_tf32_and_cpu_is_appended():
    providers, options = ort_providers("ort:cuda,tf32=0")
    assert providers == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert options == [{"use_tf32": "0"}, {}]


def test_cuda_full_names_enums_and_ints():
    spec = parse_ort_spec("ort:CUDA, device=1, conv_algo_search=heuristic, mem_limit=2_000_000,"
                          " cuda_graph=true")
    assert dict(spec.options) == {"device_id": "1", "cudnn_conv_algo_search": "HEURISTIC",
                                  "gpu_mem_limit": "2000000", "enable_cuda_graph": "1"}


def test_tensorrt_booleans_become_true_false_and_cuda_sits_between():
    providers, options = ort_providers(
        "ort:tensorrt,fp16=1,layer_norm_fp32_fallback=1,device=0,max_workspace_size=0x40000000")
    assert providers == ["TensorrtExecutionProvider", "CUDAExecutionProvider",
                         "CPUExecutionProvider"]
    assert options[0] == {"trt_fp16_enable": "True", "trt_layer_norm_fp32_fallback": "True",
                          "device_id": "0", "trt_max_workspace_size": "1073741824"}
    assert options[1:] == [{"device_id": "0"}, {}]


def test_tensorrt_aliases_bare_flag_and_full_names():
    spec = parse_ort_spec("trt,bf16,engine_cache=0,trt_detailed_build_log=yes,"
                          "engine_cache_path=/tmp/cache")
    assert dict(spec.options) == {"trt_bf16_enable": "True", "trt_engine_cache_enable": "False",
                                  "trt_detailed_build_log": "True",
                                  "trt_engine_cache_path": "/tmp/cache"}


def test_unknown_option_lists_the_valid_ones():
    with pytest.raises(BackendError) as info:
        parse_ort_spec("ort:cuda,fp16=1")
    message = str(info.value)
    assert "'fp16'" in message and "use_tf32" in message and "cudnn_conv_algo_search" in message
    assert info.value.context["option"] == "fp16"


def test_cpu_rejects_options():
    with pytest.raises(BackendError, match="valid options: \\(none\\)"):
        parse_ort_spec("ort:cpu,tf32=0")


@pytest.mark.parametrize("spec, match", [
    ("ort:cuda,tf32=maybe", "boolean"),
    ("ort:cuda,device=first", "integer"),
    ("ort:cuda,conv_algo_search=fast", "EXHAUSTIVE, HEURISTIC, DEFAULT"),
    ("ort:cuda,tf32=0,use_tf32=1", "twice"),
    ("trt:fp16", "must start with 'ort:'"),
    ("ort:", "names no execution provider"),
])
def test_bad_specs_raise_clear_errors(spec, match):
    with pytest.raises(BackendError, match=match):
        parse_ort_spec(spec)


def test_unknown_provider_passes_options_through():
    spec = parse_ort_spec("ort:openvino,device_type=GPU")
    assert spec.providers() == ["OpenVINOExecutionProvider", "CPUExecutionProvider"]
    assert spec.provider_options() == [{"device_type": "GPU"}, {}]


def test_label_and_json_round_trip():
    spec = parse_ort_spec("ort:cuda,tf32=0")
    assert spec.label == "ort-cuda-use_tf32=0"
    again = OrtSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec


def test_valid_options_and_tables_hold_the_documented_names():
    assert valid_options("cuda") == sorted(CUDA_OPTIONS)
    assert valid_options("cpu") == []
    for name in ("trt_fp16_enable", "trt_bf16_enable", "trt_layer_norm_fp32_fallback",
                 "trt_engine_cache_enable", "trt_detailed_build_log", "trt_max_workspace_size"):
        assert name in TENSORRT_OPTIONS
    for name in ("use_tf32", "device_id", "cudnn_conv_algo_search"):
        assert name in CUDA_OPTIONS


def test_cpu_spec_builds_a_working_ort_session():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    providers, options = ort_providers("ort:cpu")
    with OrtRunner(model, providers=providers, provider_options=options) as runner:
        out = runner.run({"x": np.array([-1.0, 2.0], dtype=np.float32)})
    assert out["y"].tolist() == [0.0, 2.0]
