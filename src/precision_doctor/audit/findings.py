"""Findings of the engine audit: FP32 requests not honored, TF32 tactics, sensitive ops in
reduced precision, precision-converting reformats, and what could not be read."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Iterable, Sequence

from precision_doctor.audit.onnx_map import OnnxIndex
from precision_doctor.audit.precision import tf32_tactic
from precision_doctor.audit.records import (
    CONFIRMED,
    KIND_FP32_NOT_HONORED,
    KIND_REFORMAT,
    KIND_SENSITIVE,
    KIND_TF32,
    KIND_UNREADABLE,
    LIKELY,
    POSSIBLE,
    REDUCED_PRECISIONS,
    AuditFinding,
    EngineLayer,
    Fp32Check,
    FusedRegion,
)
from precision_doctor.audit.regions import find_sensitive

KIND_ORDER = (KIND_FP32_NOT_HONORED, KIND_TF32, KIND_SENSITIVE, KIND_REFORMAT, KIND_UNREADABLE)
NON_COMPUTE = ("none", "int", "bool")
CONVERSION = frozenset({"Reformat", "MyelinReformat", "NoOp", "Cast", "Shuffle", "Constant"})
VERIFY = ("verify with `trtexec ... --exportLayerInfo=layers.json --profilingVerbosity=detailed` "
          "and `precision-doctor audit layers.json`")
NO_TF32 = ("if FP32 accuracy matters, build with `trtexec --noTF32` (Python: "
           "config.clear_flag(trt.BuilderFlag.TF32)); NVIDIA_TF32_OVERRIDE=0 also disables TF32 "
           "in cuBLAS/cuDNN tactics. TF32 keeps FP32 range with a 10-bit mantissa.")


def _layer_remedy(layer: str, nodes: Sequence[str]) -> str:
    node = nodes[0] if nodes else layer
    return (f"request FP32 with the exact network layer name (wildcards may not match fused "
            f"names): `--layerPrecisions={node}:fp32 --precisionConstraints=obey`; or build from "
            "a strongly typed ONNX with explicit Cast nodes around it "
            "(`precision-doctor fix` writes one) with `--stronglyTyped`; " + VERIFY)


def _region_remedy(nodes: Sequence[str], requested: bool = True) -> str:
    node = nodes[0] if nodes else "the node"
    lead = ("the FP32 request did not survive Myelin fusion. Reliable fix: " if requested else
            "if accuracy suffers (measure with `precision-doctor diagnose`), keep it in FP32: ")
    return (lead + f"a strongly typed ONNX with explicit Cast to float32 around {node} "
            "(`precision-doctor fix` writes one), built with `--stronglyTyped` (TensorRT >= 9; "
            "the only way in TensorRT 11). Or mark its output tensor as a network output to cut "
            "the fusion (costs speed); export with opset >= 17 so LayerNorm is one "
            "LayerNormalization op; with weak typing use exact names in "
            "`--layerPrecisions=NAME:fp32 --precisionConstraints=obey`. " + VERIFY)


@dataclass(frozen=True)
class _Cover:
    name: str
    precision: str
    fused: bool
    conversion: bool


def _covers(layers: Sequence[EngineLayer],
            regions: Sequence[FusedRegion]) -> dict[str, list[_Cover]]:
    out: dict[str, list[_Cover]] = {}
    for layer in layers:
        if layer.fused:
            continue
        conv = layer.type in CONVERSION or layer.precision in NON_COMPUTE
        for node in layer.onnx_nodes:
            out.setdefault(node, []).append(_Cover(layer.name, layer.precision, False, conv))
    for region in regions:
        for node in dict.fromkeys((*region.onnx_nodes, *region.first, *region.last)):
            out.setdefault(node, []).append(_Cover(region.name, region.precision, True, False))
    return out


def _universe(index: OnnxIndex | None, covers: dict[str, list[_Cover]]) -> list[str]:
    return list(index.names) if index is not None else list(covers)


def _expand(pattern: str, universe: Sequence[str]) -> list[str]:
    if any(ch in pattern for ch in "*?["):
        return [n for n in universe if fnmatch.fnmatchcase(n, pattern)]
    return [pattern] if pattern in universe else []


def check_fp32(layers: Sequence[EngineLayer], regions: Sequence[FusedRegion],
               wanted: Iterable[tuple[str, str]], index: OnnxIndex | None, reduced_build: bool,
               ) -> tuple[tuple[Fp32Check, ...], tuple[AuditFinding, ...], tuple[str, ...]]:
    """Where each node wanted in FP32 ran.

    Args:
        layers: Engine layers (with ONNX nodes).
        regions: Fused regions.
        wanted: ``(pattern, source)`` pairs: exact plan node names (source ``plan``) and user
            glob patterns (source ``user``).
        index: ONNX model index; without it only names visible in the engine can match.
        reduced_build: Some layer runs in FP16/BF16/FP8/INT8 (so a hidden region may too).

    Returns:
        ``(checks, findings, warnings)``; one ``fp32-not-honored`` finding per layer/region.
    """
    covers = _covers(layers, regions)
    universe = _universe(index, covers)
    checks: list[Fp32Check] = []
    warnings: list[str] = []
    by_layer: dict[str, tuple[list[str], str, str, bool]] = {}
    for pattern, source in wanted:
        matches = _expand(pattern, universe)
        if not matches:
            hidden = sum(1 for r in regions if r.nodes_source in ("none", "foreign-node-endpoints"))
            hint = (f"; {hidden} fused regions hide their contents: pass --onnx MODEL.onnx to "
                    "resolve them" if hidden and index is None else "")
            warnings.append(f"FP32 request {pattern!r} ({source}) matches no node "
                            f"{'of the ONNX model' if index is not None else 'named in the engine'}"
                            f"{hint}")
            checks.append(Fp32Check(pattern, source, pattern, (), "not-found", "not-found"))
            continue
        for node in matches:
            cover = covers.get(node, [])
            compute = [c for c in cover if not c.conversion] or cover
            if not compute:
                checks.append(Fp32Check(node, source, pattern, (), "not-found", "not-found"))
                continue
            low = [c for c in compute if c.precision in REDUCED_PRECISIONS]
            tf32 = [c for c in compute if c.precision == "tf32"]
            unknown = [c for c in compute if c.precision in ("unknown", "mixed")]
            if low:
                hit, conf = low[0], (LIKELY if low[0].fused else CONFIRMED)
                ran, status = hit.precision, "not-honored"
            elif tf32:
                hit, conf, ran, status = tf32[0], CONFIRMED, "tf32", "not-honored"
            elif unknown:
                hit = unknown[0]
                conf = POSSIBLE if (hit.fused and reduced_build) else CONFIRMED
                ran, status = hit.precision, ("not-honored" if conf == POSSIBLE else "unknown")
            else:
                hit, conf, ran, status = compute[0], CONFIRMED, compute[0].precision, "honored"
            checks.append(Fp32Check(node, source, pattern, tuple(c.name for c in compute), ran,
                                    status, conf))
            if status == "not-honored":
                entry = by_layer.setdefault(hit.name, ([], ran, conf, hit.fused))
                entry[0].append(node)
    findings = []
    times: dict[str, tuple[float | None, float | None]] = {
        x.name: (x.time_ms, x.time_share) for x in layers}
    times.update({r.name: (r.time_ms, r.time_share) for r in regions})
    for layer, (nodes, ran, conf, fused) in by_layer.items():
        if ran == "tf32":
            evidence = "ran with a TF32 tactic (FP32 storage, 10-bit mantissa)"
            remedy = NO_TF32
        elif fused and conf == POSSIBLE:
            evidence = ("possibly not honored: fused region, precision not visible (TensorRT "
                        "reports no formats for it) in a build with reduced-precision layers")
            remedy = _region_remedy(nodes)
        elif fused:
            evidence = (f"inside a fused Myelin region whose boundary tensors are {ran}; its "
                        "internal precision is not reported")
            remedy = _region_remedy(nodes)
        else:
            evidence = f"the layer has {ran} input/output formats"
            remedy = _layer_remedy(layer, nodes)
        findings.append(AuditFinding(KIND_FP32_NOT_HONORED, layer, tuple(nodes), evidence, remedy,
                                     conf, *times.get(layer, (None, None))))
    return tuple(checks), tuple(findings), tuple(warnings)


def tf32_findings(layers: Sequence[EngineLayer]) -> tuple[AuditFinding, ...]:
    """One ``tf32-tactic`` finding per FP32 layer whose tactic is (or looks like) TF32."""
    out = []
    for layer in layers:
        level = tf32_tactic(layer.tactic)
        if level is None or layer.precision not in ("tf32", "fp32", "mixed"):
            continue
        out.append(AuditFinding(
            KIND_TF32, layer.name, layer.onnx_nodes,
            f"tactic {layer.tactic} is a TF32 tensor-core kernel"
            + ("" if level == CONFIRMED else " (by its name pattern)"),
            NO_TF32, level, layer.time_ms, layer.time_share))
    return tuple(out)


def sensitive_findings(layers: Sequence[EngineLayer], regions: Sequence[FusedRegion],
                       index: OnnxIndex | None, reduced_build: bool) -> tuple[AuditFinding, ...]:
    """Sensitive ops (normalization, softmax, pow/exp/reductions) that ran in reduced precision."""
    out = []
    for region in regions:
        if not region.sensitive:
            continue
        if region.precision in REDUCED_PRECISIONS:
            conf, where = LIKELY, f"boundary tensors {region.precision}"
        elif region.precision in ("unknown", "mixed") and reduced_build:
            conf, where = POSSIBLE, f"precision {region.precision}; the build has FP16/INT8 layers"
        else:
            continue
        ops = ", ".join(f"{s.op} {s.node}" for s in region.sensitive[:6])
        out.append(AuditFinding(
            KIND_SENSITIVE, region.name, tuple(s.node for s in region.sensitive),
            f"fused region ({where}) contains {ops}"
            + ("" if index is not None else "; found by name only, pass --onnx to list all"),
            _region_remedy([s.node for s in region.sensitive], requested=False), conf,
            region.time_ms,
            region.time_share))
    for layer in layers:
        if layer.fused or layer.precision not in REDUCED_PRECISIONS or layer.type in CONVERSION:
            continue
        found = find_sensitive(layer.onnx_nodes, index, layer.type)
        if not found:
            continue
        ops = ", ".join(f"{s.op} {s.node}" for s in found[:6])
        out.append(AuditFinding(
            KIND_SENSITIVE, layer.name, tuple(s.node for s in found),
            f"{layer.precision} input/output formats on {ops} (a kernel may still accumulate "
            "in FP32 internally)",
            "if accuracy suffers (measure with `precision-doctor diagnose`): "
            + _layer_remedy(layer.name, [s.node for s in found]),
            CONFIRMED, layer.time_ms, layer.time_share))
    return tuple(out)


def reformat_findings(layers: Sequence[EngineLayer]) -> tuple[AuditFinding, ...]:
    """One ``reformat`` finding per layer that converts between precisions."""
    out = []
    for layer in layers:
        if layer.precision != "mixed" or layer.type not in CONVERSION | {"Reformat"}:
            continue
        conv = f"{layer.input_precision} -> {layer.output_precision}"
        out.append(AuditFinding(
            KIND_REFORMAT, layer.name, layer.onnx_nodes,
            f"converts {conv} ({layer.type})",
            "each precision boundary costs a copy: merge adjacent FP32 islands, or use FP16 "
            "network I/O (`--inputIOFormats=fp16:chw --outputIOFormats=fp16:chw`) when the "
            "conversions sit at the inputs/outputs", CONFIRMED, layer.time_ms, layer.time_share))
    return tuple(out)


def unreadable_findings(layers: Sequence[EngineLayer], detailed: bool,
                        rebuild_hint: str) -> tuple[AuditFinding, ...]:
    """What could not be read: names-only files, layers without recognisable formats."""
    if not detailed:
        return (AuditFinding(KIND_UNREADABLE, "<all layers>", (),
                             f"{len(layers)} layers listed by name only: no formats, no tactics",
                             rebuild_hint),)
    return tuple(
        AuditFinding(KIND_UNREADABLE, layer.name, layer.onnx_nodes,
                     "; ".join(layer.evidence[:2]) or "no formats", rebuild_hint, CONFIRMED,
                     layer.time_ms, layer.time_share)
        for layer in layers if layer.precision == "unknown" and not layer.fused)


def order_findings(findings: Iterable[AuditFinding]) -> tuple[AuditFinding, ...]:
    """Kinds in ``KIND_ORDER``; within a kind, slowest first, then stable."""
    rank = {k: i for i, k in enumerate(KIND_ORDER)}
    items = list(findings)
    return tuple(sorted(items, key=lambda f: (rank.get(f.kind, len(rank)),
                                              -(f.time_ms or 0.0))))
