"""Read TensorRT layer information JSON into ``EngineLayer`` records.

Accepted inputs (all real formats seen in the field):

* ``trtexec --exportLayerInfo=F --profilingVerbosity=detailed`` and
  ``IEngineInspector.get_engine_information(LayerInformationFormat.JSON)``:
  ``{"Layers": [{...}, ...], "Bindings": [...]}`` for TensorRT 8.0-8.5, 8.6 (``Metadata``,
  ``{ForeignNode[...]}`` Myelin layers) and 10.x (``kgen``/``gemm``/``shape_call`` kernels).
* The same without detailed verbosity: ``{"Layers": ["name", ...]}`` (names only).
* One layer (``get_layer_information``) or a bare list of layers.

Nothing here raises on an unknown layer type or a missing field: what cannot be read becomes a
warning, and the layer gets precision ``unknown``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from precision_doctor.audit.names import (
    has_profile_suffix,
    myelin_graph_id,
    parse_foreign_node,
    split_layer_name,
    split_metadata,
)
from precision_doctor.audit.precision import infer_precision, parse_format
from precision_doctor.audit.records import EngineLayer, TensorInfo
from precision_doctor.errors import DataFormatError

# Keys this module reads.
READ_KEYS = frozenset({"Name", "LayerType", "ParameterType", "Inputs", "Outputs", "TacticName",
                       "TacticValue", "Metadata", "Origin", "StreamId", "Weights", "Bias"})
# Layer hyperparameters: understood as "not about precision", so not reported as unparsed.
PARAMETER_KEYS = frozenset({
    "Kernel", "PaddingMode", "PrePadding", "PostPadding", "Stride", "Dilation", "OutMaps",
    "Groups", "HasSparseWeights", "Activation", "HasBias", "HasReLU", "PoolingType",
    "WindowSize", "BlendFactor", "AverageCountExcludesPadding", "FirstTranspose", "Reshape",
    "SecondTranspose", "ZeroIsPlaceholder", "Start", "Size", "Mode", "negativeInfinityPadding",
    "Axes", "HasLog", "ParameterSubType", "HasDynamicFilter", "HasDynamicBias", "HasResidual",
    "ConvXAsActInputIdx", "BiasAsActInputIdx", "ResAsActInputIdx", "ElementWiseOperation",
    "NbInputArgs", "InputArgs", "NbOutputVars", "OutputVars", "NbParams", "Params",
    "NbLiterals", "Literals", "NbOperations", "Operations", "NbPointWiseExpressionInputArgs",
    "PointWiseExpressionInputArgs", "NbPointWiseExpressionOutputVars",
    "PointWiseExpressionOutputVars", "NbPointWiseExpressionParams", "PointWiseExpressionParams",
    "NbPointWiseExpressionLiterals", "PointWiseExpressionLiterals",
    "NbPointWiseExpressionOperations", "PointWiseExpressionOperations", "PluginType",
    "PluginVersion", "Shift", "Scale", "Power", "ChannelAxis", "weights", "dimensions",
    "Location", "Dimensions", "Format/Datatype", "Epsilon", "NbGroups", "ComputePrecision",
})
CONVERSION_TYPES = frozenset({"Reformat", "MyelinReformat", "NoOp", "Cast"})
FUSED_TYPES = frozenset({"Myelin", "kgen", "gemm", "shape_call"})
REBUILD_HINT = ("rebuild with `trtexec ... --profilingVerbosity=detailed --exportLayerInfo="
                "layers.json` (or set config.profiling_verbosity = "
                "trt.ProfilingVerbosity.DETAILED before building)")


@dataclass(frozen=True)
class LayerInfo:
    """Parsed layer information of one engine.

    Attributes:
        source: File path, or ``<object>``.
        layers: Layers in engine order.
        warnings: What could not be read.
        detailed: False when the file holds names only.
        bindings: Engine input/output tensor names (``Bindings``).
        trt_version_guess: ``8.0-8.5``, ``8.6``, ``10.x`` or ``unknown``.
        trt_version_evidence: Why.
    """

    source: str
    layers: tuple[EngineLayer, ...]
    warnings: tuple[str, ...]
    detailed: bool
    bindings: tuple[str, ...]
    trt_version_guess: str
    trt_version_evidence: str


def load_json(path: str | os.PathLike, what: str) -> Any:
    """Read a JSON file leniently (raw control characters such as ``\\x1e`` allowed).

    Raises:
        DataFormatError: Missing file or not JSON.
    """
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        raise DataFormatError(f"cannot read {what} {p}: {exc}", file=str(p)) from exc
    try:
        return json.loads(text, strict=False)
    except json.JSONDecodeError as exc:
        raise DataFormatError(
            f"{what} {p} is not valid JSON ({exc}). Export it again with trtexec.",
            file=str(p)) from exc


def _raw_layers(data: Any, source: str) -> tuple[list[Any], list[str]]:
    if isinstance(data, Mapping) and "Layers" in data:
        layers = data["Layers"]
        bindings = data.get("Bindings", [])
    elif isinstance(data, Mapping) and ("Name" in data or "LayerType" in data):
        layers, bindings = [data], []
    elif isinstance(data, list) and data and isinstance(data[0], Mapping) and "count" in data[0]:
        raise DataFormatError(
            f"{source} looks like a profile (--exportProfile), not layer information: pass it "
            "as --profile and the --exportLayerInfo file as the layer information.", file=source)
    elif isinstance(data, list) and (not data or any(
            isinstance(x, str) or isinstance(x, Mapping) and
            {"LayerType", "Inputs", "Outputs"} & set(x) for x in data)):
        layers, bindings = data, []
    else:
        raise DataFormatError(
            f"{source} is not TensorRT layer information: expected {{\"Layers\": [...]}} as "
            "written by `trtexec --exportLayerInfo` or IEngineInspector.", file=source)
    if not isinstance(layers, list):
        raise DataFormatError(f"{source}: \"Layers\" is not a list.", file=source)
    return layers, [str(b) for b in bindings] if isinstance(bindings, list) else []


def _tensors(raw: Any, layer: str, side: str, warnings: list[str]) -> tuple[TensorInfo, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        try:
            raw = json.loads(raw, strict=False)
        except json.JSONDecodeError:
            warnings.append(f"layer {layer!r}: {side} is a string, not a list; ignored")
            return ()
    if not isinstance(raw, list):
        warnings.append(f"layer {layer!r}: {side} is not a list; ignored")
        return ()
    out = []
    for i, t in enumerate(raw):
        if not isinstance(t, Mapping):
            warnings.append(f"layer {layer!r}: {side}[{i}] is not an object; ignored")
            continue
        fmt = str(t.get("Format/Datatype", ""))
        dims = t.get("Dimensions", [])
        try:
            shape = tuple(int(d) for d in dims) if isinstance(dims, list) else ()
        except (TypeError, ValueError):
            shape = ()
        dtype = parse_format(fmt) if fmt else "unknown"
        if dtype == "unknown":
            warnings.append(f"layer {layer!r}: {side}[{i}] format {fmt!r} names no data type")
        out.append(TensorInfo(str(t.get("Name", f"{side}[{i}]")), dtype, fmt, shape))
    return tuple(out)


def _is_fused(name: str, layer_type: str) -> bool:
    return (layer_type in FUSED_TYPES or parse_foreign_node(name) is not None
            and layer_type not in ("Reformat", "NoOp")) or name.startswith("__myl_")


def _nodes(name: str, raw: Mapping, warnings: list[str]) -> tuple[tuple[str, ...], str]:
    metadata = raw.get("Metadata")
    if isinstance(metadata, str) and metadata.strip():
        names, other = split_metadata(metadata)
        if other:
            warnings.append(f"layer {name!r}: Metadata entries not in '[ONNX Layer: ...]' form "
                            f"kept as names: {list(other)[:3]}")
        return tuple(dict.fromkeys((*names, *other))), "metadata"
    if parse_foreign_node(name) is not None:
        return split_layer_name(name), "foreign-node-endpoints"
    if "Metadata" in raw:
        # TensorRT >= 8.6 writes Metadata for every ONNX layer; an empty one means TensorRT made
        # this layer up (reformat, cast, shape kernel), so the name is not an ONNX node name.
        return (), "none"
    parts = split_layer_name(name)
    return parts, "layer-name" if parts else "none"


def _layer(index: int, raw: Any, warnings: list[str]) -> EngineLayer:
    if isinstance(raw, str):
        nodes = split_layer_name(raw)
        return EngineLayer(
            index=index, name=raw, type="unknown", precision="unknown",
            evidence=("layer information has names only: " + REBUILD_HINT,),
            onnx_nodes=nodes, nodes_source="layer-name" if nodes else "none",
            fused=parse_foreign_node(raw) is not None or raw.startswith("__myl_"))
    if not isinstance(raw, Mapping):
        warnings.append(f"layer #{index} is a {type(raw).__name__}, not an object; skipped "
                        "its details")
        return EngineLayer(index=index, name=f"<layer #{index}>", type="unknown",
                           precision="unknown", evidence=("unreadable layer entry",))
    name = str(raw.get("Name", f"<layer #{index}>"))
    if "Name" not in raw:
        warnings.append(f"layer #{index} has no Name")
    layer_type = str(raw.get("LayerType") or raw.get("ParameterType") or "unknown")
    fused = _is_fused(name, layer_type)
    inputs = _tensors(raw.get("Inputs"), name, "Inputs", warnings)
    outputs = _tensors(raw.get("Outputs"), name, "Outputs", warnings)
    tactic = raw.get("TacticName") or None
    weights = raw.get("Weights")
    wtype = str(weights.get("Type")) if isinstance(weights, Mapping) and "Type" in weights else None
    conversion = layer_type in CONVERSION_TYPES or raw.get("Origin") in ("REFORMAT", "CAST")
    precision, in_p, out_p, evidence = infer_precision(
        inputs, outputs, tactic, wtype, fused and layer_type != "shape_call", conversion)
    nodes, source = _nodes(name, raw, warnings)
    unparsed = tuple(sorted(k for k in raw if k not in READ_KEYS and k not in PARAMETER_KEYS))
    return EngineLayer(
        index=index, name=name, type=layer_type, precision=precision, input_precision=in_p,
        output_precision=out_p, evidence=evidence, inputs=inputs, outputs=outputs,
        onnx_nodes=nodes, nodes_source=source, fused=fused,
        tactic=str(tactic) if tactic else None, unparsed_keys=unparsed)


def guess_trt_version(raw_layers: Sequence[Any], layers: Sequence[EngineLayer]) -> tuple[str, str]:
    """Guess the TensorRT major version from what the JSON contains.

    Returns:
        ``(guess, evidence)``: ``10.x`` when TensorRT 10 Myelin kernels (kgen/gemm/shape_call,
        ``_mylN_k`` names) appear; ``8.6`` when ``Metadata``/``StreamId`` fields or Myelin
        ``{ForeignNode[...]}`` layers appear; ``8.0-8.5`` for detailed JSON without them;
        ``unknown`` for names only.
    """
    dicts = [r for r in raw_layers if isinstance(r, Mapping)]
    if not dicts:
        return "unknown", "names only: no fields to date the TensorRT version"
    types = {layer.type for layer in layers}
    kernels = sorted(types & {"kgen", "gemm", "shape_call"})
    if kernels or any(myelin_graph_id(layer.name) for layer in layers):
        return "10.x", f"TensorRT 10 Myelin kernel layers ({', '.join(kernels) or '_mylN_k names'})"
    keys = {k for r in dicts for k in r}
    seen = sorted(keys & {"Metadata", "StreamId"})
    if seen or "Myelin" in types:
        what = seen + (["Myelin ForeignNode layers"] if "Myelin" in types else [])
        return "8.6", f"fields/layers introduced in TensorRT 8.6: {', '.join(what)}"
    return "8.0-8.5", "detailed layer JSON without the Metadata field (added in TensorRT 8.6)"


def parse_layer_info(path_or_obj: str | os.PathLike | Mapping | list) -> LayerInfo:
    """Parse TensorRT layer information.

    Args:
        path_or_obj: A ``--exportLayerInfo`` / IEngineInspector JSON file, or its parsed JSON.

    Returns:
        ``LayerInfo`` with one ``EngineLayer`` per layer (precision inferred from tensor formats
        and tactic names; see ``precision.infer_precision``) and the warnings.

    Raises:
        DataFormatError: The file is missing, not JSON, or not layer information at all.
    """
    if isinstance(path_or_obj, (str, os.PathLike)):
        source = str(path_or_obj)
        data = load_json(path_or_obj, "layer information")
    else:
        source, data = "<object>", path_or_obj
    raw_layers, bindings = _raw_layers(data, source)
    warnings: list[str] = []
    extra = [r for r in raw_layers if isinstance(r, Mapping)
             and has_profile_suffix(str(r.get("Name", "")))]
    if extra:
        warnings.append(f"{len(extra)} layers belong to optimization profiles other than the "
                        "first ('[profile N]' suffix); only the first profile is audited")
        raw_layers = [r for r in raw_layers if not (isinstance(r, Mapping) and
                                                    has_profile_suffix(str(r.get("Name", ""))))]
    sync = [r for r in raw_layers if isinstance(r, Mapping) and r.get("LayerType") in
            ("signal", "wait")]
    layers = [_layer(i, raw, warnings) for i, raw in enumerate(r for r in raw_layers
                                                               if not any(r is s for s in sync))]
    names_only = bool(raw_layers) and all(isinstance(r, str) for r in raw_layers)
    if names_only:
        warnings.insert(0, f"{source} lists layer names only, so no precision can be read: "
                           + REBUILD_HINT)
    elif any(isinstance(r, str) for r in raw_layers):
        warnings.append("some layers are names only; their precision is unknown")
    if not raw_layers:
        warnings.append(f"{source} lists no layers")
    guess, why = guess_trt_version(raw_layers, layers)
    return LayerInfo(source, tuple(layers), tuple(dict.fromkeys(warnings)), not names_only,
                     tuple(b for b in bindings if not has_profile_suffix(b)), guess, why)
