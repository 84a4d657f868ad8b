"""Shared setup of the GPU benchmarks: the models and real inputs they run on.

Assets folder layout (``--assets``, default ``/tmp/assets`` on the GPU machine, or the
developer's ``../shared`` + ``.models`` here):

    models/ppocrv4/{det,rec,cls}.onnx     PP-OCRv4 (shared/models)
    data/ocr/{full_images,rec_crops}/     real images (shared/data)
    minilm_op14.onnx, minilm_data/*.npz   all-MiniLM-L6-v2 exported by benchmarks/export_minilm.py

The MiniLM opset-17 model is derived on the fly from the opset-14 export by precision-doctor's
``fuse-layernorm`` rewrite (13 LayerNormalization nodes, the same graph torch exports at opset
17), so only one 86 MiB model has to be carried to the GPU machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx

from precision_doctor.graph.load import input_metadata, load_model, name_nodes
from precision_doctor.inputs import load_samples
from precision_doctor.precision.rewrites import apply_rewrites


@dataclass
class Case:
    name: str
    model: onnx.ModelProto
    samples: list


def default_assets() -> Path:
    here = Path(__file__).resolve().parents[1]
    return Path("/tmp/assets") if Path("/tmp/assets").is_dir() else here


def _path(assets: Path, rel: str) -> Path:
    for base in (assets, assets.parent / "shared", assets / ".models"):
        if (base / rel).exists():
            return base / rel
    raise FileNotFoundError(f"{rel} not found under {assets}")


def load_cases(assets: Path, names: list[str], max_images: int = 3) -> list[Case]:
    """The benchmark models with their real inputs."""
    cases = []
    for name in names:
        if name in ("det", "rec", "cls"):
            model = load_model(_path(assets, f"models/ppocrv4/{name}.onnx"))
            data = {"det": "data/ocr/full_images", "rec": "data/ocr/rec_crops/paddleocr",
                    "cls": "data/ocr/rec_crops/paddleocr"}[name]
            preset = {"det": "ppocr-det", "rec": "ppocr-rec", "cls": "ppocr-cls"}[name]
            limit = max_images if name == "det" else 8
            samples = load_samples(_path(assets, data), input_metadata(model), preset, limit)
        elif name in ("minilm14", "minilm17"):
            model = load_model(_path(assets, "minilm_op14.onnx"))
            if name == "minilm17":
                model, _ = apply_rewrites(model, ["fuse-layernorm"])
                name_nodes(model)
            samples = load_samples(_path(assets, "minilm_data"), input_metadata(model))
        else:
            raise ValueError(f"unknown case {name}")
        cases.append(Case(name, model, samples))
    return cases
