"""Which inputs and outputs of an ONNX node must share a float type, read from the op schema.

The ONNX operator schemas (``onnx.defs``) bind every input/output to a type parameter (``T``,
``T1``...) or to a fixed type (``tensor(float)``). Values bound to the same parameter must have the
same element type, so they change precision together: Clip's ``min``/``max`` go with its input
(``T``), Pad's ``constant_value`` with its data, Where's ``X``/``Y`` together. Values of another
parameter or of a fixed type are independent: Resize ``scales`` is ``tensor(float)`` in every opset
and stays float32; ``roi`` is ``T2``; BatchNormalization-15 has ``scale``/``B`` as ``T1`` and
``mean``/``var`` as ``T2``; LayerNormalization's ``Mean``/``InvStdDev`` are ``U`` (set by
``stash_type``). A parameter's allowed types say whether float16/bfloat16 are legal at the
model's opset (e.g. Conv accepts bfloat16 only from opset 22, CumSum float16 from 14).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import onnx
import onnx_ir as ir
from onnx import defs
from onnx.inliner import inline_local_functions

TYPE_STRINGS = {
    ir.DataType.FLOAT: "tensor(float)",
    ir.DataType.FLOAT16: "tensor(float16)",
    ir.DataType.BFLOAT16: "tensor(bfloat16)",
}


@dataclass(frozen=True)
class TypeGroup:
    """Inputs and outputs of one node bound to the same type parameter.

    Attributes:
        param: The parameter name (``T``, ``T1``...).
        inputs: Indices of the node's present inputs bound to it.
        outputs: Indices of the node's present outputs bound to it.
        allowed: Type strings the parameter accepts at the node's opset (``tensor(float16)``...).
    """

    param: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    allowed: frozenset[str]

    def allows(self, dtype: ir.DataType) -> bool:
        """True when the parameter accepts tensors of ``dtype``."""
        return TYPE_STRINGS.get(dtype, "") in self.allowed


def domain_opset(model_opsets: dict[str, int], domain: str) -> int | None:
    """The opset version the model imports for ``domain`` (``""`` and ``ai.onnx`` are one)."""
    if domain in ("", "ai.onnx"):
        return model_opsets.get("", model_opsets.get("ai.onnx"))
    return model_opsets.get(domain)


@lru_cache(maxsize=4096)
def op_schema(op_type: str, domain: str, opset: int) -> defs.OpSchema | None:
    """The schema of ``op_type`` in force at ``opset``, or None when ONNX does not define it
    (custom domains such as ``com.microsoft``)."""
    try:
        return defs.get_schema(op_type, opset, "" if domain == "ai.onnx" else domain)
    except defs.SchemaError:
        return None


def _formal(params: list, index: int):
    """The formal parameter that actual position ``index`` binds to, or None when out of range."""
    if not params:
        return None
    if index < len(params):
        return params[index]
    last = params[-1]
    return last if last.option == defs.OpSchema.FormalParameterOption.Variadic else None


def type_groups(node: ir.Node, opset: int) -> tuple[TypeGroup, ...] | None:
    """Group the node's present inputs/outputs by the type parameter they are bound to.

    Args:
        node: A node of the main graph.
        opset: The opset of the node's domain imported by the model.

    Returns:
        One ``TypeGroup`` per type parameter that binds at least one present value (fixed types
        such as Resize's ``scales: tensor(float)`` form no group), or None when the node is
        opaque to this analysis: no ONNX schema (custom domain) or a heterogeneous variadic
        parameter (If/Loop/Scan/SequenceConstruct style), or more values than the schema has.
    """
    schema = op_schema(node.op_type, node.domain, opset)
    if schema is None:
        return None
    constraints = {c.type_param_str: frozenset(c.allowed_type_strs)
                   for c in schema.type_constraints}
    members: dict[str, tuple[list[int], list[int]]] = {}
    for side, values, params in ((0, node.inputs, list(schema.inputs)),
                                 (1, node.outputs, list(schema.outputs))):
        for index, value in enumerate(values):
            if value is None or (side == 1 and not value.name and not value.uses()):
                continue
            formal = _formal(params, index)
            if formal is None:
                return None
            if formal.option == defs.OpSchema.FormalParameterOption.Variadic and \
                    not formal.is_homogeneous:
                return None
            if formal.type_str in constraints:
                members.setdefault(formal.type_str, ([], []))[side].append(index)
    return tuple(TypeGroup(param, tuple(ins), tuple(outs), constraints[param])
                 for param, (ins, outs) in members.items())


@lru_cache(maxsize=1024)
def first_opset_allowing(op_type: str, domain: str, dtype: ir.DataType, start: int,
                         stop: int) -> int | None:
    """The smallest opset in ``[start, stop]`` at which some type parameter of ``op_type``
    accepts ``dtype`` (e.g. Conv + bfloat16 -> 22), or None.

    Used to decide how far to raise the opset; the node's exact groups are checked again on
    the converted model.
    """
    for version in range(start, stop + 1):
        schema = op_schema(op_type, domain, version)
        if schema is None:
            continue
        if any(TYPE_STRINGS[dtype] in c.allowed_type_strs for c in schema.type_constraints):
            return version
    return None


_BODY_DOMAIN = "pd.function_body"


def _body_rejects(op_type: str, dtype: ir.DataType, inputs: int, opset: int) -> bool | None:
    """Whether ONNX type inference rejects ``op_type``'s function body, inlined into a model
    of default-domain ``opset`` with every input in ``dtype``; None when it has no body (or
    one that cannot be built for these types)."""
    schema: Any = op_schema(op_type, "", opset)  # onnx's stubs lack its function-body API
    if schema is None or not (schema.has_function or schema.has_context_dependent_function):
        return None
    helper = onnx.helper
    attrs = [a.default_value for a in schema.attributes.values()
             if a.default_value.type != onnx.AttributeProto.UNDEFINED]
    names = [f"x{i}" for i in range(inputs)]
    types = [helper.make_tensor_type_proto(int(dtype), [2, 4] if i == 0 else [])
             for i in range(inputs)]
    try:
        if schema.has_context_dependent_function:
            node = helper.make_node(op_type, names, ["y"])
            node.attribute.extend(attrs)
            body = onnx.FunctionProto.FromString(schema.get_context_dependent_function(
                node.SerializeToString(), [t.SerializeToString() for t in types]))
        else:
            body = onnx.FunctionProto()
            body.CopyFrom(schema.function_body)
    except Exception:  # noqa: BLE001 - onnx raises various errors for bodies it cannot build
        return None
    body.domain, body.name = _BODY_DOMAIN, op_type
    del body.opset_import[:]
    body.opset_import.append(helper.make_opsetid("", opset))
    call = helper.make_node(op_type, names, ["y"], domain=_BODY_DOMAIN)
    call.attribute.extend(attrs)
    graph = helper.make_graph([call], "body", [helper.make_value_info(n, t)
                                               for n, t in zip(names, types)],
                              [onnx.ValueInfoProto(name="y")])
    model = helper.make_model(graph, functions=[body], ir_version=min_ir_version(opset),
                              opset_imports=[helper.make_opsetid("", opset),
                                             helper.make_opsetid(_BODY_DOMAIN, 1)])
    try:
        onnx.shape_inference.infer_shapes(inline_local_functions(model),
                                          check_type=True, strict_mode=True)
    except Exception as exc:  # noqa: BLE001 - only a rejected type counts
        return "unsupported type" in str(exc)
    return False


@lru_cache(maxsize=1024)
def function_body_opset(op_type: str, dtype: ir.DataType, inputs: int, start: int,
                        stop: int) -> int | None:
    """The smallest opset in ``[start, stop]`` at which ``op_type``'s ONNX function body takes
    ``dtype`` (``start`` when the op has no body or its body passes there), or None.

    A runtime without a kernel for a node may run the op's function body instead (ONNX Runtime
    does), with the model's opset: Clip's body (with ``min``/``max``) is Less + Where, and
    Where takes bfloat16 only from opset 16 (Where-9 does not), so a BF16 Clip written at
    opset 13-15 is valid ONNX that such a runtime rejects ("Type 'tensor(bfloat16)' of input
    parameter ... of operator (Where) ... is invalid", ONNX Runtime CPU 1.32). Judged by ONNX
    type inference on the body inlined with every input in ``dtype``.

    Args:
        op_type: A default-domain op type.
        dtype: The low-precision type written (FLOAT16, BFLOAT16).
        inputs: How many inputs the node has (Clip's body depends on it).
        start: The opset the writer would write at.
        stop: The highest opset the writer may raise to.
    """
    for version in range(start, stop + 1):
        if not _body_rejects(op_type, dtype, inputs, version):
            return version
    return None


def has_subgraph(node: ir.Node) -> bool:
    """True when the node carries graph attributes (If, Loop, Scan...)."""
    return any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
               for a in node.attributes.values())


def subgraph_nodes(node: ir.Node) -> list[ir.Node]:
    """Every node inside the node's graph attributes, recursively."""
    found: list[ir.Node] = []
    for attr in node.attributes.values():
        graphs = [attr.as_graph()] if attr.type == ir.AttributeType.GRAPH else (
            list(attr.as_graphs()) if attr.type == ir.AttributeType.GRAPHS else [])
        for graph in graphs:
            found.extend(graph.all_nodes())
    return found


def min_ir_version(opset: int) -> int:
    """The smallest IR version that may import default-domain ``opset``.

    Source: ``onnx.helper.VERSION_TABLE`` (release, IR version, ai.onnx opset, ...).
    """
    for _release, ir_version, ai_onnx, *_ in onnx.helper.VERSION_TABLE:
        if ai_onnx >= opset:
            return int(ir_version)
    return int(onnx.IR_VERSION)
