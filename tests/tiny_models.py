"""Tiny ONNX models built in code for the tests (no files on disk)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 8  # onnxruntime 1.31 reads IR <= 13; onnx 1.23 writes 14 by default


@dataclass(frozen=True)
class S:
    """A sample (duck-types precision_doctor.inputs.Sample)."""

    name: str
    feeds: dict


def make_model(nodes, inputs, outputs, initializers=(), opset=13, metadata=None):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=IR_VERSION)
    for k, v in (metadata or {}).items():
        model.metadata_props.add(key=k, value=v)
    onnx.checker.check_model(model)
    return model


def relu_batch():
    """``y = Relu(x)``, both float32 ``[batch, n]``: one tensor per sample, any width."""
    f = TensorProto.FLOAT
    return make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                      [helper.make_tensor_value_info("x", f, ["batch", "n"])],
                      [helper.make_tensor_value_info("y", f, ["batch", "n"])], opset=17)


def tensor(name, array):
    return numpy_helper.from_array(np.asarray(array, np.float32), name)


def transformer_block(hot_value: float = 1000.0, hidden: int = 16, opset: int = 13,
                      eps: float = 1e-5, pow_name: str = "ln/pow"):
    """Linear -> decomposed LayerNorm -> Linear -> Softmax, with one hot channel.

    The first linear layer's bias puts ``hot_value`` into channel 3 (the "large activation"
    of field reports 1/2); the squared deviation then overflows FP16 at the Pow.
    """
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.2, (hidden, hidden)).astype(np.float32)
    b1 = np.zeros(hidden, np.float32)
    b1[3] = hot_value
    w2 = rng.normal(0, 0.2, (hidden, hidden)).astype(np.float32)
    axes = {"axes": [-1]}
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1/matmul"),
        helper.make_node("Add", ["h0", "b1"], ["h"], name="fc1/add"),
        helper.make_node("ReduceMean", ["h"], ["mean"], name="ln/mean", **axes),
        helper.make_node("Sub", ["h", "mean"], ["d"], name="ln/sub"),
        helper.make_node("Pow", ["d", "two"], ["d2"], name=pow_name),
        helper.make_node("ReduceMean", ["d2"], ["var"], name="ln/var", **axes),
        helper.make_node("Add", ["var", "eps"], ["var_eps"], name="ln/add_eps"),
        helper.make_node("Sqrt", ["var_eps"], ["std"], name="ln/sqrt"),
        helper.make_node("Div", ["d", "std"], ["n"], name="ln/div"),
        helper.make_node("Mul", ["n", "gamma"], ["ng"], name="ln/scale"),
        helper.make_node("Add", ["ng", "beta"], ["ln_out"], name="ln/shift"),
        helper.make_node("MatMul", ["ln_out", "w2"], ["logits"], name="fc2/matmul"),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
    ]
    inits = [tensor("w1", w1), tensor("b1", b1), tensor("w2", w2), tensor("two", 2.0),
             tensor("eps", eps), tensor("gamma", np.ones(hidden)), tensor("beta",
                                                                          np.zeros(hidden))]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                            ["batch", 8, hidden])],
                      [helper.make_tensor_value_info("probs", TensorProto.FLOAT,
                                                     ["batch", 8, hidden])], inits, opset)


def conv_bn(var_max: float = 9.8e7, channels: int = 4):
    """Conv -> BatchNormalization -> Relu, with a running variance up to ``var_max``."""
    rng = np.random.default_rng(1)
    w = rng.normal(0, 0.5, (channels, 3, 3, 3)).astype(np.float32)
    var = np.linspace(0.5, var_max, channels).astype(np.float32)
    w *= np.sqrt(var)[:, None, None, None] / 4  # conv outputs on the scale of sqrt(variance)
    mean = rng.normal(0, 1, channels).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["bn"], name="bn",
                         epsilon=1e-5),
        helper.make_node("Relu", ["bn"], ["y"], name="relu"),
    ]
    inits = [tensor("w", w), tensor("g", np.ones(channels)), tensor("b", np.zeros(channels)),
             tensor("m", mean), tensor("v", var)]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                            [1, 3, 8, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                     [1, channels, 8, 8])], inits)


def conv_pool_model(opset: int = 11) -> onnx.ModelProto:
    """Conv -> MaxPool -> Sigmoid -> GlobalAveragePool -> Flatten -> MatMul; an Equal on the
    shape (int64) beside it."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["c"], ["p"], name="pool", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Sigmoid", ["p"], ["s"], name="sigmoid"),
        helper.make_node("GlobalAveragePool", ["s"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "m"], ["y"], name="fc"),
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Equal", ["shape", "shape"], ["same"], name="equal_ints"),
    ]
    inits = [tensor("w", rng.normal(0, 0.3, (4, 3, 3, 3))), tensor("m", rng.normal(0, 1, (4, 2)))]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                            [1, 3, 8, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2]),
                       helper.make_tensor_value_info("same", TensorProto.BOOL, [4])],
                      inits, opset=opset)


def random_samples(shape, count=2, seed=0, scale=1.0, name="x"):
    rng = np.random.default_rng(seed)
    return [S(f"s{i}", {name: (rng.standard_normal(shape) * scale).astype(np.float32)})
            for i in range(count)]


def yolo_head():
    """A [1, 3, 16, 16] input -> a YOLOv8-shaped raw head [1, 4+2, 64]: boxes around an 8x8
    grid of anchor points, two sigmoid class scores, joined by a Concat as exported."""
    rng = np.random.default_rng(7)
    conv = helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["h"], name="conv")
    inits = [tensor("conv_w", rng.normal(0, 0.4, (4, 3, 1, 1))),
             tensor("conv_b", rng.normal(0, 0.1, 4))]
    gx, gy = np.meshgrid(np.arange(8) * 2 + 1.0, np.arange(8) * 2 + 1.0)
    grid = np.stack([gx.ravel(), gy.ravel()])[None]  # [1, 2, 64]
    nodes = [conv, helper.make_node("MaxPool", ["h"], ["m"], name="pool", kernel_shape=[2, 2],
                                    strides=[2, 2]),
             helper.make_node("Reshape", ["m", "shape"], ["flat"], name="flat"),
             helper.make_node("Split", ["flat", "split"], ["wh_raw", "cls_raw"], name="split",
                              axis=1),
             helper.make_node("Sigmoid", ["wh_raw"], ["wh_s"], name="wh_sig"),
             helper.make_node("Mul", ["wh_s", "eight"], ["wh"], name="wh_scale"),
             helper.make_node("Sigmoid", ["cls_raw"], ["cls"], name="cls_sig"),
             helper.make_node("Concat", ["grid", "wh", "cls"], ["y"], name="head", axis=1)]
    inits += [tensor("grid", grid), tensor("eight", 8.0),
              helper.make_tensor("shape", TensorProto.INT64, [3], [1, 4, 64]),
              helper.make_tensor("split", TensorProto.INT64, [2], [2, 2])]
    io = ([helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 64])])
    return make_model(nodes, *io, inits, metadata={"names": "{0: 'a', 1: 'b'}"})


def quantized_block(blocks: int = 2, hidden: int = 64, seq: int = 8, seed: int = 0):
    """A dynamically quantized encoder of ``blocks`` blocks, as ONNX Runtime's
    ``quantize_dynamic`` writes one, that FP16 turns into NaN through independent causes.

    Each block: ``DynamicQuantizeLinear(x) -> MatMulInteger(xq, Wq, x_zp, 0) ->
    Cast(int32 -> float) -> Mul(x_scale * w_scale)`` (the int32 accumulator reaches ~1e5,
    beyond FP16's 65504, at its Cast), then an RMSNorm written as
    ``Pow(x, 2) -> ReduceMean -> Add eps -> Sqrt -> Div``, then a residual ``Add``. Input
    ``x`` float32 ``[1, seq, hidden]``; output ``y`` the same shape.
    """
    rng = np.random.default_rng(seed)
    f = TensorProto.FLOAT
    nodes, inits = [], []
    x = "x"
    for b in range(blocks):
        p = f"b{b}/"
        w = np.full((hidden, hidden), 127, np.int8)
        w[:, ::2] = rng.integers(100, 128, size=(hidden, hidden // 2), dtype=np.int8)
        inits += [numpy_helper.from_array(w, p + "Wq"),
                  numpy_helper.from_array(np.array(0, np.int8), p + "w_zp"),
                  tensor(p + "w_scale", np.float32(0.02)),
                  tensor(p + "eps", np.float32(1e-6)),
                  tensor(p + "two", np.float32(2.0))]
        nodes += [
            helper.make_node("DynamicQuantizeLinear", [x], [p + "xq", p + "xs", p + "xzp"],
                             name=p + "dql"),
            helper.make_node("MatMulInteger", [p + "xq", p + "Wq", p + "xzp", p + "w_zp"],
                             [p + "acc"], name=p + "mmi"),
            helper.make_node("Cast", [p + "acc"], [p + "accf"], to=f, name=p + "cast"),
            helper.make_node("Mul", [p + "xs", p + "w_scale"], [p + "scale"],
                             name=p + "scale_mul"),
            helper.make_node("Mul", [p + "accf", p + "scale"], [p + "lin"], name=p + "deq"),
            helper.make_node("Pow", [p + "lin", p + "two"], [p + "sq"], name=p + "pow"),
            helper.make_node("ReduceMean", [p + "sq"], [p + "ms"], axes=[-1],
                             name=p + "mean"),
            helper.make_node("Add", [p + "ms", p + "eps"], [p + "mse"], name=p + "add_eps"),
            helper.make_node("Sqrt", [p + "mse"], [p + "rms"], name=p + "sqrt"),
            helper.make_node("Div", [p + "lin", p + "rms"], [p + "normed"], name=p + "div"),
            helper.make_node("Add", [p + "normed", x], [p + "out"], name=p + "residual"),
        ]
        x = p + "out"
    nodes.append(helper.make_node("Identity", [x], ["y"], name="out"))
    return make_model(nodes, [helper.make_tensor_value_info("x", f, [1, seq, hidden])],
                      [helper.make_tensor_value_info("y", f, [1, seq, hidden])], inits,
                      opset=13)


def write_quantized_block(folder, blocks: int):
    """``quantized_block(blocks)`` saved as ``folder/m.onnx`` with one real-valued sample
    ``folder/x.npz`` (x uniform in [0, 1), seed 1); returns the two paths as strings."""
    onnx.save(quantized_block(blocks=blocks), folder / "m.onnx")
    rng = np.random.default_rng(1)
    np.savez(folder / "x.npz", x=rng.uniform(0, 1, (1, 8, 64)).astype(np.float32))
    return str(folder / "m.onnx"), str(folder / "x.npz")
