"""Which ONNX op types ONNX Runtime CUDA has no BF16 (or FP16) kernel for, measured op by op.

The source of ``precision_doctor.runners.kernels.registry.CUDA_NO_BF16``. ONNX Runtime's kernel
registry (``get_all_opkernel_def``) cannot be read in the GPU machine's onnxruntime-gpu install
(it segfaults without the TensorRT EP library), so every op is tried instead:

1. Here (CPU, once): ``probes`` builds one small model per (op type, schema version in force
   at opsets 13..22, the opsets the strongly typed writer emits) from ONNX's own node test
   cases (``onnx.backend.test.case.node``: a valid node with real inputs): the op's float
   inputs and outputs that its schema lets be bfloat16 (float16) are made so, with FP32 graph
   inputs and outputs and Casts around the node, exactly how the writer writes a BF16 node
   (initializers converted); plus the FP32 original. Up to six test cases per op and version
   for BF16 (those with the most inputs first: Clip with ``min`` and ``max``), three for FP16; a
   test case that is not valid at the older opset (``onnx.checker`` full check, or
   ``onnx.version_converter`` down to it) is passed over for the next one of that op.

       python3 benchmarks/ort_cuda_bf16.py probes --out .gpu/probes

2. There (GPU machine, after the onnxruntime-gpu install of ``benchmarks/gpu_setup.sh``)::

       export PYTHONPATH=/tmp/site:$PWD/src
       python3 benchmarks/ort_cuda_bf16.py run .gpu/probes --out $OUT/ort_cuda_kernels.json

   For each probe: its FP32 model in an ONNX Runtime session with the CUDA execution provider
   alone and ``session.disable_cpu_ep_fallback=1`` (it fails when some node would run on the
   CPU) and one run on the test inputs; a case CUDA does not take even in FP32 (a 1-D or
   ``ceil_mode`` MaxPool) judges nothing. Then the BF16 (FP16) model the same way, and when
   it fails, with CUDA and CPU (whether it loads at all: ONNX Runtime places a node without a
   CUDA kernel on the CPU when the CPU has one; BF16 only for data movement). The summary
   lists, per precision, the op types and schema versions without a CUDA kernel: some case
   whose FP32 model runs on CUDA alone does not in BF16 (FP16).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

OPSETS = range(13, 23)  # Cast to bfloat16 needs 13; the writer never goes above 22
DTYPES = {"bf16": 16, "fp16": 10}  # onnx.TensorProto.BFLOAT16, FLOAT16
CASES_PER_OP = {"bf16": 6, "fp16": 3}  # test cases per (op, version): most inputs first
WORKERS = 8  # processes creating sessions at once on the GPU machine (16 cores)
NO_FALLBACK = "session.disable_cpu_ep_fallback"


# -- here: probes ----------------------------------------------------------------------------

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


# -- there: run ------------------------------------------------------------------------------

def _session(path: Path, providers: list, fallback: bool):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not fallback and providers != ["CPUExecutionProvider"]:
        options.add_session_config_entry(NO_FALLBACK, "1")
    return ort.InferenceSession(str(path), options, providers=providers)


def _try(path: Path, feeds: dict, providers: list, fallback: bool) -> str:
    return _outputs(path, feeds, providers, fallback)[0]


def _outputs(path: Path, feeds: dict, providers: list, fallback: bool
             ) -> tuple[str, list | None]:
    """``("ok", outputs)``, or ``("load: <why>" | "run: <why>", None)``."""
    try:
        session = _session(path, providers, fallback)
    except Exception as exc:  # noqa: BLE001 - the message is the measurement
        return "load: " + str(exc).strip().splitlines()[0][:300], None
    try:
        names = {i.name for i in session.get_inputs()}
        outs = session.run(None, {k: v for k, v in feeds.items() if k in names})
    except Exception as exc:  # noqa: BLE001
        return "run: " + str(exc).strip().splitlines()[0][:300], None
    return "ok", outs


def _rounded_inputs(path: Path) -> set[str]:
    """Graph inputs the low-precision probe casts to BF16/FP16 (directly or through FP32)."""
    import onnx

    graph = onnx.load(str(path)).graph
    inputs = {i.name for i in graph.input}
    return {n.input[0].removesuffix("__f32") for n in graph.node
            if n.op_type == "Cast" and n.output[0].endswith("__low")} & inputs


def _accuracy(low: list, exact: list) -> dict:
    """How far the low-precision kernel's outputs are from FP32 arithmetic on the same rounded
    inputs, rounded once (the engine model of ``precision.emulate``): in BF16 ulps."""
    import ml_dtypes

    worst, over = 0.0, 0
    count = 0
    for a, b in zip(low, exact):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype.kind != "f" or b.dtype.kind != "f" or a.shape != b.shape:
            continue
        b = b.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
        ok = np.isfinite(a) & np.isfinite(b)
        if not ok.any():
            continue
        spacing = np.spacing(np.maximum(np.abs(b[ok]), np.float32(2.0 ** -126))) * 2.0 ** 16
        ulps = np.abs(a[ok].astype(np.float64) - b[ok]) / spacing
        worst = max(worst, float(ulps.max()))
        over += int((ulps > 1).sum())
        count += int(ok.sum())
    return {"max_ulp": round(worst, 2), "share_over_1ulp": round(over / count, 4) if count
            else None}


RANDOM_OPS = frozenset({"Bernoulli", "Dropout", "Multinomial", "RandomNormal",
                        "RandomNormalLike", "RandomUniform", "RandomUniformLike"})


def summarize(rows: list[dict]) -> tuple[dict, dict, dict]:
    """``(gaps, unloadable, inexact)`` from the probe rows.

    gaps: precision -> op -> schema versions where a low-precision probe does not *load*
    ("load: ...") although its FP32 model does: with CUDA alone (no CUDA kernel), or only with
    the CPU fallback while the low one loads nowhere (no kernel at all: MaxPool-22). A probe
    that loads but fails to run (an attribute a kernel does not support, such as Resize's
    ``tf_crop_and_resize`` in FP16) is no kernel gap. unloadable: the second kind alone.
    inexact: ``op-version`` -> the largest BF16 ulp distance of a BF16 kernel's outputs from
    FP32 arithmetic on the same rounded inputs rounded once, where above 1 (random ops left
    out)."""
    gaps: dict[str, dict[str, list[int]]] = {}
    unloadable: dict[str, dict[str, list[int]]] = {}
    inexact: dict[str, float] = {}
    for row in rows:
        low = row.get("cuda", "")
        if low.startswith("load:"):
            if row["fp32_cuda"] == "ok":
                _add(gaps, row)
            elif row.get("fp32_with_cpu") == "ok" and row.get("with_cpu", "").startswith("load:"):
                _add(gaps, row)
                _add(unloadable, row)
        accuracy = row.get("accuracy")
        if accuracy and accuracy["max_ulp"] > 1 and row["op"] not in RANDOM_OPS:
            key = f"{row['op']}-{row['since']}"
            inexact[key] = max(inexact.get(key, 0.0), accuracy["max_ulp"])
    for table in (gaps, unloadable):
        for ops in table.values():
            for versions in ops.values():
                versions.sort()
    return gaps, unloadable, dict(sorted(inexact.items()))


def _add(table: dict, row: dict) -> None:
    versions = table.setdefault(row["dtype"], {}).setdefault(row["op"], [])
    if row["since"] not in versions:
        versions.append(row["since"])


def _init_worker() -> None:
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()


def _probe(folder: Path, probe: dict, cuda: list, both: list) -> dict:
    """One probe: its FP32 model on CUDA alone (a case CUDA does not take even in FP32, such as
    a MaxPool at opset 22, is tried with the CPU fallback), then the low-precision one; when
    that fails, with CPU. A BF16 probe that runs is compared with its FP32 model run on the
    rounded inputs, output rounded once (``_accuracy``)."""
    import ml_dtypes

    stem = probe["file"]
    feeds = dict(np.load(folder / f"{stem}.npz"))
    row = dict(probe, fp32_cuda=_try(folder / f"{stem}-fp32.onnx", feeds, cuda, False))
    if row["fp32_cuda"] != "ok":
        row["fp32_with_cpu"] = _try(folder / f"{stem}-fp32.onnx", feeds, both, True)
    row["cuda"], low = _outputs(folder / f"{stem}.onnx", feeds, cuda, False)
    if row["cuda"] != "ok":
        row["with_cpu"] = _try(folder / f"{stem}.onnx", feeds, both, True)
    elif probe["dtype"] == "bf16" and row["fp32_cuda"] == "ok":
        rounded = {k: (v.astype(ml_dtypes.bfloat16).astype(v.dtype)
                       if k in _rounded_inputs(folder / f"{stem}.onnx") and v.dtype.kind == "f"
                       else v) for k, v in feeds.items()}
        status, exact = _outputs(folder / f"{stem}-fp32.onnx", rounded, cuda, False)
        if status == "ok" and low is not None and exact is not None:
            row["accuracy"] = _accuracy(low, exact)
    return row


def run(folder: Path, out: Path, provider: str = "cuda") -> None:
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    cuda: list = [("CUDAExecutionProvider", {"use_tf32": "0"})]
    if provider == "cpu":  # a dry run of this script on a machine without a GPU
        cuda = ["CPUExecutionProvider"]
    both = [*cuda, "CPUExecutionProvider"]
    meta = json.loads((folder / "index.json").read_text())
    t0 = time.perf_counter()
    jobs = [(folder, probe, cuda, both) for probe in meta["probes"]]
    if provider == "cpu":
        rows = [_probe(*job) for job in jobs]
    else:  # session creation is mostly CPU work: several processes share the GPU
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        try:
            with ProcessPoolExecutor(WORKERS, mp_context=multiprocessing.get_context("spawn"),
                                     initializer=_init_worker) as pool:
                rows = list(pool.map(_probe, *zip(*jobs), chunksize=8))
        except Exception as exc:  # noqa: BLE001 - a worker died: one process, in order
            print(f"worker pool failed ({exc!r}); probing in this process", flush=True)
            rows = [_probe(*job) for job in jobs]
    gaps, unloadable, inexact = summarize(rows)
    result = {"onnxruntime": ort.__version__, "providers": ort.get_available_providers(),
              "seconds": round(time.perf_counter() - t0, 1), "no_cuda_kernel": gaps,
              "no_kernel_at_all": unloadable, "bf16_over_1ulp": inexact,
              "skipped": meta["skipped"], "rows": rows}
    out.write_text(json.dumps(result, indent=1))
    for label, ops in sorted(gaps.items()):
        print(label, "no CUDA kernel:", json.dumps(ops))
    print("bf16 over 1 ulp:", json.dumps(inexact))
    print(f"{len(rows)} probes in {result['seconds']} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("summary", help="here: the tables of a run's JSON, again")
    t.add_argument("json", type=Path)
    p = sub.add_parser("probes", help="here: one model per op type and schema version")
    p.add_argument("--out", type=Path, default=REPO / ".gpu/probes")
    r = sub.add_parser("run", help="there: which probes ONNX Runtime CUDA runs")
    r.add_argument("folder", type=Path)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--provider", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a dry run without a GPU (CPU alone, no fallback to disable)")
    args = ap.parse_args()
    if args.cmd == "summary":
        data = json.loads(args.json.read_text())
        gaps, unloadable, inexact = summarize(data["rows"])
        print(json.dumps({"onnxruntime": data["onnxruntime"], "no_cuda_kernel": gaps,
                          "no_kernel_at_all": unloadable, "bf16_over_1ulp": inexact},
                         indent=1))
    elif args.cmd == "probes":
        probes(args.out)
    else:
        run(args.folder, args.out, args.provider)


if __name__ == "__main__":
    main()
