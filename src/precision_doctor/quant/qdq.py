"""Write Q/DQ pairs into a model: the quantized model an engine builds (TensorRT explicit
quantization, ONNX Runtime's QDQ path), and the exact emulation of it.

Activations: ``QuantizeLinear -> DequantizeLinear`` with a per-tensor scale ``amax / qmax``
(``quant.qformats``), zero point 0 (symmetric). Weights: stored quantized (INT8 or FP8
initializers), per output channel, with a ``DequantizeLinear`` before the layer: the values
TensorRT computes with, and a file a quarter (INT8/FP8) of the FP32 one. Each quantized input of
each unit gets its own pair, so leaving one unit unquantized never touches another's inputs.

Opsets: per-axis Q/DQ needs opset 13, FP8 types opset 19 (ONNX operator changelog,
QuantizeLinear-13/-19). A lower model is converted with ``onnx.version_converter``
(``prepare``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from precision_doctor.errors import UnsupportedModelError
from precision_doctor.graph.constants import constant_values
from precision_doctor.graph.load import opset_of
from precision_doctor.precision.rewrites.api import apply_rewrites, convert_opset
from precision_doctor.quant.placement import WEIGHT, QuantSite, QuantUnit
from precision_doctor.quant.qformats import QuantFormat, quantize


def min_opset(fmt: QuantFormat) -> int:
    """13 for INT8 (per-axis QuantizeLinear), 19 for FP8 (float8 zero points)."""
    return 19 if fmt.is_float else 13


# Exact in real arithmetic, and what engines do before quantizing: TensorRT folds a
# BatchNormalization into the preceding Conv at build time, ModelOpt and ONNX Runtime's
# quant_pre_process before placing Q/DQ. Unfolded, an FP16 BatchNormalization between the pairs
# can overflow where no engine computes it (PP-OCRv4 det: rel L2 1.0 in INT8 before folding).
PREPARE_REWRITES = ("fold-constants", "fold-bias-add", "fold-batchnorm")


def prepare(model: onnx.ModelProto, fmt: QuantFormat) -> onnx.ModelProto:
    """``model`` as an engine quantizes it: ``PREPARE_REWRITES`` applied (a copy), at an opset
    that can hold ``fmt``'s Q/DQ.

    Raises:
        UnsupportedModelError: ``onnx.version_converter`` cannot convert the model; the message
            has the converter's reason and says to re-export at the opset needed.
    """
    need = min_opset(fmt)
    if opset_of(model) < need:
        converted, record = convert_opset(model, need, f"{fmt.name} Q/DQ")
        if not record.applied:
            raise UnsupportedModelError(f"{record.reason}; re-export the model at opset >= "
                                        f"{need} for {fmt.name.upper()} Q/DQ")
        model = converted
    rewritten, _report = apply_rewrites(model, PREPARE_REWRITES)
    return rewritten


@dataclass(frozen=True)
class QuantConfig:
    """What to quantize and how.

    Attributes:
        fmt: INT8 or FP8.
        amax: Activation tensor -> calibrated per-tensor amax (same units as the tensor).
        quantized: Names of the units quantized; the others stay in the float precision.
        channel_amax: Activation tensor -> amax per channel (along the site's axis), for
            ``per_channel``.
        per_channel: Units whose activations are quantized per channel: not what engines run,
            the diagnostic cure of outlier channels (``quant.causes``).
        weights_float: Units whose weights stay in float (the cure of weight quantization).
        smooth: Unit -> SmoothQuant divisors ``s`` over the GEMM's K (Xiao et al. 2023,
            "SmoothQuant", eq. 3): the activation is divided by ``s``, the weight's K rows
            multiplied by it, so the product is unchanged in exact arithmetic.
        smooth_amax: Unit -> amax of its smoothed activation (calibrated after the division).
    """

    fmt: QuantFormat
    amax: Mapping[str, float]
    quantized: frozenset[str]
    channel_amax: Mapping[str, np.ndarray] = field(default_factory=dict)
    per_channel: frozenset[str] = frozenset()
    weights_float: frozenset[str] = frozenset()
    smooth: Mapping[str, np.ndarray] = field(default_factory=dict)
    smooth_amax: Mapping[str, float] = field(default_factory=dict)

    def with_quantized(self, units: frozenset[str]) -> QuantConfig:
        """The same scales with another set of quantized units."""
        from dataclasses import replace

        return replace(self, quantized=units)


def insert_qdq(model: onnx.ModelProto, units: Sequence[QuantUnit], config: QuantConfig
               ) -> onnx.ModelProto:
    """A copy of ``model`` with Q/DQ pairs on the quantized units' sites.

    Args:
        model: The FP32 model, at ``min_opset(config.fmt)`` or higher (``prepare``).
        units: All units (``quant.placement.place``); those in ``config.quantized`` get Q/DQ.
        config: Scales and choices.

    Returns:
        The Q/DQ model; the FP32 parts are untouched (the float precision between is the
        emulator's or the writer's business).

    Raises:
        UnsupportedModelError: The opset is too low, or a quantized activation has no amax.
    """
    if opset_of(model) < min_opset(config.fmt):
        raise UnsupportedModelError(f"{config.fmt.name.upper()} Q/DQ needs opset >= "
                                    f"{min_opset(config.fmt)}; the model has "
                                    f"{opset_of(model)} (quant.qdq.prepare converts it)")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    values = constant_values(model)
    nodes = {n.name: n for n in graph.node}
    before: dict[str, list[onnx.NodeProto]] = {}  # node name -> nodes to insert before it
    for unit in units:
        if unit.name not in config.quantized:
            continue
        for k, site in enumerate(unit.sites):
            if site.kind == WEIGHT and unit.name in config.weights_float:
                if unit.name in config.smooth:
                    _set_input(nodes[site.node], site, _smoothed_weight(
                        graph, values, unit, site, config.smooth[unit.name]))
                continue
            base = f"pdq/{unit.name}/{k}"
            if site.kind == WEIGHT:
                new, added = _weight_qdq(graph, values, unit, site, config, base)
            else:
                new, added = _activation_qdq(graph, unit, site, config, base)
            before.setdefault(site.node, []).extend(added)
            _set_input(nodes[site.node], site, new)
    ordered: list[onnx.NodeProto] = []
    for n in graph.node:
        ordered.extend(before.get(n.name, ()))
        ordered.append(n)
    del graph.node[:]
    graph.node.extend(ordered)
    return out


def _set_input(node: onnx.NodeProto, site: QuantSite, tensor: str) -> None:
    node.input[site.input_index] = tensor


def _activation_qdq(graph: onnx.GraphProto, unit: QuantUnit, site: QuantSite,
                    config: QuantConfig, base: str) -> tuple[str, list[onnx.NodeProto]]:
    fmt, x, nodes = config.fmt, site.tensor, []
    smooth = config.smooth.get(unit.name) if site.input_index == 0 and site.node == unit.name \
        else None
    axis = None
    if smooth is not None:
        inv = numpy_helper.from_array((1.0 / smooth).astype(np.float32), f"{base}/smooth_inv")
        graph.initializer.append(inv)
        nodes.append(onnx.helper.make_node("Mul", [x, inv.name], [f"{base}/smoothed"],
                                           name=f"{base}/smooth"))
        x = f"{base}/smoothed"
        scale = np.float32(fmt.scale_for(config.smooth_amax[unit.name]))
    elif unit.name in config.per_channel and site.tensor in config.channel_amax \
            and site.axis is not None:
        scale = np.asarray(fmt.scale_for(config.channel_amax[site.tensor]), np.float32)
        axis = site.axis
    else:
        if site.tensor not in config.amax:
            raise UnsupportedModelError(f"no calibrated amax for tensor {site.tensor!r} of "
                                        f"{unit.name!r}: calibrate on samples that reach it")
        scale = np.float32(fmt.scale_for(config.amax[site.tensor]))
    s, z = _scale_and_zero(graph, fmt, scale, base)
    q = onnx.helper.make_node("QuantizeLinear", [x, s, z], [f"{base}/q"], name=f"{base}/Q")
    dq = onnx.helper.make_node("DequantizeLinear", [f"{base}/q", s, z], [f"{base}/dq"],
                               name=f"{base}/DQ")
    if axis is not None:
        for n in (q, dq):
            n.attribute.append(onnx.helper.make_attribute("axis", axis))
    nodes += [q, dq]
    return f"{base}/dq", nodes


def smooth_weight(w: np.ndarray, unit: QuantUnit, site: QuantSite, s: np.ndarray
                  ) -> np.ndarray:
    """``w`` with its K rows multiplied by ``s`` (MatMul B[..., K, N]; Gemm B[K, N], or
    B[N, K] with transB, where the output-channel axis is 0)."""
    if unit.op_type == "Gemm" and site.axis == 0:
        return w * s[None, :]
    return w * s[:, None]


def _smoothed_weight(graph: onnx.GraphProto, values: Mapping[str, np.ndarray], unit: QuantUnit,
                     site: QuantSite, s: np.ndarray) -> str:
    w = smooth_weight(np.asarray(values[site.tensor], np.float32), unit, site, s)
    t = numpy_helper.from_array(w.astype(np.float32), f"pdq/{unit.name}/smoothed_w")
    graph.initializer.append(t)
    return t.name


def weight_channel_amax(w: np.ndarray, axis: int) -> np.ndarray:
    """max |w| over every axis but ``axis`` (float32, one per output channel)."""
    axis = axis % w.ndim
    others = tuple(i for i in range(w.ndim) if i != axis)
    return np.max(np.abs(w), axis=others).astype(np.float32) if others else np.abs(w)


def _weight_qdq(graph: onnx.GraphProto, values: Mapping[str, np.ndarray], unit: QuantUnit,
                site: QuantSite, config: QuantConfig, base: str
                ) -> tuple[str, list[onnx.NodeProto]]:
    fmt = config.fmt
    w = np.asarray(values[site.tensor], np.float32)
    if unit.name in config.smooth:
        w = smooth_weight(w, unit, site, config.smooth[unit.name])
    assert site.axis is not None
    scale = storable(fmt.scale_for(weight_channel_amax(w, site.axis)))
    q = quantize(w, scale, fmt, axis=site.axis)
    graph.initializer.append(numpy_helper.from_array(np.asarray(q), f"{base}/w_q"))
    s, z = _scale_and_zero(graph, fmt, scale, base)
    node = onnx.helper.make_node("DequantizeLinear", [f"{base}/w_q", s, z], [f"{base}/w_dq"],
                                 name=f"{base}/DQ_w", axis=site.axis)
    return f"{base}/w_dq", [node]


# 2**-24, the smallest positive FP16 (a subnormal): a scale below it is stored as 0 in a model
# written with FP16 between the pairs (a dead weight channel's amax of 1e-9 gives 8e-12), which
# an engine may refuse; what such a scale quantizes rounds to 0 either way.
MIN_SCALE = 2.0 ** -24


def storable(scale: float | np.floating | np.ndarray) -> np.ndarray:
    """``scale`` as float32, raised to ``MIN_SCALE`` where below it."""
    return np.maximum(np.asarray(scale, np.float32), np.float32(MIN_SCALE))


def _scale_and_zero(graph: onnx.GraphProto, fmt: QuantFormat, scale: np.ndarray | np.float32,
                    base: str) -> tuple[str, str]:
    s = numpy_helper.from_array(storable(scale), f"{base}/scale")
    shape = list(np.shape(scale))
    z = onnx.helper.make_tensor(f"{base}/zero", fmt.onnx_type, shape,
                                [0] * int(np.prod(shape, dtype=np.int64)))
    graph.initializer.extend([s, z])
    return s.name, z.name
