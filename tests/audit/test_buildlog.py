"""Build logs (trtexec / Polygraphy --verbose): settings, LayerNorm warnings, weights, Myelin
regions, per-layer precisions, tied to ONNX nodes and to the layer-information audit.

The log fixtures are built here from the messages quoted in the field reports and NVIDIA issues
(TensorRT 10 trtexec: NVIDIA/TensorRT#4493, #3162; LayerNorm warnings with the node list on the
next verbose line: #3748; TensorRT 7/8 "Engine Layer Information" lines: #1262)."""

from __future__ import annotations

import json

import onnx
import pytest
from tiny_models import transformer_block
from typer.testing import CliRunner

from precision_doctor.audit import audit_engine
from precision_doctor.audit.buildlog import (
    BuildLog,
    is_build_log,
    link_to_audit,
    read_build_log,
)
from precision_doctor.cli import app
from precision_doctor.errors import DataFormatError

T = "[06/18/2025-03:48:34]"
TRT10_LOG = f"""\
&&&& RUNNING TensorRT.trtexec [TensorRT v101000] # trtexec --onnx=model.onnx --fp16 --layerPrecisions=ln/pow:fp32 --precisionConstraints=prefer --verbose
{T} [I] === Build Options ===
{T} [I] Precision: FP32+FP16
{T} [I] LayerPrecisions: ln/pow:fp32
{T} [I] === Device Information ===
{T} [I] Selected Device: NVIDIA GeForce RTX 4090
{T} [I] Compute Capability: 8.9
{T} [I] TensorRT version: 10.10.0
{T} [W] [TRT] Detected layernorm nodes in FP16.
{T} [V] [TRT] ln/mean, ln/sub, ln/pow, ln/var, ln/add_eps, ln/sqrt, ln/div
{T} [W] [TRT] Running layernorm after self-attention in FP16 may cause overflow. Exporting the model to the latest available ONNX opset (later than opset 17) to use the INormalizationLayer, or forcing layernorm layers to run in FP32 precision can help with preserving accuracy.
{T} [W] [TRT] TensorRT encountered issues when converting weights between types and that could affect accuracy.
{T} [W] [TRT] - 1 weights are affected by this issue: Detected finite FP32 values which would overflow in FP16 and converted them to the closest finite FP16 value.
{T} [V] [TRT] List of affected weights: b1
{T} [V] [TRT] [GpuLayer] MYELIN: {{ForeignNode[fc1/matmul...softmax]}}
{T} [V] [TRT] Engine Layer Information:
Layer(CaskGemm): fc2/matmul, Tactic: 0x000000000000001f, ln_out[Half(1,8,16)] -> logits[Half(1,8,16)]
Layer(Reformat): softmax output reformatter 0, Tactic: 0x0, probs_half (Half[1,8,16]) -> probs (Float[1,8,16])
"""  # noqa: E501 - real log lines are long


def _write(tmp_path, text, name="build.log"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_trtexec_log_settings_warnings_and_layers_tied_to_onnx_nodes(tmp_path):
    log = read_build_log(_write(tmp_path, TRT10_LOG), transformer_block())
    assert (log.tool, log.tensorrt_version, log.gpu, log.compute_capability) == (
        "trtexec", "10.10.0", "NVIDIA GeForce RTX 4090", "8.9")
    assert log.flags == ("FP32", "FP16") and log.fp16 is True and log.int8 is False
    assert log.tf32 is True and "noTF32" in log.tf32_evidence  # trtexec default: TF32 on
    assert log.strongly_typed is False
    kinds = {e.kind: e for e in log.entries}
    ln = kinds["layernorm-fp16"]
    assert ln.names[:3] == ("ln/mean", "ln/sub", "ln/pow") and ln.precision == "fp16"
    assert ln.nodes == ("ln/mean", "ln/sub", "ln/pow", "ln/var", "ln/add_eps", "ln/sqrt",
                        "ln/div")
    assert "layernorm-overflow" in kinds and kinds["weights-list"].nodes == ("fc1/add",)
    assert kinds["precision-request"].names == ("ln/pow",)
    region = kinds["myelin-region"]
    assert region.names == ("fc1/matmul", "softmax") and region.nodes[0] == "fc1/matmul"
    assert len(region.nodes) == 13  # the whole block lies between the region's endpoints
    assert log.layer_precisions == {"fc2/matmul": "fp16", "softmax output reformatter 0": "fp32"}
    assert {e.kind for e in log.flagged()} == {"layernorm-fp16", "layernorm-overflow",
                                               "weights-fp16"}
    again = BuildLog.from_dict(json.loads(json.dumps(log.to_dict())))
    assert again == log


def test_polygraphy_log_flags_tf32_default_and_strongly_typed(tmp_path):
    text = ("[I] RUNNING | Command: /usr/bin/polygraphy run m.onnx --trt --fp16 "
            "--strongly-typed --verbose\n"
            "[V] Loaded Module: tensorrt | Version: 10.3.0 | Path: ['/x']\n"
            "[I] Building engine with configuration:\n"
            "    Flags                  | [FP16]\n"
            "[W] The following layers were not found in the network: {'LayerNormalization_*'}.\n")
    log = read_build_log(_write(tmp_path, text))
    assert (log.tool, log.tensorrt_version, log.fp16, log.tf32, log.strongly_typed) == (
        "polygraphy", "10.3.0", True, False, True)
    (miss,) = [e for e in log.entries if e.kind == "precision-unmatched"]
    assert miss.names == ("LayerNormalization_*",) and miss.severity == "W"


def test_version_from_the_trtexec_banner_and_older_inline_layernorm_list(tmp_path):
    text = ("&&&& RUNNING TensorRT.trtexec [TensorRT v8601] # trtexec --onnx=m.onnx --noTF32\n"
            "[W] [TRT] Detected layernorm nodes in FP16: /enc/norm/Sub, /enc/norm/Pow\n")
    log = read_build_log(_write(tmp_path, text))
    assert log.tensorrt_version == "8.6.1" and log.tf32 is False
    assert log.entries[0].names == ("/enc/norm/Sub", "/enc/norm/Pow")


def test_not_a_log_is_refused_and_json_is_not_taken_for_a_log(tmp_path):
    with pytest.raises(DataFormatError, match="no TensorRT/Polygraphy log line"):
        read_build_log(_write(tmp_path, "hello\nworld\n", "notes.txt"))
    assert not is_build_log(_write(tmp_path, '[{"Name": "x"}]', "l.json"))
    assert is_build_log(_write(tmp_path, "[I] RUNNING | Command: polygraphy run", "a.log"))


def test_log_warning_linked_to_the_engine_layer_that_ran_the_nodes(tmp_path):
    model = transformer_block()
    fmt = "Row major linear FP16 format"
    info = {"Layers": [{"Name": "ln/sub + ln/pow + ln/var", "LayerType": "PointWiseV2",
                        "Inputs": [{"Name": "h", "Format/Datatype": fmt}],
                        "Outputs": [{"Name": "var", "Format/Datatype": fmt}]}]}
    report = audit_engine(info, onnx_model=model)
    log = read_build_log(_write(tmp_path, TRT10_LOG), model)
    rows = link_to_audit(log, report)
    pow_row = next(r for r in rows if r["node"] == "ln/pow" and r["kind"] == "layernorm-fp16")
    assert pow_row["layer"] == "ln/sub + ln/pow + ln/var" and pow_row["precision"] == "fp16"


def test_cli_audit_reads_a_log_and_a_log_beside_layer_info(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(transformer_block(), str(model))
    log = _write(tmp_path, TRT10_LOG)
    res = CliRunner().invoke(app, ["audit", str(log), "--onnx", str(model), "--json",
                                   str(tmp_path / "a.json")])
    assert res.exit_code == 1, res.output  # LayerNorm in FP16 is flagged
    assert "TensorRT 10.10.0" in res.output and "layernorm-fp16" in res.output
    data = json.loads((tmp_path / "a.json").read_text())
    assert data["build_log"]["fp16"] is True
    info = tmp_path / "layers.json"
    info.write_text(json.dumps({"Layers": [{"Name": "ln/pow", "LayerType": "PointWiseV2",
                                            "Inputs": [], "Outputs": [
                                                {"Name": "d2", "Format/Datatype": "Half"}]}]}))
    res = CliRunner().invoke(app, ["audit", str(info), "--log", str(log), "--onnx", str(model)])
    assert "node ln/pow ran in layer ln/pow as fp16" in " ".join(res.output.split())


@pytest.mark.shared
def test_real_trt861_polygraphy_log(shared_dir):
    path = (shared_dir / "data" / "polygraphy" / "NVIDIA_trt-samples-for-hackathon-cn" /
            "RunExample_2023_trt861" / "result-02.log")
    log = read_build_log(path)
    assert (log.tool, log.tensorrt_version) == ("polygraphy", "8.6.1")
    assert log.flags == ("FP16", "DISABLE_TIMING_CACHE") and log.fp16 is True
    assert log.tf32 is False  # Polygraphy's default, no --tf32 on its command line
    kinds = [e.kind for e in log.entries]
    assert "weights-fp16" in kinds  # "3 weights are affected ...: Detected subnormal FP16"
    io = {e.names[0]: e.precision for e in log.entries if e.kind == "io-dtype"}
    assert io == {"tensorX": "fp32", "A-V-12-Add": "fp32", "A-V-14-ArgMax": "int32"}
