"""Which nodes of a model an ONNX Runtime execution provider has no BF16 kernel for.

ONNX Runtime CPU has BF16 kernels for data movement, Cast and LayerNormalization, but none for
Conv, MatMul, Gemm, Add, Mul, Relu, Softmax ...: a session for a BF16 model fails with
"NOT_IMPLEMENTED: Could not find an implementation for Conv(22)", naming only the first node.
``missing_kernels`` reads ONNX Runtime's kernel registry up front (``get_all_opkernel_def`` of
``onnxruntime.capi._pybind_state``, the table ONNX Runtime's own operator-coverage tooling
prints) and lists every op type that lacks one, so a message can name all of them. That
registry is not a public API: when it is absent, ``missing_kernels`` returns None and callers
rely on the session error (``is_missing_kernel``).

A kernel matches a node as ONNX Runtime matches it (``KernelRegistry::VerifyKernelDef``): same
op type and domain, the node's schema version within the kernel's version range, and for every
BF16 input or output the kernel's type constraint of that formal parameter allows
``tensor(bfloat16)``. Nodes of custom domains without an ONNX schema are not judged.

FP16 is not judged this way: ONNX Runtime CPU inserts Casts to FP32 around FP16 nodes it has no
kernel for (its ``InsertCastTransformer``), so FP16 models load; it does nothing of the kind for
BF16.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import onnx
import onnx_ir as ir

from precision_doctor.errors import BackendUnavailable
from precision_doctor.formats import Precision
from precision_doctor.graph.load import opset_of
from precision_doctor.precision.writer.validate import inferred_dtypes
from precision_doctor.runners.ort_options import CPU, parse_ort_spec

_BF16 = "tensor(bfloat16)"
_FP16 = "tensor(float16)"
# ONNX Runtime turns Constant nodes into initializers when it loads a model: no kernel runs them.
_NO_KERNEL_NEEDED = frozenset({"Constant"})
# Messages ONNX Runtime gives when no provider has a kernel for a node: the CPU EP's
# "NOT_IMPLEMENTED : Could not find an implementation for Conv(22) node with name ...", and, with
# the CUDA EP first, "Provider type for <node> is not set" from the memcpy transformer
# (measured with ONNX Runtime GPU 1.31 on BF16 BatchNormalization, BENCHMARKS.md).
_MISSING_KERNEL_TEXT = ("NOT_IMPLEMENTED", "Could not find an implementation",
                        "IsNodeCompatibleWithProvider", "is not set")


@dataclass(frozen=True)
class MissingKernel:
    """An op type (at its schema version) that has no BF16 kernel in one provider.

    Attributes:
        op: ``Conv(22)``: op type (domain-qualified outside the default domain) and the
            schema version, as ONNX Runtime names it.
        nodes: The nodes of the model that need it, in graph order.
    """

    op: str
    nodes: tuple[str, ...]


def is_missing_kernel(message: str) -> bool:
    """Whether an ONNX Runtime session error says a node has no kernel."""
    return any(text in message for text in _MISSING_KERNEL_TEXT)


def _registry(provider: str) -> dict[tuple[str, str], list] | None:
    """ONNX Runtime's kernel registry for ``provider``, or None where it is not read: it
    fails in some installs, and in onnxruntime-gpu 1.31.1 without its TensorRT EP library it
    crashed the process (segmentation fault, on the H100 of BENCHMARKS.md), which no
    ``except`` catches; so it is not read at all where the CUDA execution provider is
    installed (the callers then decide from the session error, or verify otherwise)."""
    try:
        import onnxruntime
        from onnxruntime.capi import _pybind_state
        if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            return None
        defs = _pybind_state.get_all_opkernel_def()
    except Exception:  # noqa: BLE001 - pybind's Fail is no RuntimeError; e.g. a provider
        # library missing from the install (seen: onnxruntime-gpu without its TensorRT EP):
        # fall back to the session error, which names the node without a kernel
        return None
    table: dict[tuple[str, str], list] = {}
    for kernel in defs:
        if kernel.provider == provider:
            table.setdefault((kernel.op_name, kernel.domain or ""), []).append(kernel)
    return table


def _schema(node: onnx.NodeProto, opsets: dict[str, int]) -> onnx.defs.OpSchema | None:
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    try:
        return onnx.defs.get_schema(node.op_type, opsets.get(domain, 1), domain)
    except onnx.defs.SchemaError:
        return None


def _formal(params: Sequence, index: int) -> str | None:
    """The type-constraint name of actual input/output ``index`` (variadic: the last one)."""
    if not params:
        return None
    return params[min(index, len(params) - 1)].type_str


def _has_kernel(kernels: list, since: int, needs: set[str], type_name: str) -> bool:
    """Whether one of ``kernels`` covers schema version ``since`` and allows ``type_name`` for
    every type constraint in ``needs`` (one the kernel does not constrain allows anything)."""
    for kernel in kernels:
        start, end = kernel.version_range
        if not start <= since <= end:
            continue
        allowed = kernel.type_constraints
        if all(name not in allowed or type_name in allowed[name] for name in needs):
            return True
    return False


def missing_kernels(model: onnx.ModelProto, provider: str = "CPUExecutionProvider",
                    precision: Precision = Precision.BF16) -> list[MissingKernel] | None:
    """The op types of ``model``'s nodes reading or writing ``precision`` (BF16 or FP16) that
    ``provider`` has no kernel for (main graph; nodes of If/Loop/Scan bodies are not judged).

    A BF16 node without a kernel stops ONNX Runtime from opening the model; an FP16 one does
    not: ONNX Runtime casts its inputs to FP32, runs the FP32 kernel and drops the FP16
    rounding of its outputs (measured: PP-OCRv4 cls written in FP16 runs on ONNX Runtime CPU
    1.1e-6 from FP32, 6.1e-5 emulated exactly; ``benchmarks/fp16_verifiers.py``).

    Args:
        model: The model to run (e.g. a BF16 or FP16 model written by ``fix``).
        provider: ONNX Runtime's provider name, e.g. ``CPUExecutionProvider``.
        precision: ``Precision.BF16`` or ``Precision.FP16``.

    Returns:
        One entry per op type and version, in order of first appearance; ``[]`` when every
        node has a kernel; None when this onnxruntime does not expose its kernel registry or
        does not register ``provider``.

    Raises:
        UnsupportedModelError: Shape inference cannot type the model's tensors.
    """
    table = _registry(provider)
    if not table:
        return None
    types = inferred_dtypes(model)
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    opsets.setdefault("", opset_of(model))
    low = ir.DataType.FLOAT16 if precision is Precision.FP16 else ir.DataType.BFLOAT16
    type_name = _FP16 if precision is Precision.FP16 else _BF16
    found: dict[str, list[str]] = {}
    for node in model.graph.node:
        if node.op_type in _NO_KERNEL_NEEDED and node.domain in ("", "ai.onnx"):
            continue
        ins = [i for i, name in enumerate(node.input) if name and types.get(name) == low]
        outs = [i for i, name in enumerate(node.output) if name and types.get(name) == low]
        if not ins and not outs:
            continue
        schema = _schema(node, opsets)
        if schema is None:
            continue
        since = schema.since_version
        needs = {t for t in [*(_formal(schema.inputs, i) for i in ins),
                             *(_formal(schema.outputs, i) for i in outs)] if t}
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        if _has_kernel(table.get((node.op_type, domain), []), since, needs, type_name):
            continue
        op = f"{domain + '.' if domain else ''}{node.op_type}({since})"
        found.setdefault(op, []).append(node.name or node.output[0])
    return [MissingKernel(op, tuple(nodes)) for op, nodes in found.items()]


def describe_missing(missing: Sequence[MissingKernel], limit: int = 6) -> str:
    """``Conv(22) (53 nodes), MatMul(13) (1 node)``; at most ``limit`` op types, then a count."""
    parts = [f"{m.op} ({len(m.nodes)} node{'s' if len(m.nodes) != 1 else ''})"
             for m in missing[:limit]]
    if len(missing) > limit:
        parts.append(f"{len(missing) - limit} more op types")
    return ", ".join(parts)


def bf16_op_gaps(model: onnx.ModelProto, provider: str = "CPUExecutionProvider"
                 ) -> list[str] | None:
    """Op types of ``model``'s floating-point nodes for which ``provider`` has no BF16 kernel
    at any version: what stops it from running this model in BF16, before any BF16 model is
    written. None when the kernel registry is not available.

    Raises:
        UnsupportedModelError: Shape inference cannot type the model's tensors.
    """
    table = _registry(provider)
    if not table:
        return None
    floats = {ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16}
    types = inferred_dtypes(model)
    gaps: list[str] = []
    for node in model.graph.node:
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        if node.op_type in _NO_KERNEL_NEEDED or node.op_type in gaps or not any(
                types.get(n) in floats for n in [*node.input, *node.output] if n):
            continue
        kernels = table.get((node.op_type, domain), [])
        if not any(_BF16 in allowed for k in kernels for allowed in k.type_constraints.values()):
            gaps.append(node.op_type)
    return gaps


def cpu_fp16_warning(spec: str, candidate: onnx.ModelProto | None,
                     target: Precision) -> str:
    """What the user should know when ``spec`` runs ONNX Runtime CPU as the FP16 candidate
    ("" otherwise): without a candidate model it runs the FP32 model in FP32; with an FP16
    candidate model it runs each FP16 node it has no FP16 kernel for in FP32 and drops that
    rounding (``missing_kernels``), so the diagnosis measures ONNX Runtime CPU's handling of
    the model, not FP16 arithmetic.

    Args:
        spec: The ``--runner`` text.
        candidate: The ``--candidate-model``, if any.
        target: The diagnosed precision.
    """
    if (target is not Precision.FP16 or not spec.strip().startswith("ort")
            or parse_ort_spec(spec).provider != CPU):
        return ""
    if candidate is None:
        return (f"--runner {spec} without --candidate-model runs the FP32 model in FP32: this "
                "compares two FP32 runs, not FP16 (give the FP16 model with --candidate-model, "
                "or use the emulator)")
    missing = missing_kernels(candidate, precision=Precision.FP16)
    if missing == []:
        return ""
    if missing is None:
        return ("ONNX Runtime CPU runs every FP16 node it has no FP16 kernel for (on x86 most "
                "compute ops) in FP32 and drops its FP16 rounding; this onnxruntime's kernel "
                "registry cannot be read to name them, so this may measure ONNX Runtime CPU "
                "running the model rather than FP16 arithmetic (--runner emulate-written "
                "emulates it exactly; on a GPU, --runner ort:cuda)")
    return (f"ONNX Runtime CPU has no FP16 kernel for {describe_missing(missing)}: it runs "
            "those nodes in FP32 and drops their FP16 rounding, so this measures ONNX Runtime "
            "CPU running the model, not FP16 arithmetic (--runner emulate-written emulates it "
            "exactly; on a GPU, --runner ort:cuda)")


def refuse_cpu_bf16(spec: str, model: onnx.ModelProto,
                    candidate: onnx.ModelProto | None = None, command: str = "diagnose") -> None:
    """A clear error when ``spec`` asks ONNX Runtime CPU to run a model in BF16.

    ``ort:cpu`` runs a model as stored: the FP32 model in FP32 (``diagnose`` without a
    candidate model would compare FP32 with FP32 and call it BF16), and a BF16 model only when
    ONNX Runtime CPU has a BF16 kernel for every node, which it has not for Conv, MatMul, Add,
    ... Does nothing for other runners, or when ONNX Runtime CPU can run the BF16 candidate.

    Args:
        spec: The ``--runner`` text.
        model: The FP32 model.
        candidate: The BF16 model to run instead (``--candidate-model``), if any.
        command: ``diagnose`` or ``fix`` (what to suggest differs).

    Raises:
        BackendUnavailable: ONNX Runtime CPU cannot run this model in BF16; the message says
            which kernels are missing and what to use instead.
    """
    if not spec.strip().startswith("ort") or parse_ort_spec(spec).provider != CPU:
        return
    if candidate is not None:
        missing = missing_kernels(candidate)
        if not missing:
            return
        raise BackendUnavailable(
            f"--runner {spec}: ONNX Runtime CPU has no BF16 kernel for "
            f"{describe_missing(missing)} of the candidate model, so it cannot run it. On the "
            "CPU use --runner emulate-written (the candidate model emulated exactly: its "
            "Casts, every BF16 tensor rounded to BF16); on a GPU, --runner ort:cuda.",
            runner=spec)
    gaps = bf16_op_gaps(model)
    if gaps == [] and command == "fix":
        return
    ops = f" (no BF16 kernel for {', '.join(gaps)})" if gaps else ""
    if command == "fix":
        raise BackendUnavailable(
            f"--runner {spec}: ONNX Runtime CPU cannot run BF16 models{ops}, so it cannot "
            "evaluate the search's candidates. Leave --runner out: the emulator searches on the "
            "CPU and fix verifies the written model by emulating it exactly. On a GPU, use "
            "--runner ort:cuda.", runner=spec)
    raise BackendUnavailable(
        f"--runner {spec} runs the model as stored, in FP32: it would compare FP32 with FP32. "
        f"ONNX Runtime CPU cannot run this model in BF16{ops}. Use the emulator (--runner "
        "emulate, the default: every tensor rounded to BF16 on the CPU), or a BF16 model "
        "written by `fix --target bf16` with --candidate-model and --runner emulate-written "
        "(CPU) or --runner ort:cuda (GPU).", runner=spec)
