"""``audit_engine``: read a built engine's layer information (and profile, and ONNX model), say
which precision every layer ran in, and flag what the user should know."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import onnx

from precision_doctor.audit import findings as fd
from precision_doctor.audit.layers import REBUILD_HINT, LayerInfo, parse_layer_info
from precision_doctor.audit.onnx_map import OnnxIndex
from precision_doctor.audit.profile import Profile, attach_profile
from precision_doctor.audit.records import REDUCED_PRECISIONS, AuditReport, EngineLayer
from precision_doctor.audit.regions import build_regions
from precision_doctor.precision.plan import PrecisionPlan


def precision_summary(layers: Sequence[EngineLayer]) -> dict[str, dict[str, Any]]:
    """precision -> ``{"layers": n, "time_ms": t, "time_share": s}``.

    Time entries are None when no layer of that precision was profiled. Keys are sorted by
    descending time, then by descending layer count.
    """
    acc: dict[str, dict[str, Any]] = {}
    for layer in layers:
        row = acc.setdefault(layer.precision, {"layers": 0, "time_ms": None, "time_share": None})
        row["layers"] += 1
        if layer.time_ms is not None:
            row["time_ms"] = (row["time_ms"] or 0.0) + layer.time_ms
        if layer.time_share is not None:
            row["time_share"] = (row["time_share"] or 0.0) + layer.time_share
    order = sorted(acc.items(), key=lambda kv: (-(kv[1]["time_ms"] or 0.0), -kv[1]["layers"],
                                                kv[0]))
    return dict(order)


def _known_nodes(layer: EngineLayer, index: OnnxIndex) -> EngineLayer:
    """Drop names split from a layer name that are not ONNX nodes (weights, tensor names)."""
    if layer.nodes_source != "layer-name":
        return layer
    nodes = tuple(n for n in layer.onnx_nodes if n in index.op_types)
    return replace(layer, onnx_nodes=nodes, nodes_source="layer-name" if nodes else "none")


def _wanted(plan: PrecisionPlan | str | os.PathLike | None,
            expect_fp32: Iterable[str]) -> list[tuple[str, str]]:
    wanted: list[tuple[str, str]] = []
    if plan is not None:
        p = plan if isinstance(plan, PrecisionPlan) else PrecisionPlan.load(Path(plan))
        wanted.extend((n, "plan") for n in p.fp32_nodes())
    wanted.extend((str(n), "user") for n in expect_fp32)
    return list(dict.fromkeys(wanted))


def audit_engine(layer_info_path: str | os.PathLike | Mapping | list,
                 profile_path: str | os.PathLike | Sequence[Any] | Profile | None = None,
                 onnx_model: onnx.ModelProto | str | os.PathLike | None = None,
                 plan: PrecisionPlan | str | os.PathLike | None = None,
                 expect_fp32: Iterable[str] = ()) -> AuditReport:
    """Audit one TensorRT engine build.

    Args:
        layer_info_path: ``--exportLayerInfo`` / IEngineInspector JSON (path or parsed JSON).
            Build with ``--profilingVerbosity=detailed``, or only names are available.
        profile_path: ``--exportProfile`` JSON, for per-layer times (ms per inference).
        onnx_model: The ONNX model the engine was built from (proto or path); resolves the ONNX
            nodes inside ``{ForeignNode[...]}`` regions and gives op types.
        plan: A ``PrecisionPlan`` (or its JSON file); its FP32 overrides are checked.
        expect_fp32: Node names or glob patterns (``*LayerNorm*``) the user wanted in FP32.

    Returns:
        The ``AuditReport``: every layer's precision with evidence, regions, findings
        (``fp32-not-honored``, ``tf32-tactic``, ``sensitive-op``, ``reformat``, ``unreadable``),
        FP32 checks, precision summary and warnings.

    Raises:
        DataFormatError: The layer information or profile is not readable JSON of that kind.
        ModelLoadError: ``onnx_model`` cannot be read.
        PlanError: ``plan`` cannot be read.
    """
    info: LayerInfo = parse_layer_info(layer_info_path)
    warnings = list(info.warnings)
    layers: tuple[EngineLayer, ...] = info.layers
    profile_source = None
    if profile_path is not None:
        layers, prof_warn = attach_profile(layers, profile_path)
        warnings.extend(prof_warn)
        profile_source = (profile_path.source if isinstance(profile_path, Profile)
                          else str(profile_path) if isinstance(profile_path, (str, os.PathLike))
                          else "<object>")
    index = OnnxIndex.build(onnx_model) if onnx_model is not None else None
    if index is not None:
        known = sum(1 for x in layers for n in x.onnx_nodes if n in index.op_types)
        named = sum(len(x.onnx_nodes) for x in layers if not x.fused)
        if named and known == 0:
            warnings.append(f"no node name of the engine is in {index.source}: is it the model "
                            "this engine was built from?")
        elif known:
            layers = tuple(_known_nodes(x, index) for x in layers)
    layers, regions = build_regions(layers, index)
    reduced = any(x.precision in REDUCED_PRECISIONS for x in layers)
    checks, fp32_found, fp32_warn = fd.check_fp32(layers, regions, _wanted(plan, expect_fp32),
                                                  index, reduced)
    warnings.extend(fp32_warn)
    hidden = [r for r in regions if r.nodes_source == "foreign-node-endpoints"]
    if hidden and index is None:
        warnings.append(f"{len(hidden)} fused Myelin regions list only their first/last layer "
                        "names: pass --onnx MODEL.onnx to resolve every ONNX node inside them")
    findings = fd.order_findings((
        *fp32_found, *fd.tf32_findings(layers),
        *fd.sensitive_findings(layers, regions, index, reduced),
        *fd.reformat_findings(layers),
        *fd.unreadable_findings(layers, info.detailed, REBUILD_HINT)))
    timed = [x.time_ms for x in layers if x.time_ms is not None]
    return AuditReport(
        source=info.source, trt_version_guess=info.trt_version_guess,
        trt_version_evidence=info.trt_version_evidence, detailed=info.detailed, layers=layers,
        regions=regions, findings=findings, fp32_checks=checks,
        warnings=tuple(dict.fromkeys(warnings)), precision_summary=precision_summary(layers),
        total_time_ms=sum(timed) if timed else None, profile_source=profile_source,
        onnx_source=index.source if index is not None else None)
