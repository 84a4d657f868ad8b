"""Dynamically quantized real encoders for the tests (``quantize_dynamic`` of ONNX Runtime).

What an ONNX Runtime user writes to shrink a transformer: ``MatMulInteger`` fed by
``DynamicQuantizeLinear``, the int32 accumulator Cast to float and multiplied by the scales.
The quantization itself is ``benchmarks/quantize_zoo.py``'s (:func:`quantize`); provenance in
``benchmarks/MODELS.md``.

* :func:`quantized_rec`: PP-OCRv4 rec from the ``rapidocr_onnxruntime`` wheel
  (a test dependency; else ``../shared``), its 13 MatMuls quantized (9 with weights become
  ``MatMulInteger``; QInt8, per tensor), written into a tmp dir, with 3 real crops of
  ``shared/data/ocr/rec_crops/paddleocr`` (``ppocr-rec`` preprocessing). CI builds it.
* :func:`quantized_minilm`: all-MiniLM-L6-v2 (opset 17) with the default
  ``quantize_dynamic`` settings, from ``.models/quantized/minilm17.onnx`` or quantized here from
  ``.models/minilm_op17.onnx`` (``benchmarks/export_minilm.py``), with the first batch of the
  export's sentences (8 x 128 tokens). Skips when ``.models`` has neither (CI).
* :func:`quantized_whisper`: the Whisper tiny.en encoder (opset 17), default ``quantize_dynamic``
  (its 2 convs become ``ConvInteger``), from ``.models/quantized/whisper17.onnx`` or
  ``.models/whisper_enc_op17.onnx`` (``benchmarks/export_whisper.py``), with the first clip
  (1 x 80 x 3000 log-mel). Skips without them (CI).

    @pytest.fixture(scope="session")      # one per test module (xdist: per worker)
    def rec(tmp_path_factory):
        return quantized_rec(tmp_path_factory.mktemp("quantized"))

    d = pd.diagnose(str(rec.path), rec.samples, target="fp16")
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from precision_doctor.graph import input_metadata, load_model

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / ".models"
SHARED = Path(os.environ.get("PRECISION_DOCTOR_SHARED") or REPO.parent / "shared")
REC_SAMPLES = 3  # 3 crops keep diagnose + fix under a minute each on 2 cores


@dataclass(frozen=True)
class QuantizedCase:
    """A quantized model and its real samples.

    Attributes:
        name: ``rec``, ``minilm17`` or ``whisper17``.
        path: The quantized ``.onnx`` file.
        float_path: The float model it was quantized from.
        samples: Feed dicts ``{input name: array}``, one per sample (rec: float32
            [1, 3, 48, W]; MiniLM: int64 [8, 128] ``input_ids``/``attention_mask``/
            ``token_type_ids``; Whisper: float32 [1, 80, 3000] ``input_features``).
    """

    name: str
    path: Path
    float_path: Path
    samples: list[dict[str, np.ndarray]]


def _bench_module() -> ModuleType:
    path = REPO / "benchmarks" / "quantize_zoo.py"
    spec = importlib.util.spec_from_file_location("precision_doctor_bench_quantize", path)
    if spec is None or spec.loader is None:
        pytest.skip(f"{path} is missing")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def quantized_rec(folder: Path) -> QuantizedCase:
    """PP-OCRv4 rec after ``quantize_dynamic(op_types_to_quantize=["MatMul"])``, written into
    ``folder``, with 3 real crops.

    Raises:
        pytest.skip.Exception: Neither the wheel's rec nor ../shared's is there, or the crops
            are missing.
    """
    from precision_doctor.inputs import load_samples

    bench = _bench_module()
    source = bench.rec_source(SHARED)
    crops = SHARED.joinpath(*bench.REC_CROPS)
    if source is None or not crops.is_dir():
        pytest.skip("PP-OCRv4 rec (rapidocr_onnxruntime wheel or ../shared) or the shared "
                    "rec crops are missing")
    out = bench.quantize(source, folder / "rec_q.onnx", op_types=("MatMul",))
    meta = input_metadata(load_model(out))
    samples = [s.feeds for s in load_samples(crops, meta, "ppocr-rec", max_samples=REC_SAMPLES)]
    return QuantizedCase("rec", out, source, samples)


def quantized_minilm(folder: Path) -> QuantizedCase:
    """all-MiniLM-L6-v2 (opset 17) after default ``quantize_dynamic`` (``.models/quantized``, or
    written into ``folder``), one batch of 8 sentences.

    Raises:
        pytest.skip.Exception: ``.models/minilm_op17.onnx`` or ``.models/minilm_data`` is absent
            (run ``benchmarks/export_minilm.py``).
    """
    return _exported("minilm17", "minilm_op17.onnx", "minilm_data/batch0.npz",
                     "export_minilm.py", folder)


def quantized_whisper(folder: Path) -> QuantizedCase:
    """The Whisper tiny.en encoder (opset 17) after default ``quantize_dynamic``
    (``.models/quantized``, or written into ``folder``), one real 30 s clip.

    Raises:
        pytest.skip.Exception: ``.models/whisper_enc_op17.onnx`` or ``.models/whisper_data`` is
            absent (run ``benchmarks/export_whisper.py``).
    """
    return _exported("whisper17", "whisper_enc_op17.onnx", "whisper_data/sample0.npz",
                     "export_whisper.py", folder)


def _exported(name: str, model: str, data: str, export: str, folder: Path) -> QuantizedCase:
    """A model ``benchmarks/<export>`` wrote into ``.models/``, quantized (``.models/quantized/
    <name>.onnx``, else written into ``folder``), with the one sample of ``.models/<data>``."""
    float_path, data_path = MODELS / model, MODELS / data
    if not (float_path.is_file() and data_path.is_file()):
        pytest.skip(f"run benchmarks/{export} to write .models/{model}")
    path = MODELS / "quantized" / f"{name}.onnx"
    if not path.is_file():
        path = _bench_module().quantize(float_path, folder / f"{name}.onnx")
    with np.load(data_path) as arrays:
        samples = [{k: arrays[k] for k in arrays.files}]
    return QuantizedCase(name, path, float_path, samples)
