"""Static hazard scan: what in the graph can break in the target precision, before running it.

Checks (all against the target format's limits, see ``precision_doctor.formats``):

* float parameters (initializers, Constant nodes) above the format max (finite values only: a
  constant of +-inf, such as a mask fill or an open clamp bound, is inf in every format and is
  no hazard), or non-zero values that flush to zero (below half the smallest subnormal, e.g.
  LayerNorm epsilon 1e-12 in FP16). An out-of-range constant's evidence says what each engine
  makes of it (``precision.constants``: a strongly typed Cast gives inf, the verdict's
  assumption; TensorRT and onnxconverter-common clamp) and whether it only masks
  (``masking_only``: ``saturate-constants`` clamps it in ``fix``);
* normalization epsilons (attributes) that flush to zero;
* decomposed LayerNorm (ReduceMean-Sub-Pow/Mul-ReduceMean-Add-Sqrt-Div/Reciprocal), whose
  squared deviations overflow FP16 when |x - mean| > 256 (= sqrt(65504));
* ops PyTorch autocast keeps in FP32 on CUDA (pow, exp, log, softmax, log_softmax, sum, prod,
  cumsum, reciprocal, rsqrt, norms: torch.amp "CUDA Ops that can autocast to float32");
* Clip bounds that are not representable (out of range, or rounded to another value);
* Div by a constant of magnitude < 1e-3 (amplifies by > 1000x).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import onnx

from precision_doctor.formats import FORMATS, FloatFormat, Precision, round_to
from precision_doctor.graph.constants import constant_values
from precision_doctor.graph.outputs import consumers
from precision_doctor.precision.constants import (
    ASSUMED,
    CONVERSIONS,
    clamping_engines,
    conversion_of,
    engines_on,
)
from precision_doctor.precision.rewrites.saturate import (
    MASK_DEPTH,
    MASK_MATH,
    MASK_MOVE,
    MASK_SINKS,
)

RISKY_OPS = {
    "Pow": "x^p overflows quickly (|x| > 256 squared exceeds FP16 max)",
    "Exp": "exp(x) overflows FP16 for x > 11.09",
    "Log": "log of flushed (zero) inputs is -inf",
    "Softmax": "exp of unnormalized logits; engines need FP32 internals",
    "LogSoftmax": "exp/log of logits",
    "ReduceSum": "sums grow with the reduced size",
    "ReduceSumSquare": "squares then sums: overflows early",
    "ReduceL2": "squares then sums",
    "ReduceProd": "products overflow/underflow",
    "ReduceLogSumExp": "exp of inputs",
    "CumSum": "running sums grow with length",
    "Reciprocal": "1/x of small values overflows",
}
SMALL_DIVISOR = 1e-3  # dividing by less than this amplifies values by > 1000x


@dataclass(frozen=True)
class Hazard:
    """A construct that may break in the target precision.

    Attributes:
        kind: ``parameter-out-of-range``, ``parameter-underflow``, ``epsilon-underflow``,
            ``decomposed-layernorm``, ``risky-op``, ``clip-bounds``, ``div-small-constant``.
        node: The node at risk.
        op_type: Its op type.
        tensor: The tensor to watch (the parameter, or the output that may overflow).
        detail: One sentence with the numbers.
        severity: ``high`` (breaks for sure), ``medium``, ``low`` (watch its measured range).
        nodes: Every node of a multi-node pattern (e.g. a decomposed LayerNorm).
        evidence: Numbers behind the detail.
    """

    kind: str
    node: str
    op_type: str
    tensor: str
    detail: str
    severity: str
    nodes: tuple[str, ...] = ()
    evidence: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["nodes"] = list(self.nodes)
        return d

    @classmethod
    def from_dict(cls, data: dict) -> Hazard:
        data = dict(data)
        data["nodes"] = tuple(data.get("nodes", ()))
        return cls(**data)


def _scan_parameters(model, fmt: FloatFormat, consts, readers) -> list[Hazard]:
    hazards = []
    for name, value in consts.items():
        if value.dtype.kind != "f" or value.size == 0:
            continue
        users = [n for n in readers.get(name, []) if n.op_type != "Constant"]
        if not users:
            continue
        a = np.abs(value.astype(np.float64))
        # +-inf (a mask fill, an open clamp bound) is inf in every format: not out of range
        a = a[np.isfinite(a)]
        if a.size == 0:
            continue
        vmax = float(a.max())
        nonzero = a[a > 0]
        flushed = int((nonzero < fmt.min_subnormal / 2).sum())
        for user in users:
            if vmax > fmt.max:
                over = int((a > fmt.max).sum())
                conversion = _engine_conversion(model, name, value, fmt, readers)
                hazards.append(Hazard(
                    "parameter-out-of-range", user.name, user.op_type, name,
                    f"{name} (input of {user.op_type} {user.name}) has {over} value(s) up to "
                    f"{vmax:.3g} > {fmt.name.upper()} max {fmt.max:g}: "
                    f"{conversion.pop('sentence')}",
                    "high", (user.name,), {"max_abs": vmax, "format_max": fmt.max,
                                           "count": over, "numel": int(value.size),
                                           **conversion}))
            if flushed:
                scalar = nonzero.size == flushed
                small = nonzero[nonzero < fmt.min_subnormal / 2]
                # Share of the tensor's L2 norm lost to flushing; below the format's unit
                # roundoff it is smaller than ordinary rounding and not worth a warning.
                lost = float(np.sqrt(np.dot(small, small) / np.dot(nonzero, nonzero)))
                severity = ("high" if scalar and user.op_type == "Add" else
                            "medium" if lost > fmt.unit_roundoff else "low")
                hazards.append(Hazard(
                    "parameter-underflow", user.name, user.op_type, name,
                    f"{name} (input of {user.op_type} {user.name}): {flushed} non-zero "
                    f"value(s) below {fmt.min_subnormal / 2:.3g} flush to zero in "
                    f"{fmt.name.upper()} (smallest {float(nonzero.min()):.3g}; "
                    f"{lost:.2g} of the tensor's L2 norm)", severity, (user.name,),
                    {"flushed": flushed, "nonzero": int(nonzero.size),
                     "min_nonzero_abs": float(nonzero.min()), "lost_l2_share": lost}))
    return hazards


def _engine_conversion(model, name: str, value: np.ndarray, fmt: FloatFormat,
                       readers) -> dict:
    """What each engine makes of the out-of-range constant ``name`` (``precision.constants``):
    the evidence (``value``, ``assumed``, ``engines``, ``clamped_by``, ``masking_only``) and
    the ``sentence`` of the hazard's detail."""
    x = np.asarray(value, np.float64).ravel()
    finite = x[np.isfinite(x)]
    extreme = float(finite[np.argmax(np.abs(finite))])
    target = _prec(fmt)
    words = engines_on(extreme, target)
    clamped_by = clamping_engines(target)
    masking = _masking_only(model, name, readers)
    cast = float(conversion_of(ASSUMED).convert(np.array([extreme], np.float32), target)[0])
    sentence = f"a strongly typed Cast makes them {cast:g} (this verdict's assumption)"
    if clamped_by:
        sign = -1.0 if extreme < 0 else 1.0
        clamps = [f"{CONVERSIONS[e].title} to {sign * CONVERSIONS[e].bound(target):g}"
                  for e in clamped_by]
        sentence += f"; {' and '.join(clamps)} clamp them, with a warning: no inf there"
        if any(n.op_type == "BatchNormalization" for n in readers.get(name, [])):
            sentence += " (TensorRT folds a BatchNorm into its convolution before converting)"
    else:
        sentence += f"; no engine is known to clamp them in {fmt.name.upper()}"
    if masking:
        sentence += ("; it only masks, so `fix` clamps it to the format's lowest finite value "
                     "(saturate-constants)")
    return {"value": extreme, "assumed": words[ASSUMED],
            "engines": "; ".join(words.values()), "clamped_by": ", ".join(clamped_by),
            "masking_only": masking, "sentence": sentence}


def _masking_only(model: onnx.ModelProto, name: str, readers) -> bool:
    """Whether every path from the tensor ``name`` only masks: through mask arithmetic and
    data movement into Softmax, Max, ReduceMax or a comparison (the rule of
    ``precision.rewrites.saturate``), never into a graph output or other arithmetic."""
    outputs = {o.name for o in model.graph.output}
    stack, seen, reached = [(name, 0)], set(), False
    while stack:
        tensor, depth = stack.pop()
        if tensor in outputs or depth >= MASK_DEPTH:
            return False
        for node in readers.get(tensor, []):
            if id(node) in seen:
                continue
            seen.add(id(node))
            if node.op_type in MASK_SINKS:
                reached = True
            elif node.op_type in MASK_MOVE or node.op_type in MASK_MATH:
                stack.extend((out, depth + 1) for out in node.output if out)
            else:
                return False
    return reached


def _scan_attributes(model, fmt: FloatFormat, consts) -> list[Hazard]:
    hazards = []
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.name == "epsilon" and 0 < attr.f < fmt.min_subnormal / 2:
                hazards.append(Hazard(
                    "epsilon-underflow", node.name, node.op_type, node.output[0],
                    f"{node.op_type} {node.name}: epsilon {attr.f:.3g} is 0 in "
                    f"{fmt.name.upper()} (needs FP32 internals)", "medium", (node.name,),
                    {"epsilon": float(attr.f)}))
        if node.op_type == "Clip":
            bounds = [consts.get(n) for n in node.input[1:3] if n]
            bounds += [np.array(a.f, np.float32) for a in node.attribute
                       if a.name in ("min", "max")]
            for b in (b for b in bounds if b is not None and b.dtype.kind == "f"):
                v = float(np.asarray(b, np.float64).ravel()[0])
                r = float(round_to(np.array([v], np.float32), _prec(fmt))[0])
                if r != np.float32(v):
                    hazards.append(Hazard(
                        "clip-bounds", node.name, node.op_type, node.output[0],
                        f"Clip {node.name}: bound {v:g} becomes {r:g} in {fmt.name.upper()}",
                        # a bound that becomes inf lay beyond every finite value of the format:
                        # it bounds the same finite values either way
                        "low", (node.name,),
                        {"bound": v, "rounded": r}))
        if node.op_type == "Div" and len(node.input) > 1 and node.input[1] in consts:
            d = np.abs(np.asarray(consts[node.input[1]], np.float64))
            if d.size and 0 < float(d.min()) < SMALL_DIVISOR:
                hazards.append(Hazard(
                    "div-small-constant", node.name, node.op_type, node.output[0],
                    f"Div {node.name} divides by {float(d.min()):.3g}: outputs overflow "
                    f"{fmt.name.upper()} when |x| > {fmt.max * float(d.min()):.3g}", "medium",
                    (node.name,), {"divisor": float(d.min())}))
        if node.op_type in RISKY_OPS:
            hazards.append(Hazard("risky-op", node.name, node.op_type, node.output[0],
                                  f"{node.op_type} {node.name}: {RISKY_OPS[node.op_type]}",
                                  "low", (node.name,)))
    return hazards


def _prec(fmt: FloatFormat) -> Precision:
    return next(p for p, f in FORMATS.items() if f is fmt)


def find_decomposed_layernorms(model: onnx.ModelProto) -> list[dict]:
    """Decomposed LayerNorm patterns: ReduceMean(x) -> Sub -> Pow(2)|Mul -> ReduceMean ->
    Add(eps) -> Sqrt -> Div | Reciprocal+Mul.

    Returns:
        One dict per match: ``nodes`` (names in order), ``square`` (the Pow/Mul node name),
        ``square_output``, ``output`` (normalized tensor), ``epsilon`` (float or None).
    """
    consts = constant_values(model)
    readers = consumers(model)
    matches = []

    def only(nodes, op):
        return next((n for n in nodes if n.op_type == op), None)

    for r1 in (n for n in model.graph.node if n.op_type == "ReduceMean"):
        x = r1.input[0]
        sub = next((n for n in readers[r1.output[0]]
                    if n.op_type == "Sub" and list(n.input) == [x, r1.output[0]]), None)
        if sub is None:
            continue
        d = sub.output[0]
        sq = next((n for n in readers[d] if (n.op_type == "Pow") or
                   (n.op_type == "Mul" and list(n.input) == [d, d])), None)
        if sq is None:
            continue
        r2 = only(readers[sq.output[0]], "ReduceMean")
        add = only(readers[r2.output[0]], "Add") if r2 else None
        sqrt = only(readers[add.output[0]], "Sqrt") if add else None
        if add is None or sqrt is None:
            continue
        div = next((n for n in readers[sqrt.output[0]] if n.op_type == "Div"), None)
        tail = [div] if div else []
        if div is None:
            rec = only(readers[sqrt.output[0]], "Reciprocal")
            mul = only(readers[rec.output[0]], "Mul") if rec else None
            tail = [rec, mul] if mul else []
        if not tail:
            continue
        eps_name = next((i for i in add.input if i in consts), None)
        eps = float(np.asarray(consts[eps_name]).ravel()[0]) if eps_name else None
        nodes = [r1, sub, sq, r2, add, sqrt, *tail]
        matches.append({"nodes": tuple(n.name for n in nodes), "square": sq.name,
                        "square_output": sq.output[0], "output": tail[-1].output[0],
                        "epsilon": eps})
    return matches


def scan_hazards(model: onnx.ModelProto, target: Precision) -> list[Hazard]:
    """All static hazards of ``model`` for ``target``, high severity first, then graph order.

    Args:
        model: FP32 model.
        target: FP16, BF16 or TF32 (TF32 only reports range-independent op hazards).

    Returns:
        Hazards (deterministic order).
    """
    fmt = FORMATS[target]
    consts = constant_values(model)
    readers = consumers(model)
    hazards = _scan_parameters(model, fmt, consts, readers) if target in (
        Precision.FP16, Precision.BF16) else []
    hazards += _scan_attributes(model, fmt, consts)
    for m in find_decomposed_layernorms(model):
        eps = m["epsilon"]
        eps_note = ""
        if eps is not None and 0 < eps < fmt.min_subnormal / 2:
            eps_note = f"; epsilon {eps:.3g} flushes to 0"
        hazards.append(Hazard(
            "decomposed-layernorm", m["square"], "Pow", m["square_output"],
            f"decomposed LayerNorm ({len(m['nodes'])} nodes, ending at {m['nodes'][-1]}): the "
            f"squared deviation overflows {fmt.name.upper()} when |x - mean| > "
            f"{np.sqrt(fmt.max):.4g}{eps_note}", "medium", m["nodes"],
            {"epsilon": eps if eps is not None else "unknown"}))
    order = {n.name: i for i, n in enumerate(model.graph.node)}
    rank = {"high": 0, "medium": 1, "low": 2}
    hazards.sort(key=lambda h: (rank[h.severity], order.get(h.node, 0), h.kind, h.tensor))
    return hazards
