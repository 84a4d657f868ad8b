"""``prescale-normalized-residual``: scale a residual stream that only normalizations read by
2^-k, so that FP16 holds it.

    Norm(x * 2^-k, eps * 2^-2k)  ==  Norm(x, eps)     (Group-, Instance-, Layer-, RMSNorm)

Why: the residual stream of a VAE decoder or a U-Net reaches 1e5-1e6 (the reason for the
"fp16-fix" VAE checkpoints), beyond FP16's largest finite value 65504: stored in FP16 it is
inf, and the next normalization's output NaN. What reads the stream is a normalization, which
cannot tell x from x * s: mean and deviation scale with s, the variance with s^2, so
(s x - s mu) / sqrt(s^2 var + s^2 eps) = (x - mu) / sqrt(var + eps) (RMSNorm: mean(x^2) for
var, no mu): epsilon is multiplied by s^2 = 2^-2k to stay exact, not left alone (which would
be a different, larger, regulariser).

How: the tensors of the stream and the constants that produce them (``streams``): the weights
and biases of the Conv/MatMul/Gemm that write into it, a constant it is multiplied by, the
constant operands of its Adds, the biases of linear ops it flows through, all multiplied by
s = 2^-k; every normalization's ``epsilon`` by 2^-2k (a decomposed RMSNorm's epsilon constant
too). No node is added or kept in FP32.
Scaling by a power of two is exact in IEEE-754 arithmetic (it changes the exponent only), and
every product, sum, square root and quotient of the scaled operands is the scaled result of
the original ones, so the FP32 outputs are bit-identical unless a value leaves the normal
range (a nonzero constant below 2^(k-126), or epsilon * 2^-2k below 2^-126: refused; an
activation of the stream below 2^(k-126), about 1e-32 for k = 20, is negligible).

k: the smallest k that puts the stream's largest |x| on the calibration data (``max_abs``:
tensor name -> largest finite |x| in FP32, which ``fix`` measures, ``repair.rewrites_proof``)
at or below ``HEADROOM`` = 2^12 = 4096, 16x below 65504, so that inputs up to 16x larger than
the calibration data still fit (a margin of our choosing); at or below ``SQUARED_HEADROOM`` =
2^7 when a decomposed RMSNorm reads the stream, whose squares are computed in the model's
format (|x| <= 2^7: squares and their mean <= 2^14). A stream below it is left alone. The
cost: the scaled weights lose FP16 precision where they become subnormal (below 2^-14), which
the record reports (``weight_fp16_subnormal_fraction``); above ``MAX_SUBNORMAL_FRACTION`` (1%)
of their elements the rewrite is refused.

When: only for FP16 (BF16 holds 3.4e38: nothing to do; without a target nothing is recorded);
without ``max_abs`` a stream that could be scaled is recorded as a candidate (``candidate``:
True) for ``fix`` to measure. Checks (reasons in the records): what blocks the stream (a
consumer that is not scale-invariant, a graph output, a computed weight: ``streams``), no
maxima for its tensors, epsilon not representable after scaling.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

import numpy as np
import onnx
import onnx_ir as ir

from precision_doctor.formats import FORMATS, Precision
from precision_doctor.precision.rewrites.graph_edit import (
    RewritePassResult,
    add_initializer,
    constant_array,
    remove_dead_constants,
    taken_names,
    unique_name,
)
from precision_doctor.precision.rewrites.ranges.rms import epsilon_of
from precision_doctor.precision.rewrites.ranges.streams import Stream, find_streams
from precision_doctor.precision.rewrites.ranges.target import TargetPass
from precision_doctor.precision.rewrites.report import Detail, RewriteRecord

HEADROOM = 2.0 ** 12  # the stream's largest |x| after scaling: 16x below FP16's 65504
# With a decomposed RMSNorm reading the stream, its squares are computed in the model's format:
# |x| <= 2^7 keeps them (<= 2^14) and their mean 4x below 65504.
SQUARED_HEADROOM = 2.0 ** 7
# Refused above this share of the scaled weights' elements below FP16's smallest normal 2^-14:
# a subnormal keeps fewer than FP16's 11 significant bits (2^-24, its smallest, keeps one), so
# the FP16 stream would trade its range for its weights' precision (a margin of our choosing;
# measured: a diffusion UNet's stream of 3.2e10 needs 2^-23, every scaled weight subnormal,
# and with it fix's best range-floor rung, its overflows in FP32, scored rel L2 0.78, against
# 3.1e-3 for the rung over 2^15 without it: fix on benchmarks/zoo_unet.py's model, 3 samples).
MAX_SUBNORMAL_FRACTION = 0.01
DEFAULT_EPSILON = 1e-5  # the ONNX default of all four normalizations
FLOAT32_MIN_NORMAL = 2.0 ** -126


def shift_for(max_abs: float, headroom: float = HEADROOM) -> int:
    """The smallest k >= 0 with max_abs * 2^-k <= headroom.

    Args:
        max_abs: Largest finite |x| of the stream.
        headroom: Where the scaled maximum must land.

    Returns:
        k (0 when the stream already fits).
    """
    if not math.isfinite(max_abs) or max_abs <= headroom:
        return 0
    return max(0, math.ceil(math.log2(max_abs / headroom)))


def stream_tensor_names(model: onnx.ModelProto) -> list[str]:
    """Names of the tensors of every stream that could be scaled (for measuring their maxima).

    Args:
        model: The model (not modified).

    Returns:
        Tensor names, graph discovery order, without duplicates.
    """
    graph = ir.serde.deserialize_model(model).graph
    names: list[str] = []
    for stream in find_streams(graph):
        if not stream.blocked:
            names.extend(n for n in stream.names() if n and n not in names)
    return names


class PrescaleNormalizedResidual(TargetPass):
    """Pass: scale each normalized residual stream whose maximum exceeds ``HEADROOM`` by 2^-k.

    Args:
        target: The reduced format; the pass acts for FP16 only (None: nothing recorded).
        max_abs: Tensor name -> largest finite |x| on the calibration data, in FP32; None:
            streams are recorded as candidates only.
    """

    rule: ClassVar[str] = "prescale-normalized-residual"

    def call(self, model: ir.Model) -> RewritePassResult:
        """Rewrite in place; one record per stream."""
        if self.target is None:
            return RewritePassResult(model, False, ())
        graph = model.graph
        taken = taken_names(graph)
        records = [self._try(graph, s, taken) for s in find_streams(graph)]
        return RewritePassResult(model, any(r.applied for r in records), tuple(records))

    def _try(self, graph: ir.Graph, stream: Stream, taken: set[str]) -> RewriteRecord:
        assert self.target is not None  # call() records nothing without a target
        norms = tuple(n.name or "" for n in [*stream.norms, *(r.tail for r in stream.rms)])
        size: dict[str, Detail] = {"tensors": len(stream.tensors), "norms": len(norms)}
        if stream.blocked:
            return RewriteRecord(self.rule, False, norms, (), stream.blocked, size)
        if self.target is not Precision.FP16:
            return RewriteRecord(self.rule, False, norms, (), f"{self.target} holds "
                                 f"{FORMATS[self.target].max:.3g}: no stream overflows it", size)
        if self.max_abs is None:
            return RewriteRecord(self.rule, False, norms, (), "no calibration maxima given: "
                                 "fix measures the stream's tensors first",
                                 {**size, "candidate": True})
        seen = [float(self.max_abs[n]) for n in stream.names() if n in self.max_abs]
        if not seen:
            return RewriteRecord(self.rule, False, norms, (), "no calibration maximum for any "
                                 f"of the stream's {len(stream.tensors)} tensors", size)
        peak = max(seen)
        headroom = SQUARED_HEADROOM if stream.rms else HEADROOM
        k = shift_for(peak, headroom)
        size["max_abs"] = peak
        if k == 0:
            return RewriteRecord(self.rule, False, norms, (), f"the stream's largest |x| "
                                 f"{peak:.3g} is within the headroom {headroom:g}", size)
        tiny = _smallest_constant(stream)
        if tiny * 2.0 ** -k < FLOAT32_MIN_NORMAL:
            return RewriteRecord(self.rule, False, norms, (), f"a constant of the stream "
                                 f"({tiny:.3g}) * 2^-{k} would leave float32's normal range",
                                 {**size, "shift": k})
        eps = [_epsilon(n) for n in stream.norms]
        rms_eps = [epsilon_of(r) for r in stream.rms]
        smallest = min([*eps, *rms_eps], default=1.0)
        if smallest * 2.0 ** (-2 * k) < FLOAT32_MIN_NORMAL:
            return RewriteRecord(self.rule, False, norms, (), f"epsilon {smallest:g} * 2^-{2 * k}"
                                 " would leave float32's normal range", {**size, "shift": k})
        subnormal = _subnormal_fraction(stream, k)
        if subnormal > MAX_SUBNORMAL_FRACTION:
            return RewriteRecord(self.rule, False, norms, (), f"scaling by 2^-{k} would make "
                                 f"{100 * subnormal:.1f}% of the stream's weights FP16-subnormal "
                                 "(below 2^-14): they would lose their precision in FP16",
                                 {**size, "shift": k, "weight_fp16_subnormal_fraction": subnormal})
        scaled = {**self._scale(graph, stream, k, taken),
                  "weight_fp16_subnormal_fraction": subnormal}
        for node, e in zip(stream.norms, eps):
            node.attributes["epsilon"] = ir.AttrFloat32("epsilon", float(
                np.ldexp(np.float32(e), -2 * k)))
        for rms in stream.rms:  # a decomposed RMSNorm's epsilon is a constant input
            value = rms.add.inputs[rms.eps_index]
            array = constant_array(value)
            assert array is not None and value is not None  # rms.from_head checked it
            name = unique_name(f"{value.name or rms.add.name}_prescaled", taken)
            rms.add.replace_input_with(rms.eps_index, add_initializer(
                graph, np.ldexp(array, -2 * k).astype(array.dtype), name))
            remove_dead_constants(graph, [value])
        details: dict[str, Detail] = {**size, "shift": k, "scale": 2.0 ** -k,
                                      "max_abs_after": peak * 2.0 ** -k, **scaled}
        new = tuple(self._scale_inputs(graph, stream, k, taken))
        producers = tuple(dict.fromkeys(n.name or "" for n, _ in stream.scaled))
        return RewriteRecord(
            self.rule, True, producers + norms, new,
            f"residual stream of {len(stream.tensors)} tensors read by {len(norms)} "
            f"normalization(s): largest |x| {peak:.3g} -> {peak * 2.0 ** -k:.3g} (FP16 max "
            f"65504) by 2^-{k} through {len(stream.scaled)} constant(s) of {len(producers)} "
            f"producer(s); epsilon * 2^-{2 * k}; "
            f"{100 * float(scaled['weight_fp16_subnormal_fraction']):.1f}% of the scaled "
            "constants are FP16-subnormal", details)

    @staticmethod
    def _scale_inputs(graph: ir.Graph, stream: Stream, k: int, taken: set[str]) -> list[str]:
        """Insert ``Mul(x, 2^-k)`` after every graph input of the stream; its readers read it."""
        names = []
        for x in stream.inputs:
            readers = [(u.node, u.idx) for u in x.uses()]
            dtype = x.dtype.numpy() if x.dtype is not None else np.float32
            s = add_initializer(graph, np.asarray(2.0 ** -k, dtype),
                                unique_name(f"{x.name}_prescale", taken))
            mul = ir.Node("", "Mul", [x, s], name=unique_name(f"{x.name}/prescale", taken))
            mul.outputs[0].name = unique_name(f"{x.name}_prescaled", taken)
            if x.dtype is not None:
                mul.outputs[0].dtype = x.dtype
            mul.outputs[0].shape = x.shape
            graph.insert_before(min((n for n, _ in readers), key=_position(graph)), mul)
            for node, idx in readers:
                node.replace_input_with(idx, mul.outputs[0])
            names.append(mul.name or "")
        return names

    @staticmethod
    def _scale(graph: ir.Graph, stream: Stream, k: int, taken: set[str]) -> dict[str, Detail]:
        """Replace every constant of ``stream.scaled`` by a scaled copy."""
        old: list[ir.Value | None] = []
        for node, idx in stream.scaled:
            value = node.inputs[idx]
            array = constant_array(value)
            assert array is not None and value is not None  # streams checked it
            name = unique_name(f"{value.name or node.name}_prescaled", taken)
            node.replace_input_with(idx, add_initializer(
                graph, np.ldexp(array, -k).astype(array.dtype), name))
            old.append(value)
        remove_dead_constants(graph, old)
        return {"scaled_constants": len(stream.scaled)}


def _subnormal_fraction(stream: Stream, k: int) -> float:
    """Share of the nonzero elements of the constants ``stream`` scales that 2^-k puts below
    FP16's smallest normal 2^-14 (0 when there is none)."""
    small = total = 0
    for node, idx in stream.scaled:
        array = constant_array(node.inputs[idx])
        if array is not None:
            nonzero = np.abs(array[array != 0]).astype(np.float64) * 2.0 ** -k
            small += int(np.sum(nonzero < FORMATS[Precision.FP16].min_normal))
            total += int(nonzero.size)
    return small / total if total else 0.0


def _epsilon(node: ir.Node) -> float:
    attr = node.attributes.get("epsilon")
    return attr.as_float() if attr is not None else DEFAULT_EPSILON


def _smallest_constant(stream: Stream) -> float:
    """Smallest nonzero |x| of the constants ``stream`` scales (inf when there is none)."""
    smallest = math.inf
    for node, idx in stream.scaled:
        array = constant_array(node.inputs[idx])
        if array is not None:
            nonzero = np.abs(array[array != 0])
            if nonzero.size:
                smallest = min(smallest, float(nonzero.min()))
    return smallest


def _position(graph: ir.Graph) -> Callable[[ir.Node], int]:
    """Node -> its index in ``graph``'s order."""
    order = {id(n): i for i, n in enumerate(graph)}
    return lambda node: order[id(node)]
