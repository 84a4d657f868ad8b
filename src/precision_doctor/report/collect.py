"""The collect recipe: what to run on a TensorRT machine, and the command that analyses it here.

For the original model (weakly typed, the builder's ``--fp16``/``--bf16`` flag, as most
deployments build it) and, when given, the fixed model (strongly typed: its Casts carry the
precision), each with TF32 off and on (TensorRT enables TF32 by default, Polygraphy does not:
NVIDIA/TensorRT #4052, #4492):

1. ``polygraphy run --trt --load-inputs INPUTS --save-inputs --save-outputs`` on the engine as
   deployed (the inputs it saw are saved beside its outputs), with ``--verbose`` into a build
   log (settings, version, LayerNorm warnings: ``audit``);
2. the same with ``--trt-outputs mark all`` for the layerwise comparison. Marking every tensor
   blocks fusions, so that engine is not quite the deployed one (NVIDIA/TensorRT #2571,
   #4647): both recordings are kept and both can be analysed;
3. ``trtexec --profilingVerbosity=detailed --exportLayerInfo --exportProfile --verbose`` for
   the engine audit (the precision each layer ran in, time shares).

Then ``precision-doctor diagnose MODEL --data INPUTS --candidate-results RECORDING`` analyses a
recording here, with the FP32 reference computed on the same inputs. Every path and name goes
through ``shlex.quote``; redirections are the only unquoted shell syntax.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass
from pathlib import PurePosixPath
from typing import Any, Mapping, Sequence

from precision_doctor.errors import PlanError
from precision_doctor.formats import Precision
from precision_doctor.report.shell import (
    ShapeRange,
    fence,
    polygraphy_shapes,
    shape_ranges,
    shell,
    trtexec_shapes,
)


@dataclass(frozen=True)
class CollectRun:
    """One engine configuration to record.

    Attributes:
        tag: File stem of everything it writes (``original_fp16_notf32``).
        model: The ONNX model path on the TensorRT machine.
        typed: ``strongly-typed`` or the weakly typed builder flag (``fp16``/``bf16``).
        tf32: Whether TF32 is allowed.
        commands: Shell commands, in order (Polygraphy outputs, marked outputs, trtexec audit).
        analyse: The ``precision-doctor`` commands that read what they write.
    """

    tag: str
    model: str
    typed: str
    tf32: bool
    commands: tuple[str, ...]
    analyse: tuple[str, ...]


@dataclass(frozen=True)
class CollectRecipe:
    """Commands for the TensorRT machine and the analysis here (round-trips through JSON)."""

    model: str
    fixed: str | None
    inputs: str
    out_dir: str
    target: str
    runs: tuple[CollectRun, ...]
    analyse: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CollectRecipe:
        runs = tuple(CollectRun(**{**r, "commands": tuple(r["commands"]),
                                   "analyse": tuple(r["analyse"])}) for r in data["runs"])
        return cls(**{**data, "runs": runs})

    def script(self) -> str:
        """A bash script running every command (``set -euo pipefail``)."""
        lines = ["#!/usr/bin/env bash",
                 "# Written by precision-doctor recipe collect: run on the TensorRT machine,",
                 f"# from the directory holding {shlex.quote(self.model)} and "
                 f"{shlex.quote(self.inputs)}.", "set -euo pipefail",
                 shlex.join(["mkdir", "-p", self.out_dir]), ""]
        for run in self.runs:
            lines += [f"# {run.tag}", *run.commands, ""]
        return "\n".join(lines)

    def render_markdown(self) -> str:
        """A ``## Collect on a TensorRT machine`` section (for the CLI and ``fix`` recipes)."""
        out = ["## Collect on a TensorRT machine",
               f"Copy {self.model}" + (f", {self.fixed}" if self.fixed else "") +
               f" and {self.inputs} (the real inputs, Polygraphy --save-inputs format) to a "
               "machine with TensorRT and Polygraphy, run these commands there, copy "
               f"`{self.out_dir}/` back, then analyse here:", fence(self.analyse, "bash")]
        for run in self.runs:
            out += [f"### {run.tag}: {run.model}, {run.typed}, TF32 "
                    f"{'on' if run.tf32 else 'off'}", fence("\n".join(run.commands), "bash"),
                    "Analyse:", fence("\n".join(run.analyse), "bash")]
        out.append("The --trt-outputs mark all engine keeps every tensor, which blocks fusions "
                   "(NVIDIA/TensorRT #2571, #4647): compare its outputs with the unmarked "
                   "recording's before trusting the layerwise table. TensorRT 8.6 has no "
                   "strongly typed networks: skip the fixed-model commands there or build it "
                   "weakly typed.")
        return "\n\n".join(out) + "\n"


def build_collect(model: str, inputs: str, *, fixed: str | None = None,
                  target: Precision | str = Precision.FP16, out_dir: str = "trt-results",
                  input_shapes: Mapping[str, Sequence[Any]] | None = None,
                  tf32_variants: Sequence[bool] = (False, True)) -> CollectRecipe:
    """The collect recipe for ``model`` (and ``fixed``).

    Args:
        model: The original FP32 ONNX model (path as on the TensorRT machine).
        inputs: Polygraphy ``--save-inputs`` JSON of the real inputs.
        fixed: The strongly typed model written by ``fix``, if any.
        target: ``fp16`` or ``bf16``: the weakly typed builder flag for the original model.
        out_dir: Where the TensorRT machine writes its results.
        input_shapes: Input name -> the shapes seen (``recipes.shape_ranges``); given for
            dynamic inputs, it sets trtexec's ``--minShapes/--optShapes/--maxShapes``.
        tf32_variants: TF32 settings to record.

    Raises:
        PlanError: ``target`` is not fp16 or bf16.
        InputShapeError: See ``shape_ranges``.
    """
    target = Precision.parse(target) if isinstance(target, str) else target
    if target not in (Precision.FP16, Precision.BF16):
        raise PlanError(f"collect records FP16 or BF16 engines, not {target.value}")
    ranges = shape_ranges(input_shapes) if input_shapes else ()
    runs = []
    variants = [(model, "original", target.value)]
    if fixed:
        variants.append((fixed, "fixed", "strongly-typed"))
    for path, role, typed in variants:
        for tf32 in tf32_variants:
            tag = f"{role}_{target.value if typed != 'strongly-typed' else 'typed'}_" \
                  f"{'tf32' if tf32 else 'notf32'}"
            runs.append(_run(path, model, tag, typed, tf32, inputs, out_dir, ranges,
                             target.value))
    return CollectRecipe(model, fixed, inputs, out_dir, target.value, tuple(runs),
                         runs[0].analyse[0])


def _run(path: str, original: str, tag: str, typed: str, tf32: bool, inputs: str,
         out_dir: str, ranges: Sequence[ShapeRange], target: str) -> CollectRun:
    out = lambda suffix: str(PurePosixPath(out_dir) / f"{tag}{suffix}")  # noqa: E731
    poly_typed = ["--strongly-typed"] if typed == "strongly-typed" else [f"--{typed}"]
    poly_shapes = polygraphy_shapes(ranges)
    base = [["polygraphy", "run", path, "--trt"], poly_typed, ["--tf32"] if tf32 else [],
            *poly_shapes, ["--load-inputs", inputs]]
    deployed = shell([*base, ["--save-inputs", out(".inputs.json")],
                      ["--save-outputs", out(".json"), "--verbose"]]) + \
        f" > {shlex.quote(out('.log'))} 2>&1"
    marked = shell([*base, ["--trt-outputs", "mark", "all"],
                    ["--save-outputs", out(".marked.json")]])
    trt_typed = ["--stronglyTyped"] if typed == "strongly-typed" else [f"--{typed}"]
    trt_shapes = trtexec_shapes(ranges)
    trtexec = shell([["trtexec", f"--onnx={path}"], trt_typed, [] if tf32 else ["--noTF32"],
                     *trt_shapes, ["--profilingVerbosity=detailed",
                                   f"--exportLayerInfo={out('.layers.json')}",
                                   f"--exportProfile={out('.profile.json')}", "--verbose"]]) + \
        f" > {shlex.quote(out('.trtexec.log'))} 2>&1"
    common = ["--data", inputs, "--target", target]
    analyse = (
        shlex.join(["precision-doctor", "diagnose", original, *common, "--candidate-results",
                    out(".marked.json"), "--candidate-log", out(".log"), "--html",
                    out(".html"), "--json", out(".report.json")]),
        shlex.join(["precision-doctor", "diagnose", original, *common, "--candidate-results",
                    out(".json"), "--candidate-log", out(".log"), "--no-layerwise"]),
        shlex.join(["precision-doctor", "audit", out(".layers.json"), "--profile",
                    out(".profile.json"), "--onnx", path, "--log", out(".trtexec.log")]))
    return CollectRun(tag, path, typed, tf32, (deployed, marked, trtexec), analyse)
