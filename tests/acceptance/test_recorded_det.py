"""Acceptance: a recording made by Polygraphy (the tool TensorRT users run) on the
naive FP16 PP-OCRv4 detector gives the live emulator's verdict and top finding, and a
layerwise table from the recorded tensors (needs ../shared and Polygraphy).

Polygraphy runs the model written by onnxconverter-common's ``convert_float_to_float16(model,
keep_io_types=True)`` on ONNX Runtime CPU, exactly as on a TensorRT machine with ``--trt``:
``--load-inputs`` our feeds, ``--save-inputs``, ``--onnx-outputs mark all --save-outputs``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from precision_doctor.diagnosis.diagnose import diagnose
from precision_doctor.formats import Precision
from precision_doctor.graph import input_metadata, load_model
from precision_doctor.inputs import load_samples
from precision_doctor.inputs.polygraphy import save_polygraphy_inputs
from precision_doctor.layerwise.candidates import emulated
from precision_doctor.precision.plan import PrecisionPlan

pytestmark = pytest.mark.shared
FP16 = Precision.FP16


def polygraphy_cli() -> str:
    pytest.importorskip("polygraphy")
    found = shutil.which("polygraphy") or str(Path(sys.executable).with_name("polygraphy"))
    if not Path(found).is_file():
        pytest.skip("the polygraphy command is not installed")
    return found


@pytest.mark.filterwarnings("ignore:the float32 number:UserWarning")  # the converter's clamping
def test_polygraphy_recording_of_naive_fp16_det_matches_the_live_emulator(shared_dir, tmp_path):
    cli = polygraphy_cli()
    float16 = pytest.importorskip("onnxconverter_common.float16")
    det = shared_dir / "models/ppocrv4/det.onnx"
    model = load_model(det)
    feeds = load_samples(shared_dir / "data/ocr/full_images", input_metadata(model),
                         "ppocr-det:resize=max-side,side=160", max_samples=2)
    save_polygraphy_inputs(feeds, tmp_path / "feeds.json")
    naive = float16.convert_float_to_float16(onnx.load(str(det)), keep_io_types=True)
    onnx.save(naive, str(tmp_path / "det_fp16.onnx"))
    subprocess.run([cli, "run", str(tmp_path / "det_fp16.onnx"), "--onnxrt",
                    "--load-inputs", str(tmp_path / "feeds.json"),
                    "--save-inputs", str(tmp_path / "inputs.json"),
                    "--onnx-outputs", "mark", "all",
                    "--save-outputs", str(tmp_path / "outputs.json")],
                   check=True, capture_output=True, timeout=300)

    samples = load_samples(tmp_path / "inputs.json", input_metadata(model))  # Polygraphy's file
    recorded = diagnose(model, samples, FP16, None, noise=False,
                        candidate_results=tmp_path / "outputs.json")
    live = diagnose(model, samples, FP16, emulated(PrecisionPlan(FP16)), noise=False)

    assert recorded.verdict == live.verdict == "fail"
    top, live_top = recorded.findings[0], live.findings[0]
    assert (top.kind, top.node) == (live_top.kind, live_top.node)
    assert top.op_type == "BatchNormalization" and top.evidence["max_abs"] > 9e7
    lw = recorded.layerwise
    assert len(lw.records) > 300  # every activation of the model, from the recorded tensors
    assert lw.record("batch_norm_0.tmp_3").rel_l2 > 0.5
    rec = recorded.recording
    assert rec["runner"].startswith("onnxrt-runner") and rec["iterations"] == 2
    assert rec["matched_tensors"] == len(lw.records)
    assert "x_cast_to_p2o.Conv.0" in rec["unmatched"]  # the converter's Cast tensors
    # the converter clamps the BatchNorm variance to 1e4: worse than faithful FP16 there
    assert "batch_norm_0.tmp_3" in rec["cross_check"]["worse_than_emulated"]
