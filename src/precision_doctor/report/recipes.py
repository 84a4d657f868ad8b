"""Engine recipes for a fixed model: trtexec, Polygraphy and ONNX Runtime settings, ready to paste.

* **Strongly typed** (recommended; TensorRT >= 10 and the only mode of TensorRT 11): build the
  fixed model, whose Casts carry the precision (trtexec ``--stronglyTyped``; samples/trtexec
  README "Create a strongly typed plan file": no ``--fp16``/``--bf16``, ``--noTF32`` applies).
* **Weakly typed** (TensorRT 8.6-10.x; deprecated in 10.12, removed in 11): the *original* model
  with ``--fp16 --precisionConstraints=obey --layerPrecisions=L:fp32 --layerOutputTypes=L:fp32``.
  The ONNX parser names a layer after its node, ``node_of_<first output>`` when unnamed
  (onnx-tensorrt ``getNodeName``). trtexec splits the specs on ``,``, strips ``'`` and reads
  ``*`` as a wildcard (sampleOptions.cpp ``getLayerPrecisions``, ``findPlausible``): such names
  withhold the route; ``:`` is fine (split on the last colon; Polygraphy likewise). Myelin
  fusion can still override exact names (NVIDIA/TensorRT #3889, #4505): verify with
  ``--exportLayerInfo --profilingVerbosity=detailed`` and ``precision-doctor audit``.

Model-derived strings (paths, node and input names: untrusted) go through ``shlex.quote``.
"""

from __future__ import annotations

import collections
import copy
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import onnx

from precision_doctor.errors import ModelLoadError, PlanError
from precision_doctor.formats import FORMATS, Precision
from precision_doctor.graph.load import name_nodes
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.report.shell import (
    ShapeRange,
    fence,
    poly_dims,
    polygraphy_shapes,
    shape_ranges,
    shell,
    trtexec_shapes,
    with_suffix,
)
from precision_doctor.runners.ort_options import parse_ort_spec

_BAD_CHARS = {",": "',' separates trtexec --layerPrecisions entries",
              "'": "trtexec strips single quotes from layer names",
              "*": "trtexec reads '*' as a wildcard, which could pin other layers too"}
_MISSING: Any = object()  # a plan node absent from the original model


@dataclass(frozen=True)
class Recipes:
    """Ready-to-paste engine settings for one fixed model (``to_dict``/``from_dict`` round-trip).

    ``fp32_layers``: TensorRT layer names the weakly typed route pins; ``skipped``: ``(node,
    reason)`` for FP32 nodes without an exact layer name; ``trtexec_weak``/``polygraphy_weak``
    are ``""`` when withheld; ``ort``: setup -> ``{"spec", "model", "providers",
    "provider_options"}`` (``spec`` as in ``runners.ort_options``); shell commands are strings.
    """

    target: Precision
    tf32: bool
    fixed_model: str
    original_model: str
    shapes: tuple[ShapeRange, ...]
    fp32_layers: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]
    trtexec: str
    trtexec_weak: str
    polygraphy_run: str
    polygraphy_reference: str
    polygraphy_weak: str
    ort: Mapping[str, Mapping[str, Any]]
    ort_python: str
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (field order)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out.update(target=self.target.value, fp32_layers=list(self.fp32_layers),
                   shapes=[{"name": s.name, "min": list(s.min), "opt": list(s.opt),
                            "max": list(s.max)} for s in self.shapes],
                   skipped=[{"node": n, "reason": r} for n, r in self.skipped],
                   ort={k: copy.deepcopy(dict(v)) for k, v in self.ort.items()},
                   notes=list(self.notes))
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Recipes:
        """Inverse of ``to_dict``; raises ``PlanError`` on a missing key or unknown precision."""
        try:
            kw = {f.name: data[f.name] for f in fields(cls)}
            kw.update(target=Precision.parse(data["target"]), tf32=bool(data["tf32"]),
                      shapes=tuple(ShapeRange(str(s["name"]), tuple(s["min"]), tuple(s["opt"]),
                                              tuple(s["max"])) for s in data["shapes"]),
                      fp32_layers=tuple(data["fp32_layers"]), notes=tuple(data["notes"]),
                      skipped=tuple((str(s["node"]), str(s["reason"])) for s in data["skipped"]),
                      ort={str(k): copy.deepcopy(dict(v)) for k, v in data["ort"].items()})
            return cls(**kw)
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanError(f"malformed engine recipes ({exc!r}); write them with "
                            "Recipes.to_dict()") from exc

    def render_markdown(self) -> str:
        """A short ``recipes.md`` section with every command and option set."""
        out = [f"## Engine recipes ({self.target.value}, TF32 {'on' if self.tf32 else 'off'})",
               "### TensorRT >= 10, strongly typed (recommended)", fence(self.trtexec, "bash"),
               "### TensorRT 8.6-10.x, weakly typed, original model"]
        out += ([fence(self.trtexec_weak, "bash"), fence(self.polygraphy_weak, "bash")]
                if self.trtexec_weak
                else ["Withheld (see the notes): use the strongly typed model."])
        if self.skipped:
            out += ["FP32 nodes whose TensorRT layer cannot be named exactly:",
                    fence("\n".join(f"{n}  # {r}" for n, r in self.skipped), "text")]
        out += ["### Verify with Polygraphy", fence(self.polygraphy_run, "bash"),
                fence(self.polygraphy_reference, "bash"),
                "### ONNX Runtime execution providers", fence(self.ort_python, "python"),
                "### Notes", "\n".join(f"- {n}" for n in self.notes)]
        return "\n\n".join(out) + "\n"


def trt_layer_names(model: onnx.ModelProto | str | os.PathLike) -> dict[str, str | None]:
    """Map plan node names (``load_model`` naming: ``<op_type>_<index>`` for an unnamed or
    duplicate node) to the layer names TensorRT's ONNX parser gives them.

    Args:
        model: The original model *as stored* (not renamed) or its path; no external data read.

    Returns:
        Plan node name -> layer name (``node_of_<first output>`` when unnamed); ``None`` for a
        duplicate-named node, as TensorRT renames all but one.

    Raises:
        ModelLoadError: The path cannot be read as ONNX.
    """
    try:
        if not isinstance(model, onnx.ModelProto):
            model = onnx.load(str(model), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError/OSError variants
        raise ModelLoadError(f"cannot read {model} to name its TensorRT layers: {exc}",
                             file=str(model)) from exc
    stored = [n.name for n in model.graph.node]
    counts = collections.Counter(stored)
    renamed = onnx.ModelProto()  # name_nodes reads only name and op_type: copy nothing else
    renamed.graph.node.extend(onnx.NodeProto(name=n.name, op_type=n.op_type)
                              for n in model.graph.node)
    name_nodes(renamed)
    return {node.name: (disk if counts[disk] == 1 else None) if disk else
            (f"node_of_{orig.output[0]}" if orig.output else None)
            for disk, node, orig in zip(stored, renamed.graph.node, model.graph.node)}


def _unnameable(layer: str | None) -> str:
    if layer is None:
        return "several nodes share this name in the model file; TensorRT renames them"
    if layer is _MISSING:
        return "not a node of the original model (made by a rewrite): only the fixed model has it"
    if not layer.isprintable():
        return "the name is empty or holds a control character"
    if layer.startswith("-"):
        return "a leading '-' would be read as a Polygraphy option"
    return next((why for ch, why in _BAD_CHARS.items() if ch in layer), "")


def default_tolerance(target: Precision) -> float:
    """Polygraphy ``--atol``/``--rtol`` default: 1e-3 for FP16 (NVIDIA, NVIDIA/TensorRT #3893;
    Polygraphy's 1e-5 is an FP32 tolerance, #1565) times the format's unit roundoff over FP16's:
    1e-3 for TF32 (10-bit mantissa too), 8e-3 for BF16 (7 bits)."""
    return 1e-3 * FORMATS[target].unit_roundoff / FORMATS[Precision.FP16].unit_roundoff


def build_recipes(fixed_model: str | os.PathLike, original_model: str | os.PathLike,
                  plan: PrecisionPlan, target: Precision | str, tf32: bool,
                  input_shapes: Mapping[str, Sequence[Any]], *, dynamic: bool = True,
                  layer_names: Mapping[str, str | None] | None = None,
                  atol: float | None = None, rtol: float | None = None,
                  inputs_json: str | os.PathLike | None = None,
                  plan_json: str | os.PathLike | None = None) -> Recipes:
    """Engine recipes for the fixed model and the weakly typed alternative.

    Args:
        fixed_model, original_model: The strongly typed model written by ``fix``; the FP32
            model whose layers the weakly typed route pins (``plan.fp32_nodes()``).
        plan: The precision plan. target: ``fp16``, ``bf16`` or ``tf32``.
        tf32: Whether TF32 may be used: trtexec ``--noTF32`` when False, Polygraphy ``--tf32``
            when True (its default is off), CUDA EP ``use_tf32``.
        input_shapes: See ``shape_ranges``.
        dynamic: Whether any input has a symbolic dim; no profile flags are written when False.
        layer_names: ``trt_layer_names(original file)``; identity when None.
        atol, rtol: Polygraphy tolerances; ``default_tolerance(target)`` when None.
        inputs_json: Polygraphy ``--save-inputs`` JSON of real inputs (random data when None).
        plan_json: Where the plan JSON is saved, for the audit commands.

    Raises:
        PlanError: ``target`` is not a reduced precision.
        InputShapeError: See ``shape_ranges``.
    """
    target = Precision.parse(target) if isinstance(target, str) else target
    if target is Precision.FP32:
        raise PlanError("engine recipes need a reduced target precision: fp16, bf16 or tf32")
    fixed, orig = str(fixed_model), str(original_model)
    ranges = shape_ranges(input_shapes) if dynamic else ()
    atol, rtol = (default_tolerance(target) if t is None else t for t in (atol, rtol))
    nodes = plan.fp32_nodes()
    layers, skipped = [], []
    for node in nodes:
        layer = node if layer_names is None else layer_names.get(node, _MISSING)
        if why := _unnameable(layer):
            skipped.append((node, why))
        else:
            layers.append(str(layer))
    engine, layer_json = with_suffix(fixed, ".plan"), with_suffix(fixed, ".layers.json")
    trt_shapes = trtexec_shapes(ranges)
    no_tf32 = [[] if tf32 else ["--noTF32"]]
    plan_arg = ["--plan", str(plan_json)] if plan_json else []
    trtexec = shell([["trtexec", f"--onnx={fixed}"], ["--stronglyTyped"], *no_tf32, *trt_shapes,
                     ["--profilingVerbosity=detailed", f"--exportLayerInfo={layer_json}",
                      f"--saveEngine={engine}"]],
                    ["# TensorRT >= 10. TensorRT 11 builds every network strongly typed",
                     "# (--stronglyTyped is the default there; weak typing was removed)."])
    trtexec += "\n# then check the precision each layer ran in:\n" + shlex.join(
        ["precision-doctor", "audit", layer_json, "--onnx", fixed, *plan_arg])
    poly_shapes = polygraphy_shapes(ranges)
    shape_in = ([["--input-shapes", *(f"{s.name}:{poly_dims(s.opt)}" for s in ranges)]]
                if ranges else [])
    real_in = [["--load-inputs", str(inputs_json)]] if inputs_json else shape_in
    poly_tf32 = [["--tf32"] if tf32 else []]
    tol = [["--atol", f"{atol:g}", "--rtol", f"{rtol:g}"]]
    typed = [["--trt", "--strongly-typed"], *poly_tf32, *poly_shapes]
    # ONNX Runtime CPU has no BF16 Conv/MatMul/... kernels: the BF16 model's ORT side is CUDA
    ort_side, where = ((["--onnxrt", "--providers", "cuda"], "CUDA") if target is Precision.BF16
                       else (["--onnxrt"], "CPU"))
    polygraphy_run = shell([["polygraphy", "run", fixed], ort_side, *typed, *real_in, *tol],
                           [f"# The engine against ONNX Runtime {where} running the same typed "
                            "model."])
    polygraphy_reference = "\n".join([
        "# The engine against the FP32 original: save reference outputs, then compare.",
        shell([["polygraphy", "run", orig, "--onnxrt"], *real_in,
               ["--save-inputs", "inputs.json", "--save-outputs", "fp32_outputs.json"]]),
        shell([["polygraphy", "run", fixed], *typed, ["--load-inputs", "inputs.json"],
               ["--load-outputs", "fp32_outputs.json"], *tol])])
    trtexec_weak = polygraphy_weak = ""
    if target is not Precision.TF32 and not skipped:
        flag = "--bf16" if target is Precision.BF16 else "--fp16"
        weak_engine = with_suffix(orig, f".weak_{target.value}.plan")
        weak_json = with_suffix(orig, f".weak_{target.value}.layers.json")
        pins = [[(f"--layer{k}=", [f"{n}:fp32" for n in layers])]
                for k in ("Precisions", "OutputTypes")] if layers else []
        trtexec_weak = shell(
            [["trtexec", f"--onnx={orig}"], [flag], *no_tf32, ["--precisionConstraints=obey"],
             *pins, *trt_shapes, ["--profilingVerbosity=detailed",
                                  f"--exportLayerInfo={weak_json}", f"--saveEngine={weak_engine}"]],
            ["# TensorRT 8.6-10.x only (weak typing: deprecated in 10.12, removed in 11). Exact",
             "# layer names; Myelin fusion can still override them (NVIDIA/TensorRT #3889, #4505)",
             "# and extra layers of one node are named <name>_1, ...: audit the layer JSON."])
        trtexec_weak += "\n" + shlex.join(
            ["precision-doctor", "audit", weak_json, "--onnx", orig, *plan_arg])
        poly_pins = [["--layer-precisions"], *([f"{n}:float32"] for n in layers)] if layers else []
        polygraphy_weak = shell(
            [["polygraphy", "convert", orig], [flag], *poly_tf32,
             ["--precision-constraints", "obey"], *poly_pins, *poly_shapes, ["-o", weak_engine]],
            ["# Polygraphy sets layer precisions only (it has no per-layer output types)."])
    ort, ort_python = _ort(fixed, orig, target, tf32)
    notes = _notes(target, tf32, nodes, layers, skipped, layer_names is None, inputs_json,
                   [s.name for s in ranges], dynamic and not ranges)
    return Recipes(target, tf32, fixed, orig, ranges, tuple(layers), tuple(skipped), trtexec,
                   trtexec_weak, polygraphy_run, polygraphy_reference, polygraphy_weak, ort,
                   ort_python, notes)


_ORT_COMMENTS = {"cuda_fixed": "CUDA EP, strongly typed model (its Casts set every type)",
                 "tensorrt_fixed": "TensorRT EP, strongly typed model: trt_fp16_enable off, so the"
                 " EP builds a strongly typed network (microsoft/onnxruntime#24298)",
                 "tensorrt_original": "TensorRT EP, original model, weakly typed: the LayerNorm "
                 "fallback covers LayerNorm only, not the plan's other FP32 nodes"}


def _ort(fixed: str, orig: str, target: Precision, tf32: bool) -> tuple[dict, str]:
    """ONNX Runtime setups via ``parse_ort_spec`` (TensorRT EP booleans 'True'/'False', CUDA
    '0'/'1'); the CUDA EP behind the TensorRT EP gets the same ``use_tf32``."""
    low = {Precision.FP16: ",fp16=1", Precision.BF16: ",bf16=1"}.get(target, "")
    specs = {"cuda_fixed": (f"ort:cuda,tf32={int(tf32)}", fixed),
             "tensorrt_fixed": ("ort:tensorrt,fp16=0", fixed),
             "tensorrt_original": (f"ort:tensorrt{low},layer_norm_fp32_fallback=1", orig)}
    ort: dict[str, dict[str, Any]] = {}
    code = ["import onnxruntime as ort", ""]
    for key, (spec, model) in specs.items():
        parsed = parse_ort_spec(spec)
        providers, options = parsed.providers(), parsed.provider_options()
        if parsed.provider != "CUDAExecutionProvider":
            options[1] = {**options[1], "use_tf32": str(int(tf32))}
        ort[key] = {"spec": spec, "model": model, "providers": providers,
                    "provider_options": options}
        chain = "".join(f"    {(p, o) if o else p!r},\n" for p, o in zip(providers, options))
        code += [f"# {_ORT_COMMENTS[key]}",
                 f"{key} = ort.InferenceSession({model!r}, providers=[\n{chain}])", ""]
    return ort, "\n".join(code).rstrip() + "\n"


def _notes(target: Precision, tf32: bool, nodes: Sequence[str], layers: Sequence[str],
           skipped: Sequence[tuple[str, str]], unmapped: bool, inputs_json: Any,
           inputs: Sequence[str], no_shapes: bool) -> tuple[str, ...]:
    notes = [("Prefer the strongly typed model: its precision is in the graph, so no engine "
              "flag can silently drop it, and TensorRT 11 accepts nothing else.")]
    if odd := [n for n in inputs if "," in n or "'" in n]:
        notes.append(f"trtexec cannot write input name(s) {odd!r} in --minShapes/--optShapes/"
                     "--maxShapes (it splits on ',' and strips quotes): use Polygraphy.")
    if no_shapes:
        notes.append("The model has dynamic inputs but no shapes were given: add --minShapes/"
                     "--optShapes/--maxShapes, or trtexec will set every dynamic dim to 1.")
    if target is Precision.BF16:
        notes.append("BF16 needs a GPU with BF16 units (compute capability >= 8.0: Ampere, "
                     "Hopper). The model's Casts set BF16: trtexec --stronglyTyped and the CUDA "
                     "EP need no BF16 flag. ONNX Runtime CPU has no BF16 Conv/MatMul kernels: "
                     "compare on CUDA, or with `precision-doctor diagnose --runner "
                     "emulate-written --candidate-model` on the CPU.")
    if target is Precision.TF32:
        notes.append("TF32 is not a layer precision: TensorRT cannot keep single layers out of "
                     "it, so there is no weakly typed route"
                     + (f"; the {len(nodes)} FP32 node(s) need --noTF32." if nodes and tf32
                        else "."))
    if skipped:
        notes.append(f"{len(skipped)} FP32 node(s) have no exact TensorRT layer name, so the "
                     "weakly typed commands are withheld: use the strongly typed model.")
    if unmapped and nodes:
        notes.append("Layer names assume every node of the original file has a unique name; "
                     "trt_layer_names(original) maps unnamed ones to node_of_<output>.")
    notes.append("TF32 on: trtexec's default; Polygraphy needs --tf32 (off there by default, "
                 "NVIDIA/TensorRT #4052)." if tf32 else
                 "TF32 off: trtexec --noTF32, Polygraphy's default, CUDA EP use_tf32=0; the "
                 "TensorRT EP has no TF32 option: set NVIDIA_TF32_OVERRIDE=0 when it builds "
                 "(TensorRT developer guide, TF32).")
    if not inputs_json:
        notes.append("Polygraphy feeds random inputs here; pass real ones with --load-inputs "
                     "(a --save-inputs JSON) before trusting a pass.")
    return tuple(notes)


