"""The op types a deployment engine has no FP16/BF16 kernel for, and the nodes that hits.

A strongly typed model runs only where the engine has a kernel for every node in the type the
model gives it. ONNX Runtime CUDA places a node it has no BF16 kernel for on the CPU when the
CPU has one (data movement), else the session fails ("Provider type for GlobalAveragePool node
with name '...' is not set", from its memcpy transformer): a BF16 model written for every
engine alike does not load there. ``fix --engine ort-cuda`` keeps those nodes FP32 (reason
``engine``), so the model it writes loads and every node runs on the GPU. It also keeps FP32 the
nodes whose BF16 kernel there is measurably less exact than the node model the emulation
verifies with (FP32 arithmetic inside the node, output rounded once): Sigmoid, HardSigmoid,
HardSwish, Gelu, Softplus, Mish (2 to 253 BF16 ulps off).

The tables are measured, not read from a registry: ONNX Runtime's kernel registry
(``get_all_opkernel_def``) crashes in onnxruntime-gpu installs without the TensorRT EP library
(``runners.kernels.registry``). ``benchmarks/ort_cuda_bf16.py`` builds one model per op type and
schema version in force at opsets 13..22 (the opsets the writer emits: Cast to bfloat16 needs
13, Conv and the pools take bfloat16 from 22), from ONNX's own node test cases, with the node's
float tensors in BF16 (FP16) and Casts around it as the writer writes them; each must open and
run with the CUDA execution provider alone and CPU fallback disabled. An op type is listed when
its BF16 probe does not load while the FP32 probe of the same node does; a kernel is inexact
when its outputs are more than 1 BF16 ulp from the FP32 probe's on the same rounded inputs,
rounded once. Results: BENCHMARKS.md, "BF16"; raw:
``benchmarks/results/ort_cuda_kernels_*.json``. Ops the test cases do not cover
(If/Loop/Scan bodies, sequences: the writer keeps those FP32 anyway) are not judged.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field

import onnx

from precision_doctor.errors import PlanError
from precision_doctor.formats import Precision
from precision_doctor.precision.conv_bias import FUSED, SEPARATE

# op type -> schema versions (``since_version`` at the node's opset) that no kernel of ONNX
# Runtime CUDA runs in the format: a model with such a node in BF16 loads only when the CPU has a
# BF16 kernel for it (then it runs there, with copies), else not at all. Measured with
# onnxruntime-gpu 1.31.1 (CUDA 13) on an NVIDIA H100, 2026-11-25 (``benchmarks/
# ort_cuda_bf16.py``). GlobalAveragePool-22, BatchNormalization, Resize, Clip are among them,
# and MaxPool-22, which 1.31 runs on the CUDA EP in no type (FP32 falls back to the CPU); Conv-22,
# MatMul, Gemm, Softmax, LayerNormalization, Add/Mul/Sub/Div, Exp, Erf, Tanh, Sqrt are not.
CUDA_NO_BF16: Mapping[str, tuple[int, ...]] = {
    "Acos": (22,), "Acosh": (22,), "AffineGrid": (20,), "ArgMax": (13,), "ArgMin": (13,),
    "Asin": (22,), "Asinh": (22,), "Atan": (22,), "Atanh": (22,), "BatchNormalization": (14, 15),
    "Bernoulli": (22,), "Ceil": (13,), "CenterCropPad": (18,), "Clip": (13,), "Col2Im": (18,),
    "ConvTranspose": (22,), "Cosh": (22,), "CumSum": (14,), "DFT": (17, 20),
    "DepthToSpace": (13,), "DequantizeLinear": (19, 21), "Det": (22,), "Dropout": (22,),
    "Elu": (22,), "Equal": (13, 19), "EyeLike": (22,), "Floor": (13,), "GRU": (22,),
    "GlobalAveragePool": (22,), "GlobalMaxPool": (22,), "Greater": (13,), "GreaterOrEqual": (16,),
    "GridSample": (22,), "Hardmax": (13,), "InstanceNormalization": (22,), "LRN": (13,),
    "LSTM": (22,), "LeakyRelu": (16,), "Less": (13,), "LessOrEqual": (16,), "Log": (13,),
    "LogSoftmax": (13,), "LpPool": (22,), "MaxPool": (22,), "MaxUnpool": (22,), "Mean": (13,),
    "MelWeightMatrix": (17,), "PRelu": (16,), "Pad": (13, 18, 19, 21), "QLinearMatMul": (21,),
    "QuantizeLinear": (19, 21), "RNN": (22,), "Reciprocal": (13,), "ReduceL1": (13,),
    "ReduceL2": (13, 18), "ReduceLogSum": (13, 18), "ReduceLogSumExp": (13, 18),
    "ReduceMax": (13, 18, 20), "ReduceMin": (13, 18, 20), "ReduceProd": (13, 18),
    "ReduceSumSquare": (13,), "Resize": (13, 18, 19), "Round": (22,), "STFT": (17,),
    "Selu": (22,), "Sinh": (22,), "SoftmaxCrossEntropyLoss": (13,), "SpaceToDepth": (13,),
    "Tan": (22,), "ThresholdedRelu": (22,),
}
CUDA_NO_FP16: Mapping[str, tuple[int, ...]] = {
    "EyeLike": (9,), "GridSample": (20, 22),
}
# op type -> (schema versions, largest BF16 ulp distance measured): BF16 kernels of ONNX Runtime
# CUDA whose outputs are more than 1 BF16 ulp from FP32 arithmetic on the same (rounded)
# inputs rounded once, the node model the emulation verifies with (on ONNX's test inputs; same
# measurement). Kept FP32 for this engine, so that what runs is what was verified.
CUDA_BF16_INEXACT: Mapping[str, tuple[tuple[int, ...], float]] = {
    "Gelu": ((20,), 25),
    "HardSigmoid": ((22,), 26),
    "HardSwish": ((22,), 2),
    "Mish": ((22,), 253),
    "Sigmoid": ((13,), 8),
    "Softplus": ((22,), 3),
}
ORT_CUDA_MEASURED = "onnxruntime-gpu 1.31.1"  # CUDA 13 build, on an NVIDIA H100, 2026-11-25


@dataclass(frozen=True)
class Engine:
    """A deployment engine and the schema versions of op types it has no kernel for.

    Attributes:
        name: The ``--engine`` value (``ort-cuda``).
        title: In words (``ONNX Runtime CUDA``).
        gaps: Precision -> op type -> schema versions without a kernel in that precision.
        measured: The engine version the tables were measured with.
        inexact: Precision -> op type -> (schema versions, largest ulp distance) of kernels
            less exact than FP32 arithmetic rounded once.
        conv_bias: Where it adds an FP16/BF16 convolution's bias (``precision.conv_bias``):
            ``fused`` (one rounding) or ``separate`` (the rounded convolution plus the bias,
            rounded again), which the emulation of its models then follows.
    """

    name: str
    title: str
    gaps: Mapping[Precision, Mapping[str, tuple[int, ...]]]
    measured: str
    inexact: Mapping[Precision, Mapping[str, tuple[tuple[int, ...], float]]] = \
        dataclass_field(default_factory=dict)
    conv_bias: str = FUSED

    def lacks(self, precision: Precision, op_type: str, since_version: int) -> bool:
        """Whether the engine has no ``precision`` kernel for ``op_type`` at that version."""
        return since_version in self.gaps.get(precision, {}).get(op_type, ())

    def inexact_ulps(self, precision: Precision, op_type: str, since_version: int
                     ) -> float | None:
        """The ulp distance of its ``precision`` kernel for ``op_type`` at that version from
        FP32 arithmetic rounded once, when above 1 (measured); else None."""
        versions, ulps = self.inexact.get(precision, {}).get(op_type, ((), 0.0))
        return ulps if since_version in versions else None


ENGINES: Mapping[str, Engine] = {
    "ort-cuda": Engine("ort-cuda", "ONNX Runtime CUDA",
                       {Precision.BF16: CUDA_NO_BF16, Precision.FP16: CUDA_NO_FP16},
                       ORT_CUDA_MEASURED, {Precision.BF16: CUDA_BF16_INEXACT}, SEPARATE),
}


def parse_engine(name: str | None) -> Engine | None:
    """The engine named ``name`` (``ort-cuda``); None for None or ``""`` (no engine: a model
    for any engine that has every kernel, e.g. TensorRT with ``--stronglyTyped``).

    Raises:
        PlanError: Not a known engine; the message lists them.
    """
    if not name:
        return None
    key = name.strip().lower().replace("_", "-").replace(":", "-")
    if key not in ENGINES:
        known = ", ".join(f"{e.name} ({e.title})" for e in ENGINES.values())
        raise PlanError(f"unknown engine {name!r}: known engines are {known}. Leave --engine "
                        "out for a model that assumes every kernel (TensorRT --stronglyTyped).")
    return ENGINES[key]


def conv_bias_of(name: str | None) -> str:
    """How the emulation adds an FP16/BF16 convolution's bias for the engine named ``name``
    (``precision.conv_bias``): that engine's ``conv_bias``, ``fused`` without one.

    Raises:
        PlanError: Not a known engine.
    """
    engine = parse_engine(name)
    return engine.conv_bias if engine is not None else FUSED


def engine_of_runner(spec: str | None) -> str | None:
    """The engine a ``--runner`` spec deploys on: ``ort-cuda`` for ``ort:cuda...``, else None."""
    text = (spec or "").strip().lower()
    return "ort-cuda" if text.startswith("ort:cuda") else None


def _since(op_type: str, opset: int) -> int | None:
    try:
        return int(onnx.defs.get_schema(op_type, opset, "").since_version)
    except onnx.defs.SchemaError:
        return None


def engine_fp32_nodes(model: onnx.ModelProto, engine: Engine, precision: Precision,
                      opset: int, floats: Collection[str] | None = None) -> dict[str, str]:
    """The main-graph nodes ``engine`` has no ``precision`` kernel for when written at
    ``opset``, with why (``no BF16 kernel in ONNX Runtime CUDA for GlobalAveragePool-22``).

    Args:
        model: The FP32 model (nodes named).
        engine: The deployment engine.
        precision: The reduced precision written (BF16, FP16).
        opset: The default-domain opset of the written model (the writer may raise it).
        floats: Names of the model's float32 tensors: nodes that read or write none (an
            Equal on int64 shapes) are left out. None: every node of a listed op type.

    Returns:
        Node name -> detail, in graph order; nodes of other domains are not judged.
    """
    found: dict[str, str] = {}
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or not node.name:
            continue
        if floats is not None and not any(n in floats for n in [*node.input, *node.output]):
            continue
        since = _since(node.op_type, opset)
        if since is None:
            continue
        fmt = precision.value.upper()
        ulps = engine.inexact_ulps(precision, node.op_type, since)
        if engine.lacks(precision, node.op_type, since):
            found[node.name] = (f"no {fmt} kernel in {engine.title} for "
                                f"{node.op_type}-{since} ({engine.measured})")
        elif ulps is not None:
            found[node.name] = (f"{engine.title}'s {fmt} {node.op_type}-{since} is up to "
                                f"{ulps:g} {fmt} ulps from FP32 arithmetic rounded once "
                                f"({engine.measured}); in FP32 it computes what was verified")
    return found


def describe_engine_nodes(engine: Engine, precision: Precision, ops: Mapping[str, int]) -> str:
    """``written for ONNX Runtime CUDA: 13 nodes kept FP32 (its BF16 kernels for them are
    missing or inexact: GlobalAveragePool x10, MaxPool x3)``."""
    fmt = precision.value.upper()
    if not ops:
        return f"written for {engine.title}: it has an exact {fmt} kernel for every node"
    count = sum(ops.values())
    listed = ", ".join(f"{op} x{n}" for op, n in sorted(ops.items()))
    return (f"written for {engine.title}: {count} node{'s' if count != 1 else ''} kept FP32 "
            f"(its {fmt} kernels for them are missing or inexact: {listed})")
