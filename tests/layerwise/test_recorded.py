"""Recorded engine results as the candidate: formats, runner choice, sample matching, the
layerwise table from recorded tensors, missing-tensor reasons and the emulator cross-check."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from tiny_models import conv_bn, random_samples
from typer.testing import CliRunner

from precision_doctor.cli import app
from precision_doctor.diagnosis.diagnose import diagnose
from precision_doctor.diagnosis.report import DiagnosisReport
from precision_doctor.errors import DataFormatError, InputError
from precision_doctor.formats import Precision
from precision_doctor.graph.outputs import float_activations, mark_outputs
from precision_doctor.inputs.polygraphy import encode_array
from precision_doctor.inputs.recording import load_recording, split_runner
from precision_doctor.layerwise.candidates import emulated
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners.emulator import EmulatorRunner

FP16 = Precision.FP16


def emulated_tensors(model, samples, names=None):
    """What a faithful FP16 engine gives for ``names`` (default: every tensor), per sample."""
    names = names or [s.name for s in float_activations(model)]
    with EmulatorRunner(mark_outputs(model, names), PrecisionPlan(FP16)) as runner:
        return [{n: runner.run(s.feeds)[n].astype(np.float16) for n in names} for s in samples]


def write_run_results(path, runs):
    """``runs``: [(runner name, [{tensor: array}, ...])] as Polygraphy --save-outputs JSON."""
    lst = [[name, [{"outputs": {k: {"values": encode_array(v),
                                    "polygraphy_class": "LazyNumpyArray"} for k, v in it.items()},
                    "runtime": 0.001, "runner_name": name,
                    "polygraphy_class": "IterationResult"} for it in its]]
           for name, its in runs]
    path.write_text(json.dumps({"lst": lst, "polygraphy_class": "RunResults"}))
    return path


def test_polygraphy_recording_gives_the_emulators_verdict_with_a_recorded_layerwise(tmp_path):
    model, samples = conv_bn(), random_samples((1, 3, 8, 8))
    runner = "trt-runner-N0-01/02/25-10:11:12"
    path = write_run_results(tmp_path / "out.json", [(runner, emulated_tensors(model, samples))])
    report = diagnose(model, samples, FP16, None, candidate_results=str(path), noise=False)
    live = diagnose(model, samples, FP16, emulated(PrecisionPlan(FP16)), noise=False)
    assert report.verdict == live.verdict == "fail"
    assert report.findings[0].node == live.findings[0].node == "bn"
    assert [r.tensor for r in report.layerwise.records] == ["c", "bn", "y"]
    rec = report.recording
    assert rec["runner"] == "trt-runner-N0-01/02/25-10:11:12" and rec["engine"] == "TensorRT"
    assert "The candidate is a recording" in rec["statement"] and rec["missing"] == {}
    cc = rec["cross_check"]
    assert cc["emulator"] == "emulate-fp16" and cc["worse_than_emulated"] == []
    (out,) = cc["outputs"]
    assert out["name"] == "y" and out["recorded_rel_l2"] == pytest.approx(
        out["emulated_rel_l2"], rel=1e-3)
    again = DiagnosisReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again.recording == json.loads(json.dumps(rec))


def test_missing_tensors_are_named_not_marked_fused_or_renamed(tmp_path):
    model, samples = conv_bn(), random_samples((1, 3, 8, 8))
    full = emulated_tensors(model, samples)
    outputs_only = write_run_results(tmp_path / "o.json",
                                     [("trt-runner", [{"y": it["y"]} for it in full])])
    report = diagnose(model, samples, FP16, None, candidate_results=outputs_only, noise=False)
    assert set(report.recording["missing"]) == {"c", "bn"}
    assert report.recording["missing"]["c"].startswith("not marked")
    renamed = write_run_results(tmp_path / "r.json", [("trt-runner", [
        {"y": it["y"], "c": it["c"], "bn_reformatted_fp16": it["bn"]} for it in full])])
    report = diagnose(model, samples, FP16, None, candidate_results=renamed, noise=False)
    assert report.recording["missing"] == {
        "bn": "renamed (recorded as 'bn_reformatted_fp16')"}
    assert report.recording["unmatched"] == ["bn_reformatted_fp16"]
    fused = write_run_results(tmp_path / "f.json", [("trt-runner", [
        {"y": it["y"], "c": it["c"]} for it in full])])
    report = diagnose(model, samples, FP16, None, candidate_results=fused, noise=False)
    assert report.recording["missing"]["bn"].startswith("fused away")
    assert report.recording["missing_by_reason"] == {"fused away": 1}


def test_a_degraded_engine_shows_up_against_the_emulation(tmp_path):
    model, samples = conv_bn(var_max=4.0), random_samples((1, 3, 8, 8))
    full = emulated_tensors(model, samples)
    rng = np.random.default_rng(0)
    for it in full:  # the "engine" ran BatchNorm in something far coarser than FP16
        it["bn"] = (it["bn"] * (1 + 0.05 * rng.standard_normal(it["bn"].shape))).astype(
            np.float16)
    path = write_run_results(tmp_path / "o.json", [("trt-runner", full)])
    report = diagnose(model, samples, FP16, None, candidate_results=path, noise=False)
    assert report.recording["cross_check"]["worse_than_emulated"][0] == "bn"


def test_runner_choice_by_name_or_prefix_and_clear_errors(tmp_path):
    model, samples = conv_bn(), random_samples((1, 3, 8, 8))
    its = emulated_tensors(model, samples, ["y"])
    path = write_run_results(tmp_path / "two.json", [("onnxrt-runner-N0-a", its),
                                                     ("trt-runner-N0-12/01/25-08:00:01", its)])
    with pytest.raises(DataFormatError, match="holds 2 runners.*two.json:trt-runner"):
        load_recording(path)
    assert load_recording(f"{path}:trt-runner").runner == "trt-runner-N0-12/01/25-08:00:01"
    exact = load_recording(f"{path}:trt-runner-N0-12/01/25-08:00:01")
    assert exact.notes == ("runner 'trt-runner-N0-12/01/25-08:00:01' chosen of 2",)
    assert split_runner(f"{path}:a:b/c") == (str(path), "a:b/c")
    with pytest.raises(DataFormatError, match="matches no runner"):
        load_recording(f"{path}:tensorrt")


def test_trtexec_export_output_and_npz_per_sample(tmp_path):
    model, samples = conv_bn(), random_samples((1, 3, 8, 8))
    its = emulated_tensors(model, samples, ["y"])
    (tmp_path / "trt").mkdir()
    (tmp_path / "npz").mkdir()
    for s, it in zip(samples, its):
        y = it["y"].astype(np.float32)
        (tmp_path / "trt" / f"{s.name}.json").write_text(json.dumps(
            [{"name": "y", "dimensions": "x".join(map(str, y.shape)),
              "values": y.ravel().tolist()}]))
        np.savez(tmp_path / "npz" / f"{s.name}.npz", y=it["y"])
    for folder in ("trt", "npz"):
        rec = load_recording(tmp_path / folder)
        assert rec.iteration_names == ("s0." + ("json" if folder == "trt" else "npz"),
                                       "s1." + ("json" if folder == "trt" else "npz"))
        report = diagnose(model, samples, FP16, None, candidate_results=rec, noise=False)
        assert report.verdict == "fail" and report.recording["format"] == (
            "trtexec" if folder == "trt" else "npz")
        assert report.recording["missing"]["bn"].startswith("not marked")
    reversed_samples = samples[::-1]  # matched by file name, not by order
    report = diagnose(model, reversed_samples, FP16, None, candidate_results=tmp_path / "npz",
                      noise=False, layerwise=False)
    assert "matched to samples by file name" in " ".join(report.recording["notes"])


def test_recordings_that_do_not_fit_the_samples_are_refused(tmp_path):
    model, samples = conv_bn(), random_samples((1, 3, 8, 8), count=3)
    its = emulated_tensors(model, samples[:2], ["y"])
    short = write_run_results(tmp_path / "short.json", [("trt-runner", its)])
    with pytest.raises(InputError, match="holds 2 iteration.*3 sample"):
        diagnose(model, samples, FP16, None, candidate_results=short, noise=False)
    wrong = write_run_results(tmp_path / "wrong.json", [("trt-runner", [{"z": it["y"]}
                                                                       for it in its])])
    with pytest.raises(InputError, match="recorded no output 'y'"):
        diagnose(model, samples[:2], FP16, None, candidate_results=wrong, noise=False)
    shapes = write_run_results(tmp_path / "shape.json", [("trt-runner", [
        {"y": it["y"][:, :2]} for it in its])])
    with pytest.raises(InputError, match="not made on these inputs"):
        diagnose(model, samples[:2], FP16, None, candidate_results=shapes, noise=False)
    extra = diagnose(model, samples[:1], FP16, None, candidate_results=short, noise=False,
                     layerwise=False)
    assert extra.recording["notes"] == ["used the first 1 of 2 recorded iterations"]


def test_cli_candidate_results_writes_the_recording_section(tmp_path):
    model, samples = conv_bn(), random_samples((1, 3, 8, 8))
    onnx.save(model, str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "in.npz", x=samples[0].feeds["x"])
    its = emulated_tensors(model, samples[:1])
    rec = write_run_results(tmp_path / "out.json", [("trt-runner-N0", its)])
    res = CliRunner().invoke(app, [
        "diagnose", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "in.npz"),
        "--candidate-results", str(rec), "--json", str(tmp_path / "r.json"),
        "--html", str(tmp_path / "r.html"), "--no-noise"])
    assert res.exit_code == 1, res.output
    assert "candidate is a recording" in " ".join(res.output.split())
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["candidate"] == "recorded trt-runner-N0" and data["recording"]["iterations"] == 1
    assert 'id="recording"' in (tmp_path / "r.html").read_text()


def test_polygraphys_own_writer_is_read_back(tmp_path):
    pytest.importorskip("polygraphy")
    from polygraphy.comparator import IterationResult, RunResults

    model, samples = conv_bn(), random_samples((1, 3, 8, 8))
    its = emulated_tensors(model, samples, ["y"])
    results = RunResults()
    results.append(("trt-runner-N0", [IterationResult(it, runner_name="trt-runner-N0")
                                      for it in its]))
    results.save(str(tmp_path / "out.json"))
    rec = load_recording(tmp_path / "out.json")
    assert rec.runner == "trt-runner-N0" and len(rec.iterations) == 2
    np.testing.assert_array_equal(rec.iterations[1]["y"], its[1]["y"])


@pytest.mark.shared
def test_real_polygraphy_trt_output_loads_as_a_recording(shared_dir):
    path = (shared_dir / "data" / "polygraphy" / "NVIDIA_trt-samples-for-hackathon-cn" /
            "RunExample_2023_trt861" / "output.json")
    rec = load_recording(path)
    assert rec.runner.startswith("trt-runner-N0-08/24/23") and rec.engine == "TensorRT"
    info = rec.describe()
    assert info["tensors"] == {"A-V-12-Add": {"dtype": "float32", "shape": [4, 10]},
                               "A-V-14-ArgMax": {"dtype": "int32", "shape": [4]}}
    older = load_recording(path.parents[1] / "inspectExample_2022" / "model-output.log")
    assert older.runner == "trt-runner-N0-08/17/22-06:39:35"  # a .log name: sniffed as JSON
    assert older.describe()["tensors"] == {"tensor-15": {"dtype": "int32", "shape": [4]}}


def test_trtexec_load_inputs_binaries_are_samples_matched_to_export_output(tmp_path):
    from tiny_models import transformer_block

    from precision_doctor.graph.load import input_metadata
    from precision_doctor.inputs import load_samples

    model, samples = conv_bn(), random_samples((1, 3, 8, 8))
    its = emulated_tensors(model, samples, ["y"])
    specs = []
    for i, (s, it) in enumerate(zip(samples, its)):
        (tmp_path / f"in{i}.bin").write_bytes(s.feeds["x"].tobytes())  # what trtexec reads
        y = it["y"].astype(np.float32)
        (tmp_path / f"in{i}.json").write_text(json.dumps(  # trtexec --exportOutput
            [{"name": "y", "dimensions": "1x4x8x8", "values": y.ravel().tolist()}]))
        specs.append(f"x:{tmp_path / f'in{i}.bin'}")
    loaded = load_samples("trtexec:" + ";".join(specs[::-1]), input_metadata(model))
    assert [s.name for s in loaded] == ["in1.bin", "in0.bin"]
    np.testing.assert_array_equal(loaded[1].feeds["x"], samples[0].feeds["x"])
    report = diagnose(model, loaded, FP16, None, noise=False, layerwise=False,
                      candidate_results=tmp_path / "*.json")
    assert report.recording["notes"] == ["iterations matched to samples by file name"]
    (out,) = report.recording["cross_check"]["outputs"]  # right pairs: recorded == emulated
    assert out["recorded_rel_l2"] == pytest.approx(out["emulated_rel_l2"], rel=1e-3)
    dynamic = transformer_block()  # x: [batch, 8, 16]: batch solved from the file size
    (tmp_path / "t.bin").write_bytes(np.zeros((3, 8, 16), np.float32).tobytes())
    (got,) = load_samples(f"trtexec:x:{tmp_path / 't.bin'}", input_metadata(dynamic))
    assert got.feeds["x"].shape == (3, 8, 16)
    with pytest.raises(DataFormatError, match="needs 768"):
        load_samples(f"trtexec:x:{tmp_path / 't.bin'};shapes=x:1x3x8x8",
                     input_metadata(model))


def test_candidate_log_gives_version_gpu_and_tf32_to_the_recording(tmp_path):
    model, samples = conv_bn(), random_samples((1, 3, 8, 8), count=1)
    onnx.save(model, str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "in.npz", x=samples[0].feeds["x"])
    rec = write_run_results(tmp_path / "out.json",
                            [("trt-runner-N0", emulated_tensors(model, samples, ["y"]))])
    (tmp_path / "build.log").write_text(
        "&&&& RUNNING TensorRT.trtexec [TensorRT v100300] # trtexec --onnx=m.onnx --fp16\n"
        "[I] Selected Device: NVIDIA H200\n"
        "[W] [TRT] Detected layernorm nodes in FP16: conv\n")
    res = CliRunner().invoke(app, [
        "diagnose", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "in.npz"),
        "--candidate-results", str(rec), "--candidate-log", str(tmp_path / "build.log"),
        "--json", str(tmp_path / "r.json"), "--no-noise", "--no-layerwise"])
    assert res.exit_code == 1, res.output
    recording = json.loads((tmp_path / "r.json").read_text())["recording"]
    assert recording["tensorrt_version"] == "10.3.0" and recording["engine"] == "TensorRT"
    assert recording["settings"]["gpu"] == "NVIDIA H200"
    assert recording["settings"]["tf32"] is True  # trtexec without --noTF32
    assert "GPU NVIDIA H200, FP16 on, TF32 on" in recording["statement"]
    assert recording["settings"]["flagged"] == [
        "line 3: Detected layernorm nodes in FP16: conv"]
    res = CliRunner().invoke(app, ["diagnose", str(tmp_path / "m.onnx"), "--data",
                                   str(tmp_path / "in.npz"), "--candidate-results", str(rec),
                                   "--runner", "ort:cpu"])
    assert res.exit_code == 2 and "drop --runner" in res.output
