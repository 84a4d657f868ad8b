"""Name the mechanism behind a measured cure, from measured quantities (the taxonomy).

A node enters here because a measurement singled it out: its FP32 fallback removed output
error (attribution, ``diagnosis.causes.attribution``), or it magnifies the error it receives (local
gain >= ``AMPLIFYING``). The rules below read what was measured at the node on the worst sample
(``NodeFacts``: its FP32 operands and result, the candidate's operands, the local gain) and
name *why* it breaks. Every rule compares a condition number with the measured gain: the
mechanism is named only when it accounts for the amplification actually seen
(``kappa >= gain / EXPLAINS``). Sources: N. J. Higham, "Accuracy and Stability of Numerical
Algorithms", 2nd ed., SIAM 2002 (cited by section).

Taxonomy, checked in this order (range events, found by ``diagnosis.causes.findings``, come first):

``periodic-argument``
    Sin/Cos/Tan whose argument is so large that the target format's spacing there exceeds
    ``PHASE_SPACING`` = 2^-4 rad: rounding the argument (by up to half a spacing) shifts the
    phase by up to 2^-4 rad = 0.0625 rad (3.6 degrees) or more, which moves sin/cos by up to
    6% of their amplitude, six times the default FP16 tolerance of 1e-2. The spacing at |x| is
    2u * 2^floor(log2 |x|) (u: unit roundoff), so the phase is lost from |x| >= 128 in FP16
    (spacing 2^-3 there; 2^-4 at 64..128) and from |x| >= 16 in BF16 (spacing 2^(4-7)). A
    sinusoidal timestep embedding ``sin(t * 10000^(-i/d))`` with t up to 1000 reaches 1000 rad,
    where FP16's spacing is 0.5 rad. Checked first and whatever the gain: the loss is the
    argument's rounding, not an amplification. Cure: the argument computed and kept in FP32
    through the Sin/Cos (its producers and the periodic ops in FP32), or the safe rewrite
    ``reduce-periodic-argument`` (range reduction modulo 2*pi in FP32 before the cast), which
    ``precision-doctor fix`` applies.
``tf32``
    MatMul/Gemm/Conv whose multiplicands the engine rounds to TF32 (10 mantissa bits; target
    ``tf32`` or an engine with TF32 on): the products carry u = 2^-11 relative error each,
    amplified by the dot product's condition number (below). Checked before the other rules:
    turning TF32 off is the remedy whatever amplifies it.
``cancellation``
    Add/Sub/Sum/ReduceSum/ReduceMean, or the dot products of MatMul/Gemm, whose result is much
    smaller than its operands. Condition number of a sum (Higham §1.7, §4.2): kappa =
    || sum |x_i| || / || sum x_i || (normwise over the output; for A B: || |A| |B| || /
    || A B ||); rounding of the operands (relative u) comes out relative kappa * u. Example: a
    variance computed as E[x^2] - E[x]^2.
``small-divisor``
    Div (its divisor), Reciprocal, or Pow with a negative exponent, whose output error is
    ``gain`` times its input's. x -> 1/x has relative condition number 1 (Higham §1.6), so a
    normwise gain can only come from divisors whose small elements carry large relative errors:
    an inaccurate small value (often the result of a cancellation, or a flushed epsilon).
``exponent-amplification``
    Exp / Softmax (kappa = the output-weighted |x|: d exp(x) / exp(x) = dx, so a relative error
    e in x becomes |x| e) and Pow (kappa = |p|); Higham §1.6, condition number |x f'(x)/f(x)|.
``saturation``
    Sigmoid/Tanh/Softmax/HardSigmoid/Erf with at least ``SATURATED_SHARE`` of the outputs within
    ``SATURATION_ULPS`` units in the last place of +-1: the format cannot tell 1 - y
    apart there, and a consumer that reads 1 - y, log(y) or divides by it (measured gain >=
    ``AMPLIFYING`` downstream in the same cure) magnifies the loss.
``long-reduction``
    ReduceSum/ReduceMean/ReduceL1/ReduceL2/ReduceSumSquare/ReduceLogSumExp/MatMul/Gemm/Conv
    over K >= 1/sqrt(u) terms (46 for FP16) with gain <= K, on an engine that stores partial
    sums in the low format: a sum of K rounded terms has a worst-case error of gamma_K =
    K u / (1 - K u) (Higham Lemma 3.1, §4.2) and a typical one of sqrt(K) u. The emulator
    accumulates in FP32 (as tensor-core kernels do), so emulated diagnoses never name it.
``unnamed-mechanism``
    No rule accounts for the gain: said plainly, with the node, the gain and the measured cure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from precision_doctor.numbers import fmt3

AMPLIFYING = 4.0  # local gain from which a node counts as amplifying (rounding alone: ~1-2)
EXPLAINS = 2.0  # a condition number within 2x of the gain accounts for it (measured spread)
SATURATED_SHARE = 0.01
SATURATION_ULPS = 4
SUM_OPS = frozenset({"Add", "Sub", "Sum", "ReduceSum", "ReduceMean"})
DIVISION_OPS = frozenset({"Div", "Reciprocal", "Pow"})
EXPONENT_OPS = frozenset({"Exp", "Softmax", "Pow"})
SATURATING_OPS = frozenset({"Sigmoid", "Tanh", "Softmax", "HardSigmoid", "Erf"})
REDUCTION_OPS = frozenset({"ReduceSum", "ReduceMean", "ReduceL1", "ReduceL2", "ReduceSumSquare",
                           "ReduceLogSumExp", "MatMul", "Gemm", "Conv", "ConvTranspose"})
TF32_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose"})
ORDER = ("periodic-argument", "saturation", "tf32", "cancellation", "small-divisor",
         "exponent-amplification", "long-reduction")
DOT_OPS = frozenset({"MatMul", "Gemm"})
PERIODIC_OPS = frozenset({"Sin", "Cos", "Tan"})
PHASE_SPACING = 2.0 ** -4  # rad: a larger spacing of the argument loses the phase (docstring)
# Producers of a periodic argument its cure keeps in FP32, nearest first: a timestep
# embedding's argument has 1-6 (Cast, Unsqueeze, Mul, and Range/Mul/Exp of the frequencies when
# the exporter computes them); 16 keeps the cure local when the argument comes from deep inside
MAX_CONE = 16

REMEDIES = {
    "cancellation":
        "keep {nodes} in FP32, or compute it without subtracting nearly equal values: a "
        "variance E[x^2] - E[x]^2 becomes the two-pass E[(x - E[x])^2], or one fused "
        "LayerNormalization (opset >= 17, FP32 statistics in engines; `precision-doctor fix` "
        "fuses the standard decomposed pattern)",
    "small-divisor":
        "keep {nodes} in FP32 (the divisor and what computes it), or keep the divisor away "
        "from zero (add the epsilon before the square root or division)",
    "exponent-amplification":
        "keep {nodes} in FP32, or bring the exponent's argument down (subtract the row max "
        "before Exp; compute in log space)",
    "saturation":
        "keep {nodes} in FP32, or read the logits instead of the saturated value (log-sigmoid, "
        "log-softmax, losses with logits)",
    "long-reduction":
        "accumulate {nodes} in FP32 (engines: keep the node FP32), or reduce in chunks",
    "tf32":
        "disable TF32 for {nodes} (trtexec --noTF32, ONNX Runtime CUDA use_tf32=0) or keep "
        "them in FP32",
    "periodic-argument":
        "compute the argument in FP32 and keep it FP32 through the periodic op: keep {nodes} "
        "in FP32, or reduce the argument modulo 2*pi in FP32 before the cast (the safe rewrite "
        "reduce-periodic-argument, which `precision-doctor fix` applies)",
    "unnamed-mechanism":
        "keep {nodes} in FP32; `precision-doctor fix` searches the smallest such set",
}


@dataclass(frozen=True)
class NodeFacts:
    """What was measured at one node on one sample (float64 arrays, ``None`` where absent).

    Attributes:
        node / op_type: The ONNX node.
        gain: Local error gain (``layerwise.gain``); 0.0 when not measured.
        ref_inputs / cand_inputs: Its floating inputs, FP32 reference and candidate.
        ref_output: Its first output, FP32 reference.
        axes: Reduced axes of a Reduce* / Softmax node (None: all, or not a reduction).
        exponent: Pow's constant exponent, if any.
        reduced: K, the terms each output element sums (MatMul/Gemm/Conv/Reduce*), or None.
        unit_roundoff: u of the target format (TF32: 2^-11).
        tf32: Whether the engine rounds this node's multiplicands to TF32.
        downstream_gain: The largest gain among the node's consumers in the same cure.
        fp32_accumulation: The candidate accumulates sums in FP32 (the emulator).
    """

    node: str
    op_type: str
    gain: float = 0.0
    ref_inputs: Sequence[np.ndarray | None] = ()
    cand_inputs: Sequence[np.ndarray | None] = ()
    ref_output: np.ndarray | None = None
    axes: tuple[int, ...] | None = None
    exponent: float | None = None
    reduced: int | None = None
    unit_roundoff: float = 2.0 ** -11
    tf32: bool = False
    downstream_gain: float = 0.0
    fp32_accumulation: bool = True


@dataclass(frozen=True)
class Named:
    """A mechanism named for a node: the taxonomy entry, the rule's numbers, the remedy."""

    kind: str
    node: str
    op_type: str
    rule: str
    evidence: dict = field(default_factory=dict)


def _norm(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(np.sqrt(np.dot(x.ravel(), x.ravel()))) if x.size else 0.0


def cancellation_condition(op_type: str, inputs: Sequence[np.ndarray | None],
                           axes: tuple[int, ...] | None = None) -> float | None:
    """kappa = || sum |x_i| || / || sum x_i || of a sum (Higham §4.2), or None.

    Args:
        op_type: Add, Sub, Sum, ReduceSum, ReduceMean, MatMul or Gemm.
        inputs: The FP32 operands (broadcastable); a reduction's data input first.
        axes: Reduced axes (None: all).
    """
    ops = [np.asarray(x, np.float64) for x in inputs if x is not None]
    if op_type in DOT_OPS and len(ops) >= 2 and ops[0].ndim >= 2 and ops[1].ndim >= 2:
        a, b = ops[0], ops[1]
        if op_type == "Gemm":  # transposes are the caller's: plain 2-D A B only
            if a.shape[-1] != b.shape[0]:
                return None
        signed, absolute = np.matmul(a, b), np.matmul(np.abs(a), np.abs(b))
    elif op_type in ("Add", "Sub", "Sum") and len(ops) >= 2:
        ops = list(np.broadcast_arrays(*ops))
        signed = ops[0] - ops[1] if op_type == "Sub" else np.sum(ops, axis=0)
        absolute = np.sum(np.abs(ops), axis=0)
    elif op_type in ("ReduceSum", "ReduceMean") and ops:
        signed = np.sum(ops[0], axis=axes)
        absolute = np.sum(np.abs(ops[0]), axis=axes)
    else:
        return None
    result = _norm(np.asarray(signed))
    return _norm(np.asarray(absolute)) / result if result > 0 else math.inf


def exponent_condition(op_type: str, x: np.ndarray | None, y: np.ndarray | None,
                       exponent: float | None = None) -> float | None:
    """Relative condition number of Exp/Softmax (output-weighted |x|) or Pow (|p|), or None."""
    if op_type == "Pow":
        return abs(exponent) if exponent is not None else None
    if op_type not in ("Exp", "Softmax") or x is None or y is None:
        return None
    x, y = np.broadcast_arrays(np.asarray(x, np.float64), np.asarray(y, np.float64))
    ny = _norm(y)
    return _norm(np.abs(x) * y) / ny if ny > 0 else None


def saturated_share(op_type: str, y: np.ndarray | None, unit_roundoff: float) -> float | None:
    """Share of the outputs of a saturating op within ``SATURATION_ULPS`` ULPs of +-1 (the ULP
    just below 1 is ``unit_roundoff``), or None for other ops."""
    if op_type not in SATURATING_OPS or y is None or np.asarray(y).size == 0:
        return None
    a = np.abs(np.asarray(y, np.float64))
    near_one = a >= 1.0 - SATURATION_ULPS * unit_roundoff
    return float(np.mean(near_one))


def divisor_error(op_type: str, ref: Sequence[np.ndarray | None],
                  cand: Sequence[np.ndarray | None]) -> dict | None:
    """Evidence of an inaccurate small divisor: the smallest |divisor| (FP32) and the
    componentwise relative error of the candidate's divisor at its smallest 1% elements."""
    index = 1 if op_type == "Div" else 0
    if op_type not in DIVISION_OPS or len(ref) <= index or ref[index] is None:
        return None
    r = np.abs(np.asarray(ref[index], np.float64)).ravel()
    out: dict = {"min_abs_divisor": float(r.min()) if r.size else math.nan}
    if len(cand) > index and cand[index] is not None and r.size:
        c = np.asarray(cand[index], np.float64).ravel()
        if c.shape == r.shape:
            small = r <= np.quantile(r, 0.01)
            with np.errstate(divide="ignore", invalid="ignore"):
                err = np.abs(np.abs(c[small]) - r[small]) / r[small]
            err = err[np.isfinite(err)]
            out["small_divisor_rel_error"] = float(err.max()) if err.size else math.inf
    return out


def spacing(x: float, unit_roundoff: float) -> float:
    """The format's spacing (ULP) at ``|x|``: ``2u * 2^floor(log2 |x|)`` for a normal number
    (``u``: unit roundoff, 2^-11 for FP16); 0.0 for x = 0 or a non-finite x."""
    a = abs(float(x))
    if a == 0 or not math.isfinite(a):
        return 0.0
    return 2.0 * unit_roundoff * 2.0 ** math.floor(math.log2(a))


def phase_limit(unit_roundoff: float) -> float:
    """The smallest |argument| whose spacing exceeds ``PHASE_SPACING``: 128 for FP16 (u =
    2^-11), 16 for BF16 (u = 2^-8)."""
    return 2.0 ** (math.floor(math.log2(PHASE_SPACING / (2.0 * unit_roundoff))) + 1)


def periodic_rule(op_type: str, x_max: float, unit_roundoff: float) -> str | None:
    """The ``periodic-argument`` sentence when ``op_type`` is periodic and its largest
    |argument| ``x_max`` loses the phase in the format (module docstring), else None."""
    step = spacing(x_max, unit_roundoff)
    if op_type not in PERIODIC_OPS or step <= PHASE_SPACING:
        return None
    return (f"the argument reaches {fmt3(x_max)} rad, where the format's spacing is "
            f"{fmt3(step)} rad (> 2^-4 rad from |x| >= {phase_limit(unit_roundoff):g}): "
            "rounding the argument loses the phase")


def name_mechanism(facts: NodeFacts) -> Named | None:
    """The first taxonomy rule (module docstring, ``ORDER``) that accounts for ``facts.gain``.

    Returns:
        The ``Named`` mechanism, or None when no rule accounts for the measured gain.
    """
    u, g = facts.unit_roundoff, facts.gain
    op = facts.op_type
    ref = list(facts.ref_inputs)
    arg = ref[0] if ref and ref[0] is not None else None
    finite = arg[np.isfinite(arg)] if arg is not None else None
    if finite is not None and finite.size and op in PERIODIC_OPS:
        x_max = float(np.max(np.abs(finite)))
        rule = periodic_rule(op, x_max, u)
        if rule is not None:
            return Named("periodic-argument", facts.node, op, rule,
                         {"argument_max_abs": x_max, "spacing": spacing(x_max, u), "gain": g})
    sat = saturated_share(op, facts.ref_output, u)
    if sat is not None and sat >= SATURATED_SHARE and facts.downstream_gain >= AMPLIFYING:
        return Named("saturation", facts.node, op,
                     f"{sat:.1%} of its outputs lie within {SATURATION_ULPS} ULPs of 1 and a "
                     f"consumer amplifies the loss {fmt3(facts.downstream_gain)}x",
                     {"saturated_share": sat, "downstream_gain": facts.downstream_gain})
    if g < AMPLIFYING:
        return None
    k = facts.reduced
    if op in TF32_OPS and facts.tf32:
        return Named("tf32", facts.node, op,
                     f"the engine rounds its multiplicands to TF32 (u = 2^-11) over K = "
                     f"{k or '?'} terms; local gain {fmt3(g)}x", {"reduced": k or 0, "gain": g})
    kappa = (cancellation_condition(op, ref, facts.axes) if op in SUM_OPS | DOT_OPS
             else None)
    if kappa is not None and kappa >= max(AMPLIFYING, g / EXPLAINS):
        return Named("cancellation", facts.node, op,
                     f"its result is {fmt3(kappa)}x smaller than its operands (condition "
                     f"number kappa = {fmt3(kappa)}, kappa*u = {fmt3(kappa * u)}; local gain "
                     f"{fmt3(g)}x)",
                     {"kappa": kappa, "kappa_u": kappa * u, "gain": g})
    if op in DIVISION_OPS and not (op == "Pow" and (facts.exponent or 0) >= 0):
        ev = divisor_error(op, ref, facts.cand_inputs) or {}
        return Named("small-divisor", facts.node, op,
                     f"it divides by values as small as "
                     f"{fmt3(ev.get('min_abs_divisor', math.nan))} that carry large relative "
                     f"errors; 1/x is perfectly conditioned, so its "
                     f"{fmt3(g)}x normwise gain comes from those inaccurate small divisors",
                     {**ev, "gain": g})
    x = ref[0] if ref else None
    kappa = exponent_condition(op, x, facts.ref_output, facts.exponent)
    if kappa is not None and kappa >= max(AMPLIFYING, g / EXPLAINS):
        return Named("exponent-amplification", facts.node, op,
                     f"its condition number is {fmt3(kappa)} ({'|p|' if op == 'Pow' else '|x|'}: "
                     f"a relative error e in the input comes out {fmt3(kappa)} e; local gain "
                     f"{fmt3(g)}x)", {"kappa": kappa, "gain": g})
    if (op in REDUCTION_OPS and k and k >= 1 / math.sqrt(u) and g <= k
            and not facts.fp32_accumulation):
        return Named("long-reduction", facts.node, op,
                     f"each output sums K = {k} terms: worst-case error K*u = {fmt3(k * u)}, "
                     f"typical sqrt(K)*u = {fmt3(math.sqrt(k) * u)}; local gain {fmt3(g)}x",
                     {"reduced": k, "k_u": k * u, "gain": g})
    return None


def remedy(kind: str, nodes: Sequence[str]) -> str:
    """The remedy text of a taxonomy entry for ``nodes`` (names shortened past three)."""
    shown = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
    return REMEDIES.get(kind, REMEDIES["unnamed-mechanism"]).format(nodes=shown or "them")


__all__ = ["AMPLIFYING", "PERIODIC_OPS", "NodeFacts", "Named", "cancellation_condition",
           "divisor_error", "exponent_condition", "name_mechanism", "periodic_rule",
           "phase_limit", "remedy", "saturated_share", "spacing"]
