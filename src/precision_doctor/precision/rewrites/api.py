"""``apply_rewrites``: run the numerically safe rewrites on a copy of a model, with a report.

Each rewrite leaves the FP32 model's outputs equal up to float32 rounding, and removes something
that hurts in FP16 (see each module's docstring). They run in the order of ``REWRITES``, which
is also the order that lets them help each other: folded constants expose constant biases,
``fold-bias-add`` puts the ConvTranspose bias of PP-OCRv4 det inside the op so that
``fold-batchnorm`` can fold the BatchNormalization behind it, and ``fuse-layernorm`` runs after
them because it may raise the opset. ``saturate-constants``, ``reduce-periodic-argument`` and
``prescale-normalized-residual`` depend on the target format and run only when
``apply_rewrites`` is given one (``fix`` does). The periodic reduction runs after constant
folding (so a folded frequency table is a constant the argument's producers multiply by); the
residual prescale runs last, on the graph whose tensors ``fix`` measured (``max_abs``), after
every fold and fusion that changes what reads the stream. ``saturate-constants`` and
``reduce-periodic-argument`` are not exact in FP32 for every input (a clamp; the reduction of
|x| > 4.1e5), so ``fix`` measures them (``repair.rewrites_proof``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import onnx
import onnx_ir as ir
from onnx import version_converter

from precision_doctor.errors import PlanError
from precision_doctor.formats import Precision
from precision_doctor.graph.load import name_nodes, opset_of
from precision_doctor.precision.rewrites.attention import PrescaleAttention
from precision_doctor.precision.rewrites.batchnorm import FoldBatchNorm
from precision_doctor.precision.rewrites.bias_add import FoldBiasAdd
from precision_doctor.precision.rewrites.constant_folding import FoldConstants
from precision_doctor.precision.rewrites.graph_edit import RewritePassResult
from precision_doctor.precision.rewrites.layernorm import MIN_OPSET, FuseLayerNorm
from precision_doctor.precision.rewrites.layernorm_stats import LayerNormFp32Stats
from precision_doctor.precision.rewrites.ranges import (
    PrescaleNormalizedResidual,
    ReducePeriodicArgument,
)
from precision_doctor.precision.rewrites.report import RewriteRecord, RewriteReport
from precision_doctor.precision.rewrites.saturate import SaturateConstants

# Rule name -> pass factory (each pass returns a ``RewritePassResult``), in run order.
REWRITES: dict[str, Callable[[], ir.passes.InPlacePass]] = {
    FoldConstants.rule: FoldConstants,
    SaturateConstants.rule: SaturateConstants,
    FoldBiasAdd.rule: FoldBiasAdd,
    FoldBatchNorm.rule: FoldBatchNorm,
    PrescaleAttention.rule: PrescaleAttention,
    FuseLayerNorm.rule: FuseLayerNorm,
    LayerNormFp32Stats.rule: LayerNormFp32Stats,
    ReducePeriodicArgument.rule: ReducePeriodicArgument,
    PrescaleNormalizedResidual.rule: PrescaleNormalizedResidual,
}
CONVERT_OPSET = "convert-opset"


def _select(rules: Sequence[str] | None) -> tuple[str, ...]:
    if rules is None:
        return tuple(REWRITES)
    if isinstance(rules, str):
        rules = [rules]
    unknown = [r for r in rules if r not in REWRITES]
    if unknown:
        raise PlanError(f"unknown rewrite {unknown[0]!r}; available: {', '.join(REWRITES)}",
                        rule=unknown[0])
    return tuple(r for r in REWRITES if r in set(rules))


def convert_opset(model: onnx.ModelProto, target: int,
                  why: str) -> tuple[onnx.ModelProto, RewriteRecord]:
    """Convert ``model`` to default-domain opset ``target`` with ``onnx.version_converter``.

    Nodes the converter adds get names (``name_nodes``); model-level fields (producer, doc
    string, metadata) are copied back in case the converter drops them.

    Args:
        model: The model (not modified).
        target: Opset to convert to.
        why: Why the conversion is done, for the record.

    Returns:
        ``(converted model, record)``; on failure the input model and a record with
        ``applied=False`` whose reason has the converter's message.
    """
    source = opset_of(model)
    before = {n.name for n in model.graph.node}
    try:
        converted = version_converter.convert_version(model, target)
    except Exception as exc:  # noqa: BLE001 - the converter raises many error types
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return model, RewriteRecord(CONVERT_OPSET, False, (), (), f"onnx.version_converter "
                                    f"could not convert opset {source} -> {target} ({why}): "
                                    f"{first}", {"from_opset": source, "to_opset": target})
    name_nodes(converted)
    for field in ("producer_name", "producer_version", "doc_string", "domain", "model_version"):
        setattr(converted, field, getattr(model, field))
    del converted.metadata_props[:]
    converted.metadata_props.extend(model.metadata_props)
    after = {n.name for n in converted.graph.node}
    return converted, RewriteRecord(
        CONVERT_OPSET, True, tuple(sorted(before - after)), tuple(sorted(after - before)),
        f"opset {source} -> {target} with onnx.version_converter ({why})",
        {"from_opset": source, "to_opset": target})


def _run_pass(rewrite: ir.passes.InPlacePass, model: ir.Model) -> RewritePassResult:
    result = rewrite(model)
    assert isinstance(result, RewritePassResult)
    return result


def _fuse_layernorm(model: ir.Model, target_opset: int | None,
                    records: list[RewriteRecord]) -> ir.Model:
    """Run ``fuse-layernorm``, raising the opset to 17 first when a match needs it."""
    opset = int(model.opset_imports.get("", 1))
    if opset >= MIN_OPSET:
        records.extend(_run_pass(FuseLayerNorm(), model).records)
        return model
    probe = _run_pass(FuseLayerNorm(dry_run=True), model)
    candidates = [r for r in probe.records if r.details.get("candidate")]
    if not candidates:
        records.extend(probe.records)
        return model
    if target_opset is not None:
        blocked = f"LayerNormalization needs opset >= {MIN_OPSET}, but target_opset=" \
                  f"{target_opset} was requested"
        records.extend(RewriteRecord(r.rule, False, r.nodes, (), blocked) if r in candidates
                       else r for r in probe.records)
        return model
    converted, record = convert_opset(
        ir.serde.serialize_model(model), MIN_OPSET,
        f"LayerNormalization for {len(candidates)} decomposed LayerNorm(s)")
    records.append(record)
    if not record.applied:
        records.extend(RewriteRecord(r.rule, False, r.nodes, (), record.reason)
                       if r in candidates else r for r in probe.records)
        return model
    fused = ir.serde.deserialize_model(converted)
    records.extend(_run_pass(FuseLayerNorm(), fused).records)
    return fused


def _keep_value_info(model: onnx.ModelProto, names: set[str]) -> None:
    """Drop the value_info entries the rewrites added (onnxscript's folder types every value),
    so the output carries the same optional shape annotations as the input."""
    kept = [vi for vi in model.graph.value_info if vi.name in names]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)


def apply_rewrites(model: onnx.ModelProto, rules: Sequence[str] | None = None,
                   target_opset: int | None = None, target: Precision | None = None,
                   max_abs: Mapping[str, float] | None = None
                   ) -> tuple[onnx.ModelProto, RewriteReport]:
    """Apply numerically safe rewrites to a copy of ``model``.

    Args:
        model: The ONNX model; never modified. Unnamed nodes of the copy get names
            (``<op_type>_<index>``, as ``load_model`` does) so records can name them.
        rules: Names from ``REWRITES`` to run (always in ``REWRITES`` order); None = all.
        target_opset: Convert the model to this default-domain opset first (record
            ``convert-opset``). When None, the opset is raised to 17 only if ``fuse-layernorm``
            finds a LayerNorm to fuse; when below 17, LayerNorms are reported but not fused.
        target: The reduced format the model is rewritten for (FP16, BF16): the range
            ``saturate-constants`` clamps masking constants to, the format
            ``reduce-periodic-argument`` and ``prescale-normalized-residual`` act for. None:
            those rules do nothing.
        max_abs: Tensor name -> largest finite |x| on the calibration data in FP32, for
            ``prescale-normalized-residual`` (None: it records its candidate streams only) and
            ``reduce-periodic-argument`` (an argument measured below its phase limit is left
            alone; None: the graph's bound decides).

    Returns:
        ``(rewritten model, report)``. The rewritten model keeps graph input/output names and
        order, producer, doc strings and metadata_props; folded ops keep the name of the tensor
        they replace.

    Raises:
        PlanError: ``rules`` names an unknown rewrite.
    """
    selected = _select(rules)
    work = onnx.ModelProto()
    work.CopyFrom(model)
    name_nodes(work)
    opset_before = opset_of(work)
    records: list[RewriteRecord] = []
    if target_opset is not None and target_opset != opset_before:
        work, record = convert_opset(work, target_opset, "target_opset requested")
        records.append(record)
    ir_model = ir.serde.deserialize_model(work)
    for rule in selected:
        if rule == FuseLayerNorm.rule:
            ir_model = _fuse_layernorm(ir_model, target_opset, records)
        elif rule == SaturateConstants.rule:
            records.extend(_run_pass(SaturateConstants(target), ir_model).records)
        elif rule == ReducePeriodicArgument.rule:
            records.extend(_run_pass(ReducePeriodicArgument(target, max_abs),
                                     ir_model).records)
        elif rule == PrescaleNormalizedResidual.rule:
            records.extend(_run_pass(PrescaleNormalizedResidual(target, max_abs),
                                     ir_model).records)
        else:
            records.extend(_run_pass(REWRITES[rule](), ir_model).records)
    out = ir.serde.serialize_model(ir_model)
    _keep_value_info(out, {vi.name for vi in model.graph.value_info})
    report = RewriteReport(selected, tuple(records), opset_before, opset_of(out))
    return out, report
