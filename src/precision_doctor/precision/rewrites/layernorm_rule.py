"""The decomposed-LayerNorm pattern as an onnxscript rewrite rule: pattern, check, rewrite.

    mean = ReduceMean(x); d = x - mean; var = ReduceMean(d^2)       (d^2: Pow(d, 2) or Mul(d, d))
    y = d / Sqrt(var + eps)   (or d * Reciprocal(Sqrt(var + eps)))  [* gamma] [+ beta]
    => LayerNormalization(x, gamma or 1, beta or 0, axis=-k, epsilon=eps)   (ONNX opset 17)

onnxscript 0.7 ships ``rules/fusion/_layer_norm.py``, but its pattern only matches ReduceMean
with ``axes`` as an *input* (opset >= 18) over the last axis, and requires the ``Mul(gamma)``;
exporters at opset 12-17 (PP-OCRv4 rec) write ``axes`` as an attribute. This rule follows the
library's structure and adds: attribute or input axes, several trailing axes, optional
gamma/beta, and a reason for every check that fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter.pattern import MatchResult

from precision_doctor.precision.rewrites.graph_edit import constant_array, describe_source

# LayerNormalization (opset 17) input types T: float16, bfloat16, float, double.
LAYER_NORM_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16,
                              ir.DataType.DOUBLE})

Dims = tuple[int | None, ...]


class ShapeOracle:
    """Dtype and dims of values, from the IR or (lazily, once) from ONNX shape inference.

    Args:
        model: The model the values belong to; serialized and shape-inferred on first need
            (the model itself is not changed).
    """

    def __init__(self, model: ir.Model) -> None:
        self._model = model
        self._inferred: dict[str, tuple[int, Dims]] | None = None

    def _infer(self) -> dict[str, tuple[int, Dims]]:
        if self._inferred is None:
            import onnx

            table: dict[str, tuple[int, Dims]] = {}
            try:
                proto = onnx.shape_inference.infer_shapes(ir.serde.serialize_model(self._model))
            except Exception:  # noqa: BLE001 - > 2 GB or uninferable: dims unknown
                self._inferred = table
                return table
            for vi in [*proto.graph.input, *proto.graph.value_info, *proto.graph.output]:
                t = vi.type.tensor_type
                if t.HasField("shape"):
                    dims = tuple(d.dim_value if d.HasField("dim_value") else None
                                 for d in t.shape.dim)
                    table[vi.name] = (int(t.elem_type), dims)
            self._inferred = table
        return self._inferred

    def dtype_and_dims(self, value: ir.Value) -> tuple[ir.DataType | None, Dims | None]:
        """``(dtype, dims)``; dims None when the rank is unknown, a dim None when symbolic."""
        if value.shape is not None and value.dtype is not None:
            return value.dtype, tuple(d if isinstance(d, int) else None for d in value.shape)
        found = self._infer().get(value.name or "")
        if found is None:
            return value.dtype, None
        return value.dtype or ir.DataType(found[0]), found[1]


@dataclass
class LayerNormPlan:
    """What ``check`` decided for one match, consumed by ``rewrite``."""

    axis: int
    epsilon: float
    stash_type: int
    scale: ir.Value | np.ndarray
    bias: ir.Value | np.ndarray | None
    dropped: list[ir.Value] = field(default_factory=list)


def _reduce_axes(node: ir.Node) -> list[int] | None | str:
    """ReduceMean axes (attribute before opset 18, input from 18); None = all; str = reason."""
    attr = node.attributes.get("axes")
    if attr is not None:
        return list(attr.as_ints())
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = constant_array(node.inputs[1])
        if axes is None:
            return f"ReduceMean '{node.name}' axes are not a constant"
        return [int(a) for a in axes.reshape(-1)]
    noop = node.attributes.get("noop_with_empty_axes")
    if noop is not None and noop.as_int():
        return f"ReduceMean '{node.name}' has empty axes with noop_with_empty_axes=1"
    return None


def _trailing_count(axes: list[int] | None, rank: int | None) -> int | str:
    """k when ``axes`` are the last k axes of a rank-``rank`` tensor, else the reason."""
    if axes is None:
        if rank is None:
            return "ReduceMean reduces all axes and the input rank is unknown"
        return rank
    if rank is None:
        if all(a < 0 for a in axes) and sorted(axes) == list(range(-len(axes), 0)):
            return len(axes)
        return f"ReduceMean axes {axes} need the input rank, which is unknown"
    positive = sorted(a % rank for a in axes)
    if positive != list(range(rank - len(axes), rank)):
        return (f"ReduceMean axes {axes} are not the trailing axes of the rank-{rank} input "
                "(LayerNormalization normalizes from one axis to the last)")
    return len(axes)


def _affine(value: ir.Value | None, label: str, normalized: Dims, fill: float,
            dtype: np.dtype) -> ir.Value | np.ndarray | str:
    """gamma/beta as the existing value (already the normalized shape) or a materialized array."""
    if value is None:
        if any(d is None for d in normalized):
            return f"{label} is absent and the normalized dims {list(normalized)} are not static"
        return np.full(tuple(normalized), fill, dtype=dtype)  # type: ignore[arg-type]
    array = constant_array(value)
    if array is None:
        return f"{label} is not a constant ({describe_source(value)})"
    shape = list(array.shape)
    while len(shape) > len(normalized) and shape[0] == 1:
        shape.pop(0)
    if len(shape) > len(normalized):
        return f"{label} of shape {list(array.shape)} varies over non-normalized axes"
    if any(d is None for d in normalized):
        if len(shape) != len(normalized) or any(s == 1 for s in shape):
            return f"normalized dims {list(normalized)} are not static and {label} " \
                   f"{list(array.shape)} does not give them"
        target = tuple(shape)
    else:
        target = tuple(int(d) for d in normalized if d is not None)
    try:
        full = np.broadcast_to(array.reshape(shape), target)
    except ValueError:
        return f"{label} of shape {list(array.shape)} does not broadcast over the normalized " \
               f"dims {list(target)}"
    if tuple(array.shape) == target:
        return value
    return np.ascontiguousarray(full)


class DecomposedLayerNorm(pattern.RewriteRuleClassBase):
    """One variant of the decomposed LayerNorm (with/without ``* gamma``, ``+ beta``).

    Args:
        with_scale: The pattern ends with ``Mul(normalized, gamma)``.
        with_bias: The pattern ends with ``Add(..., beta)``.
        reciprocal: ``d * Reciprocal(std)`` instead of ``d / std`` (two rules, because the
            onnxscript matcher cannot return an ``OrValue`` as the pattern output).
        shapes: Shape oracle of the model being rewritten.
        failures: Sink for check failures: ``(mean node, var node) -> (matched nodes, reason)``.
    """

    def __init__(self, with_scale: bool, with_bias: bool, reciprocal: bool, shapes: ShapeOracle,
                 failures: dict[tuple[ir.Node, ir.Node], tuple[list[ir.Node], str]]) -> None:
        super().__init__(name=f"fuse-layernorm(scale={with_scale},bias={with_bias},"
                              f"reciprocal={reciprocal})")
        self.with_scale = with_scale
        self.with_bias = with_bias
        self.reciprocal = reciprocal
        self.shapes = shapes
        self.failures = failures
        self.plan: LayerNormPlan | None = None

    def pattern(self, op, x, exponent, epsilon, gamma, beta):
        mean = op.ReduceMean(x, _allow_other_inputs=True, _outputs=["mean"])
        d = op.Sub(x, mean)
        square = pattern.OrValue([op.Pow(d, exponent), op.Mul(d, d)], tag_var="square",
                                 tag_values=["pow", "mul"])
        var = op.ReduceMean(square, _allow_other_inputs=True, _outputs=["var"])
        std = op.Sqrt(op.Add(var, epsilon))
        y = op.Mul(d, op.Reciprocal(std)) if self.reciprocal else op.Div(d, std)
        if self.with_scale:
            y = op.Mul(y, gamma)
        if self.with_bias:
            y = op.Add(y, beta)
        return y

    def check(self, context, x, exponent, epsilon, gamma, beta, mean, var,  # type: ignore[override]
              square, **_) -> MatchResult:
        """Check axes, epsilon, exponent, dtype and gamma/beta; record the reason on failure."""
        result = MatchResult()
        reason = self._check(x, exponent, epsilon, gamma, beta, mean, var, square)
        if reason is None:
            return result
        key = (mean.producer(), var.producer())
        self.failures.setdefault(key, (list(context.nodes), reason))
        self.plan = None
        return result.fail(reason)

    def _check(self, x, exponent, epsilon, gamma, beta, mean, var, square) -> str | None:
        dtype, dims = self.shapes.dtype_and_dims(x)
        if dtype is not None and dtype not in LAYER_NORM_TYPES:
            return f"input '{x.name}' has dtype {dtype}, LayerNormalization needs a float type"
        nodes = (mean.producer(), var.producer())
        axes = [_reduce_axes(n) for n in nodes]
        for a in axes:
            if isinstance(a, str):
                return a
        for n in nodes:
            keepdims = n.attributes.get("keepdims")
            if keepdims is not None and not keepdims.as_int():
                return f"ReduceMean '{n.name}' has keepdims=0"
        rank = None if dims is None else len(dims)
        counts = [_trailing_count(a, rank) for a in axes]  # type: ignore[arg-type]
        for c in counts:
            if isinstance(c, str):
                return c
        if counts[0] != counts[1]:
            return f"the mean reduces axes {axes[0]} but the variance reduces {axes[1]}"
        if square == "pow":
            e = constant_array(exponent)
            if e is None or e.size != 1 or float(e.reshape(-1)[0]) != 2.0:
                return f"Pow exponent is not the constant 2 ({describe_source(exponent)})" \
                    if e is None else f"Pow exponent is {e.reshape(-1).tolist()}, not 2"
        eps = constant_array(epsilon)
        if eps is None or eps.size != 1 or not np.issubdtype(eps.dtype, np.floating):
            return f"epsilon is not a float scalar constant ({describe_source(epsilon)})"
        k = int(counts[0])
        normalized: Dims = tuple(dims[-k:]) if dims is not None else (None,) * k
        np_dtype = ir.DataType(dtype).numpy() if dtype is not None else eps.dtype
        scale = _affine(gamma if self.with_scale else None, "gamma", normalized, 1.0, np_dtype)
        if isinstance(scale, str):
            return scale
        bias = _affine(beta, "beta", normalized, 0.0, np_dtype) if self.with_bias else None
        if isinstance(bias, str):
            return bias
        dropped = [exponent, epsilon] + [v for v, a in ((gamma, scale), (beta, bias))
                                         if v is not None and isinstance(a, np.ndarray)]
        stash = ir.DataType.DOUBLE if dtype == ir.DataType.DOUBLE else ir.DataType.FLOAT
        self.plan = LayerNormPlan(-k, float(eps.reshape(-1)[0]), int(stash), scale, bias, dropped)
        return None

    def rewrite(self, op, x, **_):
        """``LayerNormalization(x, scale, bias)`` from the plan ``check`` made."""
        plan = self.plan
        assert plan is not None, "check() must succeed before rewrite()"
        inputs = [x]
        for label, v in (("scale", plan.scale), ("bias", plan.bias)):
            if isinstance(v, np.ndarray):
                v = op.initializer(ir.tensor(v), name=f"{x.name}_layernorm_{label}")
            if v is not None:
                inputs.append(v)
        return op.LayerNormalization(*inputs, axis=plan.axis, epsilon=plan.epsilon,
                                     stash_type=plan.stash_type)
