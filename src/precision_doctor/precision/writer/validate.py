"""Check a written model three ways: ``onnx.checker`` (full check, which includes strict shape and
type inference), the element types ONNX infers against the ones the writer meant, and an ONNX
Runtime CPU session.

ONNX Runtime CPU has FP16 kernels for many ops; for the others its graph transformer inserts its
own casts to FP32, so an FP16 model still loads. It has almost no BF16 kernels ("Could not find an
implementation for Conv(22)"): a BF16 model that fails only that way is reported, not rejected
(run it with the CUDA execution provider or TensorRT, or emulate it: ``precision.emulate_written``).
"""

from __future__ import annotations

import functools
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir

from precision_doctor.errors import BackendError, UnsupportedModelError
from precision_doctor.graph.external import has_external_data, is_external
from precision_doctor.graph.external_files import link_model
from precision_doctor.graph.load import PROTOBUF_LIMIT, ort_model_source

# A node ONNX Runtime's optimizer created: "... in node (<original>/<Name>Fusion/)".
_FUSED_NODE = re.compile(r"in node \([^)]*/(\w+Fusion)/")


# onnxruntime 1.32 CPU crashes the process (SIGSEGV) building a session at ORT_ENABLE_ALL for
# FP16 -> Transpose(perm [1, 0, 2]) -> Cast(to=float) -> MatMul, which the writer writes for an
# FP16 Transpose read by an FP32 MatMul: its MatmulTransposeFusion (measured 2026-11-28,
# tests/fuzz/test_regressions.py). Sessions of a model with that chain turn the fusion off.
CRASHING_FUSION = "MatmulTransposeFusion"


def crashing_fusions(model: onnx.ModelProto) -> list[str]:
    """The ONNX Runtime optimizers to turn off for ``model`` (``disabled_optimizers``):
    ``MatmulTransposeFusion`` where a Transpose feeds a MatMul through a ``Cast(to=float)``."""
    producers = {o: n for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
            continue
        for name in node.input:
            cast = producers.get(name)
            if cast is None or cast.op_type != "Cast" or not any(
                    a.name == "to" and a.i == onnx.TensorProto.FLOAT for a in cast.attribute):
                continue
            before = producers.get(cast.input[0]) if cast.input else None
            if before is not None and before.op_type == "Transpose":
                return [CRASHING_FUSION]
    return []


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def without_external_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose external initializers are typed graph inputs instead.

    onnx.checker refuses the in-memory form of external data (absolute locations, see
    ``graph.external``) and hard-linked data files ("potential hardlink attack"), and the bytes
    of the weights are not what it checks: names, types, shapes, graph structure and (full
    check) shape inference are all kept.
    """
    skeleton = onnx.ModelProto()
    skeleton.CopyFrom(model)
    graph = skeleton.graph
    inputs = {i.name for i in graph.input}
    kept = []
    for init in graph.initializer:
        if not is_external(init):
            kept.append(init)
        elif init.name not in inputs:
            graph.input.append(onnx.helper.make_tensor_value_info(
                init.name, init.data_type, list(init.dims)))
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return skeleton


def run_checker(model: onnx.ModelProto) -> None:
    """``onnx.checker.check_model(full_check=True)``; external weights are checked as typed
    inputs (``without_external_weights``); an in-memory model >= 2 GiB is checked from a file.

    Raises:
        onnx.checker.ValidationError / onnx.shape_inference.InferenceError: as the checker does.
    """
    if has_external_data(model):
        model = without_external_weights(model)
    if model.ByteSize() < PROTOBUF_LIMIT:
        onnx.checker.check_model(model, full_check=True)
        return
    with tempfile.TemporaryDirectory(prefix="precision-doctor-check-") as folder:
        path = Path(folder) / "model.onnx"
        onnx.save_model(model, str(path), save_as_external_data=True,
                        all_tensors_to_one_file=True, location="model.onnx.data")
        onnx.checker.check_model(str(path), full_check=True)


def inferred_dtypes(model: onnx.ModelProto, strict: bool = False) -> dict[str, ir.DataType]:
    """Tensor name -> element type after ONNX shape inference (annotations included), and for
    the outputs of ONNX Runtime's contrib ops, from ONNX Runtime's schema of the op.

    Models >= 2 GiB are inferred on a skeleton whose initializers are declared as typed graph
    inputs (element types do not depend on weight values).

    Raises:
        UnsupportedModelError: Inference fails (``strict``) or cannot run at all.
    """
    source = model
    if model.ByteSize() >= PROTOBUF_LIMIT:
        source = onnx.ModelProto()
        source.CopyFrom(model)
        for init in source.graph.initializer:
            source.graph.input.append(onnx.helper.make_tensor_value_info(
                init.name, init.data_type, list(init.dims)))
        del source.graph.initializer[:]
    types = _inferred(source, strict)
    for _ in range(_CONTRIB_ROUNDS):  # each round types one more link of a chain of such ops
        added = _contrib_types(source, types)
        if not added:
            break
        if source is model:
            source = onnx.ModelProto()
            source.CopyFrom(model)
        source.graph.value_info.extend(onnx.helper.make_tensor_value_info(name, int(dtype), None)
                                       for name, dtype in added.items())
        types = _inferred(source, strict)
    return types


def _inferred(source: onnx.ModelProto, strict: bool) -> dict[str, ir.DataType]:
    try:
        inferred = onnx.shape_inference.infer_shapes(source, strict_mode=strict)
    except Exception as exc:
        raise UnsupportedModelError(
            f"ONNX shape inference failed ({_first_line(exc)}); the writer needs every tensor's "
            "element type. Fix the model (onnx.checker) or export it with value_info.") from exc
    types: dict[str, ir.DataType] = {}
    graph = inferred.graph
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = ir.DataType(vi.type.tensor_type.elem_type)
    for init in graph.initializer:
        types[init.name] = ir.DataType(init.data_type)
    return types


_CONTRIB_ROUNDS = 8
_TYPE_STRINGS = {f"tensor({name})": dtype for name, dtype in (
    ("float", ir.DataType.FLOAT), ("float16", ir.DataType.FLOAT16),
    ("bfloat16", ir.DataType.BFLOAT16), ("double", ir.DataType.DOUBLE),
    ("int8", ir.DataType.INT8), ("uint8", ir.DataType.UINT8), ("int32", ir.DataType.INT32),
    ("int64", ir.DataType.INT64), ("bool", ir.DataType.BOOL))}


@functools.cache
def _ort_schemas() -> dict[tuple[str, str], Any]:
    """ONNX Runtime's operator schemas by (domain, op type), the latest version of each (its
    contrib ops: ``com.microsoft`` Gelu, SkipLayerNormalization, ...); empty without it."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_state
    except ImportError:  # pragma: no cover - onnxruntime is a dependency
        return {}
    schemas: dict[tuple[str, str], Any] = {}
    for schema in ort_state.get_all_operator_schema():
        key = (schema.domain, schema.name)
        if key not in schemas or schema.since_version > schemas[key].since_version:
            schemas[key] = schema
    return schemas


def _contrib_types(model: onnx.ModelProto, types: dict[str, ir.DataType]
                   ) -> dict[str, ir.DataType]:
    """Element types ONNX inference leaves out: outputs of ops of other domains whose schema
    only ONNX Runtime has (``com.microsoft``), read from that schema: an output bound to the
    type parameter of a typed input (Gelu's ``Y`` is ``X``'s ``T``), or to a parameter that
    allows one type only. Without them a float tensor such an op writes would be read by an
    FP16 node without a Cast (found by tests/fuzz)."""
    added: dict[str, ir.DataType] = {}
    for node in model.graph.node:
        if node.domain in ("", "ai.onnx") or all(not o or o in types for o in node.output):
            continue
        schema = _ort_schemas().get((node.domain, node.op_type))
        if schema is None:
            continue
        params: dict[str, ir.DataType] = {}
        for name, formal in zip(node.input, schema.inputs):
            if name in types:
                params.setdefault(formal.typeStr, types[name])
        for constraint in schema.type_constraints:
            allowed = list(constraint.allowed_type_strs)
            if len(allowed) == 1 and allowed[0] in _TYPE_STRINGS:
                params.setdefault(constraint.type_param_str, _TYPE_STRINGS[allowed[0]])
        for name, formal in zip(node.output, schema.outputs):
            dtype = params.get(formal.typeStr) or _TYPE_STRINGS.get(formal.typeStr)
            if name and name not in types and dtype is not None:
                added[name] = dtype
    return added


def check_written(written: onnx.ModelProto, original: onnx.ModelProto,
                  meant: Iterable[tuple[str, ir.DataType]]) -> tuple[bool, list[str]]:
    """Validate the written model.

    Args:
        written: The model ``write_mixed_precision`` produced.
        original: The input model (checked too when the written one fails, to tell a model
            that was already invalid from a writer bug).
        meant: (tensor name, element type the writer meant it to have) pairs.

    Returns:
        ``(ort_validated, warnings)``. ONNX Runtime opens a model with external data from its
        files (``graph.external_files.link_model``), never from serialized bytes.

    Raises:
        UnsupportedModelError: The written model fails ``onnx.checker`` while the input passes.
        BackendError: ONNX Runtime CPU cannot create a session for the written model (ORT's
            message included), except for missing BF16 kernels (a warning then).
    """
    if not has_external_data(written) and written.ByteSize() < PROTOBUF_LIMIT:
        return _check(written, written, original, list(meant))
    # External data: check and load the files, as a user will (data files hard-linked).
    with tempfile.TemporaryDirectory(prefix="precision-doctor-check-") as folder:
        return _check(written, link_model(written, Path(folder)), original, list(meant))


def _check(written: onnx.ModelProto, source: onnx.ModelProto | Path,
           original: onnx.ModelProto, meant: list[tuple[str, ir.DataType]]
           ) -> tuple[bool, list[str]]:
    """``check_written``; ONNX Runtime opens ``source``: the written proto or its saved path."""
    warnings: list[str] = []
    try:
        run_checker(written)
    except Exception as exc:  # noqa: BLE001
        try:
            run_checker(original)
        except Exception as original_exc:  # noqa: BLE001
            warnings.append(f"the input model already fails onnx.checker "
                            f"({_first_line(original_exc)}); the written model was not "
                            "validated by it")
        else:
            raise UnsupportedModelError(
                f"the written mixed-precision model fails onnx.checker ({_first_line(exc)}) "
                "although the input passes: a precision-doctor writer bug; please report it "
                "with the model and plan") from exc
    types = inferred_dtypes(written)
    wrong = [f"{name} ({types[name].name.lower()}, meant {dtype.name.lower()})"
             for name, dtype in meant if name in types and types[name] != dtype]
    if wrong:
        warnings.append(f"{len(wrong)} tensor(s) have another element type than the writer "
                        f"meant (the report's node precisions may be off there): "
                        f"{', '.join(wrong[:5])}")
    disabled = crashing_fusions(written)
    if disabled:
        warnings.append(
            "onnxruntime 1.32 on the CPU crashes (SIGSEGV) creating a session for this model at "
            "the default optimization level: a Transpose reaches a MatMul through a Cast to "
            f"float, which its {disabled[0]} mishandles. Load it with "
            f"InferenceSession(..., disabled_optimizers={disabled!r}); precision-doctor's "
            "runners do so")
    error = ort_cpu_session_error(source, disabled=disabled)
    if error is None:
        return True, warnings
    if optimizer_defect(error):
        warnings.append(optimizer_note(error))
        retry = ort_cpu_session_error(source, False, disabled)
        if retry is None:
            return True, warnings
        error = retry  # e.g. a BF16 model: no kernel, whatever the optimizer does
    # BF16 anywhere in the written model, boundary Casts and converted weights included (a BF16
    # QuantizeLinear reads only those; ONNX Runtime CPU has no kernel for it, found by tests/fuzz)
    has_bf16 = ir.DataType.BFLOAT16 in types.values() or any(
        d == ir.DataType.BFLOAT16 for _, d in meant)
    if has_bf16 and "NOT_IMPLEMENTED" in error:
        warnings.append("ONNX Runtime CPU has no BF16 kernel for some op "
                        f"({error.splitlines()[0].split('NOT_IMPLEMENTED : ')[-1]}): it passed "
                        "onnx.checker but cannot run on ONNX Runtime CPU. Run it with the CUDA "
                        "execution provider or TensorRT; on the CPU, precision-doctor emulates "
                        "it exactly as written (fix's verification, --runner emulate-written)")
        return False, warnings
    raise BackendError(f"ONNX Runtime CPU cannot load the written model: ort-cpu: ONNX Runtime "
                       f"cannot create a session: {error}", runner="ort-cpu")


def optimizer_defect(message: str) -> bool:
    """Whether an ONNX Runtime session error comes from a node its own graph optimizer made
    (named ``.../<Name>Fusion/``), not from the model.

    Measured with onnxruntime 1.32 (``tests/fuzz/test_regressions.py``): on the CPU, a
    decomposed LayerNorm (ReduceMean, Sub, Pow, Sqrt, Div) computed in FP16 downstream of a
    ``Cast`` to FP16 is fused into a ``LayerNormalization`` with float and float16 inputs ("Type
    parameter (T) of Optype (LayerNormalization) bound to different types ... in node
    (mul/LayerNormFusion/)"); at ``ORT_DISABLE_ALL`` the same model loads and runs, and
    ``disabled_optimizers=["LayerNormFusion"]`` does not help.
    """
    return _FUSED_NODE.search(message) is not None


def optimizer_note(message: str) -> str:
    """The warning for a model that loads only with ONNX Runtime's graph optimizations off."""
    fusion = _FUSED_NODE.search(message)
    name = fusion.group(1) if fusion else "a graph optimizer"
    return (f"ONNX Runtime CPU's {name} breaks this model ({message.splitlines()[0][:200]}): "
            "an ONNX Runtime defect (the model passes onnx.checker and loads with graph "
            "optimizations off). Load it with SessionOptions.graph_optimization_level = "
            "ORT_DISABLE_ALL on the CPU; precision-doctor's runners do so for it")


def ort_cpu_session_error(model: onnx.ModelProto | Path, optimize: bool = True,
                          disabled: Iterable[str] = ()) -> str | None:
    """Create an ONNX Runtime CPU session for ``model`` or the saved model at that path (and
    drop it); a proto with external data is opened from a folder of hard links to its files.

    Uses ``onnxruntime`` directly rather than a runner: the writer sits below the runners layer.

    Args:
        model: The model, or the path of a saved one.
        optimize: ONNX Runtime's default graph optimizations (False: ``ORT_DISABLE_ALL``).
        disabled: ONNX Runtime optimizers to turn off (``crashing_fusions``).

    Returns:
        None when the session builds, else ONNX Runtime's message.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = False
    with tempfile.TemporaryDirectory(prefix="precision-doctor-ort-") as tmp:
        try:
            source = str(model) if isinstance(model, Path) else ort_model_source(model, tmp)
            ort.InferenceSession(source, sess_options=options,
                                 providers=["CPUExecutionProvider"],
                                 disabled_optimizers=list(disabled))
        except Exception as exc:  # noqa: BLE001 - ORT raises several unrelated types
            return str(exc).strip() or type(exc).__name__
    return None
