"""The ``recipe collect`` workflow: save the real inputs, write the commands for the TensorRT
machine (``report.collect``) as a script and a Markdown page, and print them."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Sequence

import onnx
from rich.console import Console

from precision_doctor.errors import DataFormatError
from precision_doctor.formats import Precision
from precision_doctor.graph.load import input_metadata, load_model
from precision_doctor.inputs import load_samples
from precision_doctor.inputs.polygraphy import read_polygraphy_inputs, save_polygraphy_inputs
from precision_doctor.report.collect import CollectRecipe, build_collect
from precision_doctor.report.files import check_writable, write_text_atomic


def run_collect(model_path: Path, *, data: str, preprocess: str | None, fixed: Path | None,
                out: Path, target: str, max_samples: int | None, force: bool,
                console: Console) -> CollectRecipe:
    """Write ``OUT/inputs.json`` (unless ``data`` already is a Polygraphy inputs file),
    ``OUT/collect.sh`` and ``OUT/COLLECT.md``; results go to ``OUT/results``.

    Raises:
        OutputPathError: ``out`` cannot be written (checked before the model is loaded).
        PrecisionDoctorError: Bad model, data or target; files exist without ``force``.
    """
    script, page = out / "collect.sh", out / "COLLECT.md"
    inputs = Path(data) if _is_polygraphy_inputs(data) and max_samples is None else \
        out / "inputs.json"
    check_writable([script, page] + ([inputs] if inputs.parent == out else []), force,
                   inputs=[model_path, fixed], folders=[out])
    model = load_model(model_path)
    if fixed is not None:
        load_model(fixed)  # fail here, not on the TensorRT machine
    metas = input_metadata(model)
    samples = load_samples(data, metas, preprocess, max_samples)
    out.mkdir(parents=True, exist_ok=True)
    if inputs.parent == out:
        save_polygraphy_inputs(samples, inputs, overwrite=force)
    dynamic = {m.name for m in metas if m.is_dynamic()}
    shapes: dict[str, list[list[int]]] = {}
    for s in samples:
        for k, v in s.feeds.items():
            if k in dynamic:
                shapes.setdefault(k, []).append(list(v.shape))
    recipe = build_collect(str(model_path), str(inputs), fixed=str(fixed) if fixed else None,
                           target=target, out_dir=str(out / "results"), input_shapes=shapes)
    write_text_atomic(script, recipe.script(), force)
    write_text_atomic(page, recipe.render_markdown(), force)
    console.print(recipe.render_markdown(), markup=False, highlight=False, soft_wrap=True)
    console.print(f"script: {script}\npage: {page}\ninputs: {inputs}", markup=False)
    return recipe


def collect_section(model_path: Path, fixed: Path, data: str, preprocess: str | None,
                    samples: Sequence, target: Precision, max_samples: int | None = None,
                    model: onnx.ModelProto | None = None) -> str:
    """The collect section of ``fix``'s recipes file: the same commands for the original and
    the fixed model. Inputs that are not a Polygraphy inputs file are written first by ``recipe
    collect`` (the exact command is part of the section). Empty for targets other than
    FP16/BF16 (there is no weakly typed builder flag to record). ``model``: the loaded
    ``model_path``, when the caller has it (not read again)."""
    if target not in (Precision.FP16, Precision.BF16):
        return ""
    ready = _is_polygraphy_inputs(data)
    inputs = data if ready else "trt-collect/inputs.json"
    shapes: dict[str, list[list[int]]] = {}
    source = model if model is not None else load_model(model_path)
    dynamic = {m.name for m in input_metadata(source) if m.is_dynamic()}
    for s in samples:
        for k, v in s.feeds.items():
            if k in dynamic:
                shapes.setdefault(k, []).append(list(v.shape))
    recipe = build_collect(str(model_path), inputs, fixed=str(fixed), target=target,
                           out_dir="trt-collect/results", input_shapes=shapes)
    first = "" if ready else (
        "Save the inputs (and this section as a script) first:\n\n```bash\n" + shlex.join(
            ["precision-doctor", "recipe", "collect", str(model_path), "--data", data,
             *(["--preprocess", preprocess] if preprocess else []), "--fixed", str(fixed),
             "--target", target.value, "--out", "trt-collect",
             *(["--max-samples", str(max_samples)] if max_samples else [])]) + "\n```\n\n")
    text = recipe.render_markdown()
    head, _, rest = text.partition("\n\n")
    return "\n" + head + "\n\n" + first + rest


def _is_polygraphy_inputs(data: str) -> bool:
    path = Path(data)
    if path.suffix.lower() != ".json" or not path.is_file():
        return False
    try:
        read_polygraphy_inputs(path)
    except DataFormatError:
        return False
    return True
