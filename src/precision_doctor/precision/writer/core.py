"""``write_mixed_precision``: a strongly typed mixed-precision ONNX model from a ``PrecisionPlan``.

TensorRT >= 10 strongly typed networks (and TensorRT 11, which removed weak typing) take the
precision of every layer from the ONNX types, so the model itself must say where FP16/BF16 starts
and ends. The writer (1) decides the storage format of every float tensor (``writer.decide``),
(2) rewrites the model with explicit Casts only at precision boundaries and converted constants
(``writer.apply``), (3) validates it (``writer.validate``). What it fixes in the tools people use
(ANCHORS.md): weights are never clamped (a node whose parameters do not fit stays FP32 and is
reported), Resize ``scales`` stays float32, Clip/Pad/Where operands change with their data,
metadata_props survive (PP-OCRv4 rec keeps its character list there), no orphan or paired Casts.

TF32 is an engine setting, not a storage type: TF32 nodes are FP32 in the written model and are
listed in the report for the engine recipe.

The opset is raised (``onnx.version_converter``) only when needed: Cast to bfloat16 needs opset
13, and some ops accept FP16/BF16 only from a later opset (Conv/pools: bfloat16 from 22). The
writer never goes above ``MAX_WRITER_OPSET``.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir
from onnx import version_converter

from precision_doctor.errors import UnsupportedModelError
from precision_doctor.formats import Precision
from precision_doctor.graph.load import opset_of
from precision_doctor.precision.plan import DATA_MOVEMENT_OPS, PrecisionPlan
from precision_doctor.precision.writer.apply import WritePassResult, WritePrecisionPass
from precision_doctor.precision.writer.checks import ConstantMemo
from precision_doctor.precision.writer.decide import FLOAT, Decisions, decide
from precision_doctor.precision.writer.report import WriterReport
from precision_doctor.precision.writer.schema import min_ir_version
from precision_doctor.precision.writer.validate import check_written, inferred_dtypes

# Opset 22 is where ONNX allowed bfloat16 in Conv, ConvTranspose and the pooling ops; ONNX
# Runtime (>= 1.20) and TensorRT 10 parse it. The writer does not convert beyond it.
MAX_WRITER_OPSET = 22
_MODEL_FIELDS = ("producer_name", "producer_version", "doc_string", "domain", "model_version")


def convert_opset(model: onnx.ModelProto, target: int, why: str) -> onnx.ModelProto:
    """``model`` converted to default-domain opset ``target``, model-level fields kept.

    Args:
        model: The model (not modified).
        target: Opset to convert to.
        why: Why the conversion is needed (for the error message).

    Returns:
        The converted model with IR version raised to what ``target`` requires.

    Raises:
        UnsupportedModelError: ``onnx.version_converter`` cannot convert the model.
    """
    source = opset_of(model)
    try:
        converted = version_converter.convert_version(model, target)
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnsupportedModelError(
            f"the precision plan needs opset {target} ({why}) but onnx.version_converter cannot "
            f"convert this model from opset {source}: {reason}. Re-export the model at opset "
            f">= {target}, or use FP16 / keep those nodes FP32.", opset=source) from exc
    for name in _MODEL_FIELDS:
        setattr(converted, name, getattr(model, name))
    del converted.metadata_props[:]
    converted.metadata_props.extend(model.metadata_props)
    converted.ir_version = max(converted.ir_version, model.ir_version, min_ir_version(target))
    return converted


def _keep_value_info(model: onnx.ModelProto, names: set[str]) -> None:
    """Drop the value_info entries onnx_ir adds on serialization (it types every initializer),
    so the written model carries the same optional annotations as the input (types updated)."""
    kept = [vi for vi in model.graph.value_info if vi.name in names]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)


def _release_weights(ir_model: ir.Model, decisions: Decisions) -> None:
    """Unmap the external weights the writer read: the IR model lives in reference cycles,
    so its memory maps would otherwise stay in the process until the cyclic garbage
    collector runs (1.1x the weights in RSS through ``fix``'s final verification,
    measured 2026-11-24 on a 0.5 GiB generated model)."""
    decisions.constants.clear()
    for value in ir_model.graph.initializers.values():
        if isinstance(value.const_value, ir.ExternalTensor):
            value.const_value.release()


def _why(decisions: Decisions) -> str:
    return "; ".join(f"{op} accepts the requested type from opset {v}"
                     for op, v in decisions.upgrades.items())


def _report(original: onnx.ModelProto, written: onnx.ModelProto, decisions: Decisions,
            result: WritePassResult, keep_io_types: bool, ort_ok: bool,
            warnings: list[str], plan: PrecisionPlan) -> WriterReport:
    per_precision: dict[str, int] = {}
    names: dict[str, str] = {}
    for node, typing in decisions.typings.items():
        if typing.precision is None or typing.kind == "constant":
            continue
        key = typing.precision.value
        per_precision[key] = per_precision.get(key, 0) + 1
        if node.name:
            names[node.name] = key
    io = {vi.name: str(onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
          for vi in [*written.graph.input, *written.graph.output]
          if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type}
    c = result.counts
    notes = list(warnings)
    if decisions.unknown_dtype:
        notes.append(f"{len(decisions.unknown_dtype)} tensor(s) have no known element type "
                     f"(shape inference could not type them) and were left as they are, e.g. "
                     f"'{decisions.unknown_dtype[0]}'")
    if decisions.subgraph_nodes:
        notes.append(f"{decisions.subgraph_nodes} node(s) inside If/Loop/Scan bodies were left "
                     "FP32; values they read are cast to FP32")
    if len(c.flushed) > 10:
        notes.extend(c.flushed[:10])
        notes.append(f"... and {len(c.flushed) - 10} more constants with values flushed to 0")
    else:
        notes.extend(c.flushed)
    return WriterReport(
        opset_before=opset_of(original), opset_after=opset_of(written),
        ir_version_before=int(original.ir_version), ir_version_after=int(written.ir_version),
        keep_io_types=keep_io_types, casts_inserted=c.casts, casts_at_inputs=c.casts_at_inputs,
        casts_at_outputs=c.casts_at_outputs, cast_nodes_retargeted=tuple(c.retargeted),
        initializers_converted=c.initializers_converted,
        initializers_duplicated=c.initializers_duplicated,
        constants_converted=c.constants_converted, constants_duplicated=c.constants_duplicated,
        nodes_per_precision=dict(sorted(per_precision.items())),
        node_precisions=dict(sorted(names.items())), tf32_nodes=tuple(sorted(decisions.tf32)),
        fp32_pinned=tuple(sorted(
            n.name for n in decisions.typings if n.name and n.op_type in DATA_MOVEMENT_OPS
            and names.get(n.name) == "fp32" and plan.precision_of(n.name) is Precision.FP32)),
        kept_fp32=tuple(decisions.kept), subgraph_nodes=decisions.subgraph_nodes, io_dtypes=io,
        ort_validated=ort_ok, warnings=tuple(notes))


def written_opset(model: onnx.ModelProto, plan: PrecisionPlan, keep_io_types: bool = True
                  ) -> int:
    """The default-domain opset ``write_mixed_precision`` writes ``model`` at under ``plan``
    (raised when a low-precision node needs it: Conv takes bfloat16 from opset 22).

    Raises:
        PlanError: The plan names nodes that are not in the model.
        UnsupportedModelError: Shape inference fails.
    """
    plan.validate(model)
    decisions = decide(ir.serde.deserialize_model(model), plan, keep_io_types,
                       inferred_dtypes(model), MAX_WRITER_OPSET)
    return max(opset_of(model), decisions.needed_opset)


def write_mixed_precision(model: onnx.ModelProto, plan: PrecisionPlan,
                          keep_io_types: bool = True, validate: bool = True
                          ) -> tuple[onnx.ModelProto, WriterReport]:
    """Write ``model`` with the precision of every node explicit in its types.

    Args:
        model: FP32 ONNX model (never modified). Nodes are addressed by name; unnamed nodes
            take the plan's default (``graph.load.load_model`` names every node).
        plan: Node -> fp32 | fp16 | bf16 | tf32. TF32 nodes stay FP32 (engine setting).
        keep_io_types: Keep float graph inputs/outputs FP32 (Casts inside the model). When
            False, a float input whose consumers all read FP16 (or BF16) becomes FP16, and an
            output stored in FP16 is declared FP16.
        validate: Check the written model (``onnx.checker``, types, an ONNX Runtime CPU
            session). ``fix``'s search turns it off for the models it only evaluates (about
            a third of the writer's time on PP-OCRv4 rec; the evaluating engine loads the
            model anyway) and validates the model it writes.

    Returns:
        ``(written model, report)``. Graph input/output names and order, node and tensor names,
        doc strings, producer and metadata_props are those of ``model``; added Casts are named
        ``pd_cast/<fp16|fp32|bf16>/<tensor>``, converted constant copies ``<name>_fp16``. Use
        ``report.effective_plan()`` to emulate exactly what was written.

    Raises:
        PlanError: The plan names nodes that are not in the model.
        UnsupportedModelError: Shape inference fails, the needed opset conversion fails, or
            the written model fails ``onnx.checker`` (a writer bug).
        BackendError: ONNX Runtime CPU cannot load the written model (ORT's message included;
            missing BF16 kernels on CPU only give a warning).
    """
    return _write(model, plan, keep_io_types, validate, None)


class PlanWriter:
    """``write_mixed_precision`` for many plans of one model, sharing what does not depend on
    the plan: the model's inferred element types, and facts about its constants (whether they
    fit FP16/BF16, their converted copies; ``checks.ConstantMemo``). ``fix``'s search with a
    real engine writes a model per evaluation: a write of an FP16 plan took 126 ms instead of
    199 on PP-OCRv4 det and 144 instead of 291 on rec, whose weights take longer to check and
    convert; ``fix`` of det with the search on ONNX Runtime CPU, 59 evaluations: search
    18.8-19.8 s instead of 23.5-24.2 (``benchmarks/probes/writer_reuse.py``,
    ``writer_reuse_2026-11-28_cpu2.json``, 2 cores). The written models are byte for byte those
    of ``write_mixed_precision``.

    Args:
        model: The FP32 model. It must not change while the writer is used (what is shared is
            keyed by tensor name); the shared copies live as long as the writer (up to half the
            model's float weights again).
    """

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.memo = ConstantMemo()
        self._dtypes: dict[str, ir.DataType] | None = None

    def __call__(self, plan: PrecisionPlan, keep_io_types: bool = True, validate: bool = True
                 ) -> tuple[onnx.ModelProto, WriterReport]:
        """``write_mixed_precision(model, plan, keep_io_types, validate)``; the same errors."""
        return _write(self.model, plan, keep_io_types, validate, self)

    def dtypes(self) -> dict[str, ir.DataType]:
        """``validate.inferred_dtypes`` of the model, computed once."""
        if self._dtypes is None:
            self._dtypes = inferred_dtypes(self.model)
        return self._dtypes


def _write(model: onnx.ModelProto, plan: PrecisionPlan, keep_io_types: bool, validate: bool,
           shared: PlanWriter | None) -> tuple[onnx.ModelProto, WriterReport]:
    plan.validate(model)
    source = model
    ir_model = ir.serde.deserialize_model(source)
    dtypes = shared.dtypes() if shared is not None else inferred_dtypes(source)
    decisions = decide(ir_model, plan, keep_io_types, dtypes, MAX_WRITER_OPSET,
                       shared.memo if shared is not None else None)
    warnings: list[str] = []
    if decisions.needed_opset > opset_of(source):
        why = _why(decisions)
        source = convert_opset(model, decisions.needed_opset, why)
        plan.validate(source)
        warnings.append(f"opset raised {opset_of(model)} -> {opset_of(source)} with "
                        f"onnx.version_converter: {why}")
        ir_model = ir.serde.deserialize_model(source)
        decisions = decide(ir_model, plan, keep_io_types, inferred_dtypes(source),
                           opset_of(source))
    result = WritePrecisionPass(decisions, keep_io_types)(ir_model)
    assert isinstance(result, WritePassResult)
    written = ir.serde.serialize_model(ir_model)
    _release_weights(ir_model, decisions)
    _keep_value_info(written, {vi.name for vi in source.graph.value_info})
    written.ir_version = max(written.ir_version, min_ir_version(opset_of(written)))
    meant = [(v.name, d) for v, d in decisions.storage.items() if v.name and d != FLOAT]
    ort_ok, notes = check_written(written, model, meant) if validate else (False, [])
    warnings.extend(notes)
    return written, _report(model, written, decisions, result, keep_io_types, ort_ok, warnings,
                            plan)

