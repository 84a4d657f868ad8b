"""``reduce-periodic-argument``: reduce a Sin/Cos/Tan argument modulo 2*pi in FP32, before the
reduced format rounds it.

    sin(x) == sin(x - 2*pi*n),  n = round(x / (2*pi))        (cos likewise; tan has period pi)

Why: a large argument keeps no phase in FP16/BF16. The spacing of binary16 in [512, 1024) is
2^-1 = 0.5 rad, of bfloat16 there 4 rad (8 significant bits); a diffusion timestep embedding
sin(t * f) with t up to 1000, a NeRF or transformer positional encoding computes exactly such
arguments. Reduced in FP32 to [-pi, pi], the argument's FP16 spacing is at most 2^-9, a phase
error of at most 2^-10 = 9.8e-4 rad, with the Sin/Cos itself in FP16.

How: Cody-Waite reduction (W. J. Cody, W. Waite, "Software Manual for the Elementary
Functions", 1980, ch. 8; the first step of a libm sin), six float32 nodes:
n = Round(x * (1/(2 pi))); x_r = (x - n * C1) - n * C2 with C1 = 6.28125 (8 significant bits:
n * C1 and x - n * C1 are exact for |n| < 2^16) and C2 = float32(2 pi - C1). Against the exact
x - 2 pi n, x_r is off by at most half an ulp of n * C2 and of x_r plus n times C2's own
rounding (2^-33): 4.3e-7 rad for |x| <= 1e4; measured 1.9e-7 on 1.2 million arguments in
[-1e4, 1e4] (``tests/precision/test_rewrites_periodic.py``), where float32's own sin is off by
6.8e-8. ``Mod(x, float32(2 pi), fmod=1)`` is exact but reduces modulo float32(2 pi), 1.7e-7 away
from 2 pi: measured 2.8e-4 rad on the same arguments, and its result lies in (-2 pi, 2 pi),
where the FP16 spacing is twice as coarse.

FP32: the new nodes and the argument's producers (arithmetic, Casts, back through data movement
to a graph input, a constant or another op) are listed in the record's ``keep_fp32``; ``fix``
starts its plan with them in FP32 (reason ``rewrite``), so the reduction sees the FP32 x.
The Sin/Cos stays in the target format.

When: only with a target format (as ``saturate-constants``: ``diagnose``'s emulation of what
an engine runs is left alone), where the argument may exceed pi in magnitude: below it n = 0
and the reduction is the identity. An interval bound over the argument's producers (constants;
Sin, Cos, Tanh, Sigmoid, Erf outputs; Clip; sums and products of bounded values) that proves
|x| <= pi skips it with the bound; an unknown range (a graph input t) applies it, which is
exact in FP32 up to the rounding above. ``fix`` then measures every argument it reduced on the
calibration data (``repair.rewrites_proof``) and rewrites again with the maxima (``max_abs``):
an argument below ``phase_limit`` (128 in FP16, 16 in BF16, where the spacing reaches 2^-4 rad,
the limit from which ``diagnose`` reports ``periodic-argument``) is left alone with the measured
maximum, so that moderate arguments (a Snake activation's sin(a x)) keep their producers in
the target format. Beyond |x| = 2^16 * 2 pi = 4.1e5, n * C1 rounds
(sin is off by 2.6e-6 at 4e5, 0.029 at 1e6: measured); ``fix`` therefore measures the rewrite
on the calibration data (``repair.rewrites_proof``) and undoes it when an FP32 output moves.
A model can amplify even the exact reduction: on Kokoro-82M int8 (the zoo's ``kokoro_ja_int8``,
phrase ``tenki``, 2026-12-06) the sine source's phase reaches 23619 rad (FP16 spacing 16 rad),
the reduced Sin differs from float64's sin by 2.8e-7 (ONNX Runtime's own: 1.0e-7), and the
dynamic int8 quantization behind it turns that into 0.066 rel L2 of the FP32 audio: ``fix``
undoes the rule there (its 50 Snake activations, |x| <= 86, are left alone by the phase limit).

Checks (reasons in the records): the argument is float32 (a float64 one is not rounded by a
plan), the opset has ``Round`` (>= 11), the argument is not already reduced.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import onnx_ir as ir

from precision_doctor.formats import FORMATS, Precision
from precision_doctor.precision.plan import CAST_OPS
from precision_doctor.precision.rewrites.graph_edit import (
    RewritePassResult,
    add_initializer,
    constant_array,
    default_opset,
    describe_source,
    taken_names,
    unique_name,
)
from precision_doctor.precision.rewrites.ranges.target import TargetPass
from precision_doctor.precision.rewrites.report import RewriteRecord

PERIODIC_OPS = frozenset({"Sin", "Cos", "Tan"})
INV_TWO_PI = np.float32(1.0 / (2.0 * math.pi))
C1 = np.float32(6.28125)  # 201/32: 8 significant bits, so n * C1 is exact for |n| < 2^16
C2 = np.float32(2.0 * math.pi - 6.28125)
EXACT_BELOW = 2.0 ** 16 * 2.0 * math.pi  # |x| up to which n * C1 is exact
ROUND_OPSET = 11  # ONNX Round appeared in opset 11
UNIT_OPS = frozenset({"Sin", "Cos", "Tanh", "Sigmoid", "Erf", "Softsign"})  # |y| <= 1
SAME_OPS = frozenset({"Neg", "Abs", "Relu", "Identity", "Reshape", "Flatten", "Squeeze",
                      "Unsqueeze", "Transpose", "Expand", "Tile", "Slice", "Gather"})
CHAIN_MATH = frozenset({"Mul", "Div", "Add", "Sub", "Neg"})
CHAIN_MOVE = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Flatten", "Transpose", "Identity",
                        "Expand", "Tile", "Slice", "Gather"})
MAX_DEPTH = 16  # producers looked through (a timestep embedding: Cast-Unsqueeze-Mul-Mul)
# A larger spacing of the argument shifts the phase by up to half of it: 0.031 rad, 3% of the
# amplitude (the ``periodic-argument`` criterion of ``diagnosis.causes.mechanisms``).
PHASE_SPACING = 2.0 ** -4


def phase_limit(target: Precision) -> float:
    """The smallest |x| where ``target``'s spacing exceeds ``PHASE_SPACING``: 128 for FP16,
    16 for BF16 (the spacing at |x| is 2u 2^floor(log2 |x|), u the unit roundoff; the same
    limit as ``diagnosis.causes.mechanisms.phase_limit``, which finds ``periodic-argument``).
    """
    u = FORMATS[target].unit_roundoff
    return 2.0 ** (math.floor(math.log2(PHASE_SPACING / (2.0 * u))) + 1)


def reduce_2pi(x: np.ndarray) -> np.ndarray:
    """The inserted nodes in numpy: x - 2 pi round(x / (2 pi)), float32 throughout.

    Args:
        x: Any shape; converted to float32.

    Returns:
        float32 array of ``x``'s shape in about [-pi, pi] (``np.round`` rounds half to even, as
        ONNX ``Round``).
    """
    x = np.asarray(x, np.float32)
    n = np.round(x * INV_TWO_PI)
    return (x - n * C1) - n * C2


def bound(value: ir.Value | None, depth: int = 0) -> float | None:
    """An upper bound of |value| from the graph alone, or None when it is unknown.

    Args:
        value: A graph value.
        depth: Producers already looked through (at ``MAX_DEPTH`` the bound is unknown).

    Returns:
        The bound (a constant's largest |x|, 1 for Sin/Cos/Tanh/Sigmoid/Erf/Softsign, Clip's
        limits, sums and products of bounded operands), pi for an argument this rule reduced,
        or None.
    """
    array = constant_array(value)
    if array is not None:
        finite = array.dtype.kind in "fiu" and bool(np.all(np.isfinite(array)))
        return float(np.max(np.abs(array), initial=0.0)) if finite else None
    node = value.producer() if value is not None else None
    if value is None or node is None or depth >= MAX_DEPTH or node.domain not in ("", "ai.onnx"):
        return None
    if _is_reduced(value):
        return math.pi
    op, ins = node.op_type, list(node.inputs)
    if op in UNIT_OPS:
        return 1.0
    if op in SAME_OPS or op in CAST_OPS:
        return bound(ins[0], depth + 1) if ins else None
    if op == "Clip":
        low, high = (bound(v, depth + 1) for v in (ins + [None, None])[1:3])
        return max(low, high) if low is not None and high is not None else None
    parts = [bound(v, depth + 1) for v in ins if v is not None]
    if None in parts or not parts:
        return None
    known = [float(p) for p in parts if p is not None]
    if op in ("Add", "Sub", "Sum"):
        return float(sum(known))
    if op == "Mul":
        return float(np.prod(known))
    if op in ("Concat", "Max", "Min"):
        return max(known)
    return None


def _is_reduced(value: ir.Value) -> bool:
    """Whether ``value`` is the x_r of an earlier application: Sub(_, Mul(Round(_), C2))."""
    node = value.producer()
    if node is None or node.op_type != "Sub" or node.inputs[1] is None:
        return False
    mul = node.inputs[1].producer()
    return mul is not None and mul.op_type == "Mul" and any(
        (a := constant_array(v)) is not None and a.size == 1 and np.float32(a.item()) == C2
        for v in mul.inputs)


def fp32_chain(value: ir.Value) -> tuple[list[ir.Node], list[str]]:
    """The producers of ``value`` that must compute in FP32 for it to keep its FP32 bits.

    Walks up through arithmetic with one activation operand (Mul, Div, Add, Sub by a constant;
    Neg), float Casts and data movement; keeps an arithmetic node of two activations but does not
    walk past it (a Snake activation's sin(a x) would otherwise pull the residual block behind x
    into FP32); stops at graph inputs, constants, non-float Casts and any other op.

    Args:
        value: The periodic argument.

    Returns:
        ``(nodes to keep FP32, descriptions of where the chain starts in the model's format)``;
        data-movement nodes are not listed (they follow their producer's storage).
    """
    keep: list[ir.Node] = []
    starts: list[str] = []
    seen: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        node = v.producer()
        if node is None or constant_array(v) is not None or id(node) in seen:
            continue
        seen.add(id(node))
        op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        if len(seen) > MAX_DEPTH or op not in CHAIN_MATH | CHAIN_MOVE | CAST_OPS:
            starts.append(describe_source(v))
            continue
        if op in CAST_OPS:
            keep.append(node)
            source = node.inputs[0]
            if source is not None and source.dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE):
                stack.append(source)
            continue
        if op in CHAIN_MATH:
            keep.append(node)
            operands = [i for i in node.inputs if i is not None and constant_array(i) is None]
            if len(operands) == 1:
                stack.append(operands[0])
            else:  # a product or sum of two activations: their producers keep their format
                starts.extend(describe_source(i) for i in operands)
        elif node.inputs and node.inputs[0] is not None:
            stack.append(node.inputs[0])
    return keep, starts


class ReducePeriodicArgument(TargetPass):
    """Pass: reduce every Sin/Cos/Tan argument that may exceed pi modulo 2 pi in FP32.

    Args:
        target: The reduced format the model is rewritten for; None: the pass does nothing.
        max_abs: Tensor name -> largest finite |x| on the calibration data in FP32; an
            argument measured below ``phase_limit(target)`` is left alone. None, or an
            argument not in it: the graph's bound decides.
    """

    rule: ClassVar[str] = "reduce-periodic-argument"

    def call(self, model: ir.Model) -> RewritePassResult:
        """Rewrite in place; one record per argument read by a Sin/Cos/Tan."""
        if self.target not in (Precision.FP16, Precision.BF16):
            return RewritePassResult(model, False, ())
        graph = model.graph
        taken = taken_names(graph)
        arguments: dict[ir.Value, list[ir.Node]] = {}
        for node in graph:
            if node.op_type in PERIODIC_OPS and node.domain in ("", "ai.onnx") and node.inputs:
                x = node.inputs[0]
                if x is not None:
                    arguments.setdefault(x, []).append(node)
        opset = default_opset(model)
        records = [self._try(graph, x, users, opset, taken) for x, users in arguments.items()]
        return RewritePassResult(model, any(r.applied for r in records), tuple(records))

    def _try(self, graph: ir.Graph, x: ir.Value, users: list[ir.Node], opset: int,
             taken: set[str]) -> RewriteRecord:
        names = tuple(n.name or "" for n in users)
        ops = "/".join(sorted({n.op_type for n in users}))
        if x.dtype not in (None, ir.DataType.FLOAT):
            return RewriteRecord(self.rule, False, names, (), f"the {ops} argument '{x.name}' is "
                                 f"{x.dtype}: only float32 arguments are rounded by a plan")
        if opset < ROUND_OPSET:
            return RewriteRecord(self.rule, False, names, (), f"opset {opset} has no Round "
                                 f"(needs >= {ROUND_OPSET})", {"opset": opset})
        if _is_reduced(x):
            return RewriteRecord(self.rule, False, names, (), f"the {ops} argument '{x.name}' "
                                 "is already reduced modulo 2 pi")
        limit = bound(x)
        if limit is not None and limit <= math.pi:
            return RewriteRecord(self.rule, False, names, (),
                                 f"|{x.name}| <= {limit:.4g} <= pi from the graph: the "
                                 "reduction would be the identity", {"bound": limit})
        measured = self.max_abs.get(x.name or "") if self.max_abs is not None else None
        assert self.target is not None  # call() returns early without one
        limit_data = phase_limit(self.target)
        if measured is not None and measured < limit_data:
            return RewriteRecord(self.rule, False, names, (),
                                 f"|{x.name}| <= {measured:.4g} on the calibration data, below "
                                 f"{limit_data:g} where {self.target.value.upper()}'s spacing "
                                 f"exceeds 2^-4 rad: the phase is kept without it",
                                 {"argument": x.name or "", "measured_max_abs": measured})
        chain, starts = fp32_chain(x)
        new = self._insert(graph, x, users, taken)
        keep = tuple(n.name or "" for n in [*new, *chain])
        origin = f"; the argument's FP32 chain starts at {', '.join(starts)}" if starts else ""
        range_ = "unknown from the graph" if limit is None else f"<= {limit:.4g}"
        fmt = self.target.value.upper() if self.target is not None else ""
        reason = (f"{ops} argument '{x.name}' (|x| {range_}) reduced to [-pi, pi] modulo 2 pi "
                  f"in FP32 before the {fmt} {ops}: {len(new)} new nodes "
                  f"and {len(chain)} producer(s) kept FP32{origin}")
        return RewriteRecord(self.rule, True, names, tuple(n.name or "" for n in new), reason,
                             {"bound": "unknown" if limit is None else limit,
                              "consumers": len(users), "fp32_producers": len(chain),
                              "argument": x.name or "",
                              **({} if measured is None else {"measured_max_abs": measured})},
                             keep)

    def _insert(self, graph: ir.Graph, x: ir.Value, users: list[ir.Node],
                taken: set[str]) -> list[ir.Node]:
        """Insert the six reduction nodes before the first user; rewire every user to x_r."""
        base = x.name or (users[0].name or "arg")
        consts = [add_initializer(graph, np.asarray(c, np.float32), unique_name(f"{base}_{s}",
                                                                             taken))
                  for c, s in ((INV_TWO_PI, "inv_2pi"), (C1, "2pi_hi"), (C2, "2pi_lo"))]
        inv, hi, lo = consts
        steps: list[ir.Node] = []

        def add(op: str, inputs: list[ir.Value], suffix: str) -> ir.Value:
            node = ir.Node("", op, inputs, name=unique_name(f"{base}/reduce_2pi/{suffix}", taken))
            out = node.outputs[0]
            out.name = unique_name(f"{base}_reduce_2pi_{suffix}", taken)
            out.dtype, out.shape = ir.DataType.FLOAT, x.shape
            steps.append(node)
            return out

        n = add("Round", [add("Mul", [x, inv], "turns")], "n")
        reduced = add("Sub", [add("Sub", [x, add("Mul", [n, hi], "n_hi")], "hi"),
                              add("Mul", [n, lo], "n_lo")], "reduced")
        graph.insert_before(users[0], steps)
        for user in users:
            user.replace_input_with(0, reduced)
        return steps
