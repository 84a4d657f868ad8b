"""The probes of ``benchmarks/ort_cuda_bf16.py`` (step 1, here on the CPU): one small model per
(op type, schema version in force at opsets 13..22), built from ONNX's own node test cases, in
BF16 (FP16) as the strongly typed writer writes a node, plus its FP32 original; the module
docstring of ``ort_cuda_bf16.py`` says how they are chosen and run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

OPSETS = range(13, 23)  # Cast to bfloat16 needs 13; the writer never goes above 22
DTYPES = {"bf16": 16, "fp16": 10}  # onnx.TensorProto.BFLOAT16, FLOAT16
CASES_PER_OP = {"bf16": 6, "fp16": 3}  # test cases per (op, version): most inputs first


def _allowed(schema, index: int, params) -> set[str]:
    """Type strings the formal parameter of actual input/output ``index`` accepts."""
    if not params:
        return set()
    formal = params[min(index, len(params) - 1)]
    constraints = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    return constraints.get(formal.type_str, {formal.type_str})


def _at_opset(case_model, feeds: dict, opset: int):
    """``case_model`` declared at ``opset`` when valid there, else converted down with
    ``onnx.version_converter`` (its non-float inputs made initializers first: Reduce* axes are
    attributes before opset 18); None when neither works."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper, version_converter

    from precision_doctor.precision.writer.schema import min_ir_version

    model = onnx.ModelProto()
    model.CopyFrom(case_model)
    own = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("", opset))
    model.ir_version = min_ir_version(opset)
    try:
        onnx.checker.check_model(model, full_check=True)
        return model
    except Exception:  # noqa: BLE001 - try the converter
        pass
    model.CopyFrom(case_model)
    graph = model.graph
    for vi in list(graph.input):
        if vi.type.tensor_type.elem_type != TensorProto.FLOAT and \
                isinstance(feeds.get(vi.name), np.ndarray):
            graph.initializer.append(numpy_helper.from_array(feeds[vi.name], vi.name))
            graph.input.remove(vi)
    try:
        converted = version_converter.convert_version(model, opset)
        converted.ir_version = min_ir_version(opset)
        onnx.checker.check_model(converted, full_check=True)
    except Exception:  # noqa: BLE001 - not expressible at this opset
        return None
    return converted if own != opset else None


_NUMERIC = {1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 16}  # float, ints, fp16, double, bf16
_NUMPY_TYPES = _NUMERIC - {16} | {9}  # what ONNX Runtime returns as numpy arrays (bool too)


def _typed_model(model, dtype: int):
    """``model`` (one node) with its numeric tensors in ``dtype`` where the schema allows it:
    graph inputs and outputs keep their types, Casts (through FP32) around the node,
    initializers converted. Returns ``(model, changed)``."""
    import ml_dtypes
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.ModelProto().__class__.FromString(model.SerializeToString())
    graph, node = model.graph, model.graph.node[0]
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    schema = onnx.defs.get_schema(node.op_type, opset)
    want = {TensorProto.BFLOAT16: "tensor(bfloat16)", TensorProto.FLOAT16: "tensor(float16)",
            TensorProto.FLOAT: "tensor(float)"}[dtype]
    numpy = {TensorProto.BFLOAT16: ml_dtypes.bfloat16, TensorProto.FLOAT16: np.float16,
             TensorProto.FLOAT: np.float32}[dtype]
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*graph.input, *graph.output]
             if vi.type.HasField("tensor_type")}
    inits = {t.name: t for t in graph.initializer}
    types.update({n: t.data_type for n, t in inits.items()})
    before, after, changed = [], [], False

    def retyped(name: str, index: int, params) -> bool:
        """Whether tensor ``name`` (formal ``params[index]``) goes to ``dtype``."""
        kind = types.get(name)
        return bool(name) and kind in _NUMERIC and kind != dtype and \
            want in _allowed(schema, index, params)

    for i, x in enumerate(node.input):
        kind = types.get(x)
        if not retyped(x, i, schema.inputs):
            continue
        changed = True
        if x in inits:
            array = numpy_helper.to_array(inits[x]).astype(np.float32).astype(numpy)
            raw = array.view(np.uint16) if dtype != TensorProto.FLOAT else array
            inits[x].CopyFrom(helper.make_tensor(x, dtype, array.shape, raw.tobytes(),
                                                 raw=True))
            continue
        source = x
        if kind != TensorProto.FLOAT and dtype != TensorProto.FLOAT:
            before.append(helper.make_node("Cast", [x], [f"{x}__f32"], to=TensorProto.FLOAT))
            source = f"{x}__f32"
        before.append(helper.make_node("Cast", [source], [f"{x}__low"], to=dtype))
        node.input[i] = f"{x}__low"
    for o, y in enumerate(node.output):
        kind = types.get(y)
        if not retyped(y, o, schema.outputs):
            continue
        changed = True
        node.output[o] = f"{y}__low"
        if kind != TensorProto.FLOAT and dtype != TensorProto.FLOAT:
            after.append(helper.make_node("Cast", [f"{y}__low"], [f"{y}__f32"],
                                          to=TensorProto.FLOAT))
            after.append(helper.make_node("Cast", [f"{y}__f32"], [y], to=kind))
        else:
            after.append(helper.make_node("Cast", [f"{y}__low"], [y], to=kind))
    nodes = [*before, node, *after]
    for k, n in enumerate(nodes):
        n.name = n.name or f"{n.op_type.lower()}_{k}"
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]
    return model, changed


_NUMPY = {np.dtype(t) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8,
                                 np.uint16, np.uint32, np.uint64, np.float16, np.float32,
                                 np.float64)}


def _feeds(case) -> dict[str, np.ndarray]:
    """The test case's first inputs that ONNX Runtime takes from numpy (bool, int, float)."""
    from onnx import TensorProto, numpy_helper

    feeds = {}
    for vi, value in zip(case.model.graph.input, case.data_sets[0][0]):
        if isinstance(value, TensorProto):
            value = numpy_helper.to_array(value)
        if isinstance(value, (np.ndarray, np.generic)) and np.asarray(value).dtype in _NUMPY:
            feeds[vi.name] = np.asarray(value)
    return feeds


def _schema_allows(op: str, opset: int, label: str) -> bool:
    import onnx

    want = {"bf16": "tensor(bfloat16)", "fp16": "tensor(float16)"}[label]
    schema = onnx.defs.get_schema(op, opset)
    return any(want in c.allowed_type_strs for c in schema.type_constraints)


def probes(out: Path) -> None:
    """Write one probe per (op, schema version, precision) into ``out`` with ``index.json``."""
    import warnings

    import onnx
    from onnx.backend.test.case import node as node_cases

    out.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [c for c in node_cases.collect_testcases(None)
                 if c.kind == "node" and len(c.model.graph.node) == 1
                 and c.model.graph.node[0].domain in ("", "ai.onnx") and c.data_sets]
    by_op: dict[str, list] = {}
    for case in sorted(cases, key=lambda c: (-len([i for i in c.model.graph.node[0].input if i]),
                                             c.name)):
        by_op.setdefault(case.model.graph.node[0].op_type, []).append(case)  # Clip min/max
    index, skipped = [], {}
    for op, op_cases in sorted(by_op.items()):
        versions: dict[int, int] = {}
        for opset in OPSETS:
            try:
                since = onnx.defs.get_schema(op, opset).since_version
            except onnx.defs.SchemaError:
                continue
            versions[since] = opset  # the last opset it is in force at (Clip-13: 22)
        for since, opset in versions.items():
            for label, dtype in DTYPES.items():
                done = 0
                for case in op_cases:
                    if done == CASES_PER_OP[label]:
                        break
                    feeds = _feeds(case)
                    if len(feeds) < len(case.model.graph.input):
                        continue  # strings, sequences, bfloat16 feeds: not fed from numpy
                    base = _at_opset(case.model, feeds, opset)
                    if base is None:
                        continue
                    model, changed = _typed_model(base, dtype)
                    if not changed or any(o.type.tensor_type.elem_type not in _NUMPY_TYPES
                                          for o in model.graph.output):
                        continue  # bfloat16/float8 graph outputs: numpy cannot take them
                    fp32, _ = _typed_model(base, onnx.TensorProto.FLOAT)
                    try:
                        onnx.checker.check_model(model, full_check=True)
                        onnx.checker.check_model(fp32, full_check=True)
                    except Exception:  # noqa: BLE001 - not valid with these types: next case
                        continue
                    stem = f"{op}-{since}-{label}-{done}"
                    onnx.save(model, out / f"{stem}.onnx")
                    onnx.save(fp32, out / f"{stem}-fp32.onnx")
                    names = {vi.name for vi in model.graph.input}
                    np.savez(out / f"{stem}.npz", **{k: v for k, v in feeds.items()
                                                     if k in names})
                    index.append({"op": op, "since": since, "opset": opset, "dtype": label,
                                  "case": case.name, "file": stem})
                    done += 1
                if not done and _schema_allows(op, opset, label):
                    skipped[f"{op}-{since}-{label}"] = "no test case valid with these types"
    (out / "index.json").write_text(json.dumps({"probes": index, "skipped": skipped},
                                               indent=1))
    print(f"{len(index)} probes, {len(skipped)} (op, version, precision) without one")
