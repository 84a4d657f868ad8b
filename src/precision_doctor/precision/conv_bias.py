"""Where an engine adds a convolution's bias: inside the kernel before its one rounding, or
after the convolution's output was rounded.

ONNX Runtime CUDA computes an FP16 or BF16 ``Conv`` with a bias as
``round(round(conv(x, W)) + B)``: the cuDNN convolution writes its output in the format and
the bias is added by a second kernel (``cudnnAddTensor``), whose sum is rounded again.
Measured on an NVIDIA H100 with onnxruntime-gpu 1.31.1 (``benchmarks/probes/bf16_conv_probe.py``,
2026-11-25): on the 35 biased convolutions of PP-OCRv4 cls as ``fix`` writes it, on real
activations, 99.99-100% (BF16) and 99.94-100% (FP16) of each layer's output elements equal that
double rounding, against 51-76% (54-82%) for one rounding of the FP32 sum; the double rounding
is 1.1-2.7x less exact.
TensorRT adds the bias in the convolution's epilogue (one rounding; the default model,
``FUSED``).

``split_conv_bias`` rewrites such convolutions into ``Conv`` without bias followed by an
``Add`` of the bias (broadcast over the spatial axes) in the same precision, so the emulation
rounds both outputs, as the engine does. The ``Add`` takes the ``Conv``'s output name; the
convolution's own output is renamed ``<name>__pd_nobias``.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
import onnx_ir as ir

FUSED = "fused"  # bias added before the output's one rounding (TensorRT, the default)
SEPARATE = "separate"  # conv output rounded, bias added, rounded again (ONNX Runtime CUDA)
CONV_BIAS = (FUSED, SEPARATE)


def split_conv_bias(model: onnx.ModelProto, low: Callable[[ir.Node], bool]
                    ) -> tuple[onnx.ModelProto, dict[str, str]]:
    """``model`` with every biased ``Conv`` for which ``low(node)`` holds split into ``Conv``
    (no bias) and ``Add`` (the input is not modified).

    Args:
        model: Any model (FP32, or strongly typed with FP16/BF16 tensors).
        low: Whether a ``Conv`` node runs in FP16/BF16 (only those are split).

    Returns:
        ``(model, {conv node name: new Add node name})``; the model itself when nothing was
        split.
    """
    ir_model = ir.serde.deserialize_model(model)
    graph = ir_model.graph
    opset = ir_model.opset_imports.get("", 1)
    added: dict[str, str] = {}
    for node in list(graph):
        if (node.op_type != "Conv" or node.domain not in ("", "ai.onnx")
                or len(node.inputs) < 3 or node.inputs[2] is None or not low(node)):
            continue
        weights = node.inputs[1]
        if weights is None or weights.shape is None or len(weights.shape) < 3:
            continue
        spatial = len(weights.shape) - 2
        bias = node.inputs[2]
        name = node.name or f"conv_{len(added)}"
        axes = list(range(1, spatial + 1))
        if opset >= 13:
            axes_value = ir.Value(name=f"{name}/pd_bias_axes", const_value=ir.tensor(
                np.asarray(axes, np.int64), name=f"{name}/pd_bias_axes"))
            graph.register_initializer(axes_value)
            unsqueeze = ir.node("Unsqueeze", [bias, axes_value], name=f"{name}/pd_bias_shape")
        else:
            unsqueeze = ir.node("Unsqueeze", [bias], {"axes": axes}, name=f"{name}/pd_bias_shape")
        unsqueeze.outputs[0].name = f"{name}/pd_bias_shaped"
        _typed(unsqueeze.outputs[0], bias.dtype, None)
        out = node.outputs[0]
        conv = ir.node("Conv", [node.inputs[0], weights], dict(node.attributes), name=name)
        raw = conv.outputs[0]
        raw.name = f"{out.name}__pd_nobias"
        _typed(raw, out.dtype, out.shape)
        add = ir.node("Add", [raw, unsqueeze.outputs[0]], name=f"{name}/pd_bias")
        uses = list(out.uses())
        graph.insert_before(node, [unsqueeze, conv, add])
        for use in uses:
            use.node.replace_input_with(use.idx, add.outputs[0])
        for i, g_out in enumerate(graph.outputs):
            if g_out is out:
                graph.outputs[i] = add.outputs[0]
        graph.remove(node, safe=True)
        add.outputs[0].name = out.name
        _typed(add.outputs[0], out.dtype, out.shape)
        added[name] = add.name or ""
    if not added:
        return model, {}
    result = ir.serde.serialize_model(ir_model)
    del result.graph.value_info[:]
    return result, added


def _typed(value: ir.Value, dtype: ir.DataType | None, shape: ir.Shape | None) -> None:
    """Give ``value`` the type and shape that are known (unknown ones stay unset)."""
    if dtype is not None:
        value.dtype = dtype
    if shape is not None:
        value.shape = shape
