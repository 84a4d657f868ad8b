"""CPU emulation of reduced precision: rewrite a model so ONNX Runtime CPU computes what an
engine running a ``PrecisionPlan`` would store.

Model of an engine (a strongly typed network, the behaviour TensorRT >= 10 guarantees):

* FP16/BF16 node: every floating input is rounded to the format (the engine's Cast at a
  precision boundary, or a weight stored in the format), the node computes, and every floating
  output is rounded to the format. Internal accumulation is FP32 (what tensor-core GEMM/conv
  kernels and ONNX Runtime CUDA's reductions do).
* TF32 node (MatMul/Gemm/Conv/ConvTranspose only): the two multiplicands are rounded to 10
  mantissa bits with the FP32 exponent range; accumulation and output stay FP32. Depthwise
  convolutions (one input channel per group) are left in FP32: cuDNN runs them on CUDA cores,
  not tensor cores, so TF32 does not apply (measured on an H200: emulating them as TF32
  overestimated PP-OCRv4 cls's TF32 error 2.7x; see BENCHMARKS.md).
* FP32 node: unchanged.
* Ops that only select, negate or bound values (Relu, Clip, MaxPool, Max, ...; ``EXACT_OPS``)
  produce values already in the format from rounded inputs: their output round trip would be
  the identity and is left out.
* Data-movement nodes (Reshape, Concat, Slice, Gather, ...) do no arithmetic: they carry values
  in the format their producers stored them in, whatever the plan says about them (the
  strongly typed writer gives them their producer's precision too; one the plan names FP32 it
  writes in FP32 with Casts around it, which moves the same values).
* A ``Cast``/``CastLike`` node is a candidate when it writes a float tensor
  (``precision.plan.candidate_nodes``): in FP16/BF16 its float output is rounded (an int32
  accumulator of 1.2e5 becomes inf in FP16), its input is read as its producer stored it.

Rounding is round-to-nearest-even with overflow to inf, FP16 subnormals kept and values below
half the smallest subnormal flushed to zero (ONNX ``Cast`` semantics). Initializers are rounded
ahead of time with ``ml_dtypes`` (exact RNE). Activations use ``Cast`` round trips; where the
opset has no ``bfloat16`` Cast (< 13) and for TF32, a Veltkamp split rounds to the target
mantissa: c = x*(2^s+1), hi = c - (c - x) (Dekker 1971, "A floating-point technique for
extending the available precision"), which is round-to-nearest except that exact ties may round
away from even and |x| > FLT_MAX / 2^s overflows.

A ``LayerNormalization`` with ``stash_type`` != 1 on an FP16/BF16 node is expanded into its
statistics chain first (``emulate_layernorm``), so its statistics are rounded like the engine's;
with ``stash_type`` = 1 (the default) the op runs in FP32 on its rounded input.

Nodes inside subgraphs (If/Loop/Scan bodies) are left in FP32; ``EmulationInfo`` counts them.

Weights kept in external data files (``graph.external``) are rounded into the process's weight
store once per (tensor, format) and referenced from there, so the emulation model of a model of
any size stays a small proto and repeated emulations (search, layerwise) reuse the rounding.

The pass (``precision.emulate_pass``) edits the protobuf of the shape-inferred model in place and
re-emits its nodes in order with the rounding nodes between them; the FP32 weights no node reads
any more are dropped. A search builds one emulation per plan: PP-OCRv4 det in FP16 builds in
93 ms (``benchmarks/probes/emulation_cost.py``, 2026-11-28, 2 cores), against 0.17-0.22 s for the
same pass over onnx-ir's object graph (deserialized, then serialized back; the same probe at
2033e2d), with the same nodes, names, value_info and outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, TypeVar

import onnx
from onnx import helper

from precision_doctor.errors import UnsupportedModelError
from precision_doctor.formats import Precision
from precision_doctor.graph.load import opset_of
from precision_doctor.precision.conv_bias import FUSED, SEPARATE, split_conv_bias
from precision_doctor.precision.emulate_layernorm import expand_low_precision_stats
from precision_doctor.precision.emulate_pass import SPLIT_BITS, Emulator, subgraph_nodes
from precision_doctor.precision.plan import NodeDecision, PrecisionPlan


@dataclass(frozen=True)
class EmulationInfo:
    """What the emulation did.

    Attributes:
        rounded_activations: Number of activation tensors rounded at run time.
        rounded_initializers: Number of initializer copies rounded ahead of time.
        method: Format -> rounding method used for activations (``cast`` or ``veltkamp``).
        unknown_dtype: Tensors whose dtype shape inference could not determine (not rounded).
        subgraph_nodes: Nodes inside subgraphs, left in FP32.
    """

    rounded_activations: int = 0
    rounded_initializers: int = 0
    method: dict[str, str] = field(default_factory=dict)
    unknown_dtype: tuple[str, ...] = ()
    subgraph_nodes: int = 0



_E = TypeVar("_E", bound=Emulator)


def emulate(model: onnx.ModelProto, plan: PrecisionPlan, conv_bias: str = FUSED
            ) -> tuple[onnx.ModelProto, EmulationInfo]:
    """Build the emulation model of ``model`` under ``plan`` (the input is not modified).

    Args:
        model: FP32 (or FP64) ONNX model.
        plan: Precision of every node.
        conv_bias: Where the engine adds an FP16/BF16 convolution's bias
            (``precision.conv_bias``): ``fused`` (before the one rounding: TensorRT) or
            ``separate`` (after rounding the convolution, rounded again: ONNX Runtime CUDA).

    Returns:
        The emulation model (same inputs and outputs, same names) and what was done.

    Raises:
        PlanError: ``plan`` names nodes the model does not have.
        UnsupportedModelError: Shape/type inference of the model failed.
    """
    plan.validate(model)
    if conv_bias == SEPARATE:
        model, added = split_conv_bias(model, lambda n: plan.precision_of(n.name or "") in (
            Precision.FP16, Precision.BF16))
        plan = plan.with_overrides({add: NodeDecision(plan.precision_of(conv), "engine",
                                                      "bias added after the rounded Conv")
                                    for conv, add in added.items()})
    model, plan = expand_low_precision_stats(model, plan)  # stash_type=0 LayerNorms
    out, info, _ = build_emulation(model, lambda m, d, t: Emulator(m, plan, d, t))
    return out, info


def build_emulation(model: onnx.ModelProto, make: Callable[..., _E]
                    ) -> tuple[onnx.ModelProto, EmulationInfo, _E]:
    """Infer ``model``'s types, run the emulator ``make(inferred, dtypes, types)`` builds on
    the inferred copy, and return the result (shared by ``emulate`` and
    ``precision.emulate_switch``).

    Raises:
        UnsupportedModelError: Shape/type inference of the model failed.
    """
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception as exc:  # noqa: BLE001 - inference can fail on custom ops
        raise UnsupportedModelError(
            f"ONNX shape inference failed ({exc}); the emulator needs tensor dtypes. Run "
            "onnx.shape_inference or export with value_info.") from exc
    graph = inferred.graph
    types = {v.name: v.type for v in (*graph.input, *graph.value_info, *graph.output)
             if v.type.HasField("tensor_type")}
    dtypes = {name: t.tensor_type.elem_type for name, t in types.items()
              if t.tensor_type.elem_type}
    dtypes.update((t.name, t.data_type) for t in graph.initializer)
    _contrib_dtypes(inferred, dtypes, types)
    emulator = make(inferred, dtypes, types)
    emulator.run()
    nested = subgraph_nodes(graph.node)
    out = emulator.finish()
    info = EmulationInfo(emulator.n_act, emulator.n_init, dict(sorted(emulator.methods.items())),
                         tuple(emulator.unknown), nested)
    return out, info, emulator


def _contrib_dtypes(inferred: onnx.ModelProto, dtypes: dict[str, int],
                    types: dict[str, onnx.TypeProto]) -> None:
    """Give the outputs of ops ONNX inference cannot type (``com.microsoft`` Gelu, ...), and
    what inference then left untyped after them, their element type from ONNX Runtime's
    schema, as the writer does
    (``precision.writer.validate.inferred_dtypes``): an FP16 node reading such a float output
    rounds it, as the written model casts it (found by tests/fuzz)."""
    if not any(o and o not in dtypes for n in inferred.graph.node
               if n.domain not in ("", "ai.onnx") for o in n.output):
        return
    from precision_doctor.precision.writer.validate import inferred_dtypes

    found = inferred_dtypes(inferred)  # also what ONNX inference left untyped downstream
    for name in (o for n in inferred.graph.node for o in n.output if o and o not in dtypes):
        dtype = found.get(name)
        if dtype is not None:
            dtypes[name] = int(dtype)
            types[name] = helper.make_tensor_type_proto(int(dtype), None)


def describe_method(model: onnx.ModelProto, precision: Precision) -> str:
    """One line saying how activations are rounded for ``precision`` on this model's opset."""
    if precision is Precision.FP16:
        return "Cast to float16 and back (RNE, IEEE-754 binary16)"
    if precision is Precision.BF16 and opset_of(model) >= 13:
        return "Cast to bfloat16 and back (RNE)"
    if precision is Precision.FP32:
        return "no rounding"
    return f"Veltkamp split to {23 - SPLIT_BITS[precision]} mantissa bits (ties may round away)"
