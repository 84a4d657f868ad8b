"""Tiny models, one per quantization mechanism, each with its samples (built in code).

Each is built so that exactly its mechanism breaks INT8 and the narrower cure of that mechanism
removes the error (``quant.causes``):

* ``outlier_gemm``: one input channel of a MatMul 100x wider than the rest, whose weight row is
  small: one per-tensor scale crushes the other channels (the SmoothQuant case);
* ``clipped_spikes``: two activations per sample 2000x the bulk that carry the output: a 99.99th
  percentile clips them;
* ``depthwise_taps``: a depthwise Conv whose channels have one tap of 1.0 and small taps that
  carry the output (the big tap is subtracted again): per-channel INT8 rounds the small taps
  to 0 or one step; the input is integer-valued, so its own quantization is exact;
* ``flat_softmax``: attention probabilities over 512 keys, half the rows flat (1/512 each):
  per-tensor INT8 with amax ~1 zeroes them;
* ``deep_chain``: eight equal MatMul layers each adding the same small noise.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper
from tiny_models import S, make_model, tensor

F = TensorProto.FLOAT


def _io(name, shape):
    return helper.make_tensor_value_info(name, F, shape)


def outlier_gemm(samples: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    k, n = 16, 16
    scale = np.ones(k, np.float32)
    scale[0] = 100.0
    w = rng.standard_normal((k, n)).astype(np.float32)
    w[0] *= 0.01
    model = make_model(
        [helper.make_node("Mul", ["x", "c"], ["xs"], name="outlier"),
         helper.make_node("MatMul", ["xs", "w"], ["y"], name="proj")],
        [_io("x", [1, 32, k])], [_io("y", [1, 32, n])], [tensor("c", scale), tensor("w", w)],
        opset=17)
    return model, [S(f"s{i}", {"x": rng.standard_normal((1, 32, k)).astype(np.float32)})
                   for i in range(samples)]


def clipped_spikes(samples: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")],
                       [_io("x", [1, 4096, 8])], [_io("y", [1, 4096, 8])], [tensor("w", w)],
                       opset=17)
    out = []
    for i in range(samples):
        x = (rng.standard_normal((1, 4096, 8)) * 0.1).astype(np.float32)
        idx = rng.choice(x.size, 2, replace=False)  # 0.006%: above the 99.99th percentile
        x.reshape(-1)[idx] = 200.0 * np.sign(rng.standard_normal(2))
        out.append(S(f"s{i}", {"x": x}))
    return model, out


def depthwise_taps(samples: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    c = 4
    w = (rng.uniform(0.002, 0.006, (c, 1, 3, 3)) * np.sign(rng.standard_normal((c, 1, 3, 3)))
         ).astype(np.float32)
    w[:, :, 1, 1] = 1.0
    model = make_model(
        [helper.make_node("Conv", ["x", "w"], ["dw"], name="dw", group=c, pads=[1, 1, 1, 1]),
         helper.make_node("Sub", ["dw", "x"], ["y"], name="minus_center")],
        [_io("x", [1, c, 16, 16])], [_io("y", [1, c, 16, 16])], [tensor("w", w)], opset=17)
    out = []
    for i in range(samples):
        x = rng.integers(-127, 128, (1, c, 16, 16)).astype(np.float32)
        x.reshape(-1)[0] = 127.0  # amax 127: scale 1, every integer exact in INT8
        out.append(S(f"s{i}", {"x": x}))
    return model, out


def flat_softmax(samples: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    keys, d = 512, 8
    v = rng.standard_normal((keys, d)).astype(np.float32) + 1.0
    model = make_model([helper.make_node("Softmax", ["logits"], ["p"], name="softmax", axis=-1),
                        helper.make_node("MatMul", ["p", "v"], ["y"], name="pv")],
                       [_io("logits", [1, 64, keys])], [_io("y", [1, 64, d])],
                       [tensor("v", v)], opset=17)
    out = []
    for i in range(samples):
        logits = (rng.standard_normal((1, 64, keys)) * 0.05).astype(np.float32)
        logits[0, np.arange(32), rng.integers(0, keys, 32)] = 20.0  # one peak per row: ~1
        out.append(S(f"s{i}", {"logits": logits}))
    return model, out


def deep_chain(layers: int = 8, samples: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    d = 32
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        q, _ = np.linalg.qr(rng.standard_normal((d, d)))
        inits.append(tensor(f"w{i}", q.astype(np.float32)))
        out = "y" if i == layers - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [out], name=f"layer{i}"))
        prev = out
    model = make_model(nodes, [_io("x", [1, 64, d])], [_io("y", [1, 64, d])], inits, opset=17)
    return model, [S(f"s{i}", {"x": rng.standard_normal((1, 64, d)).astype(np.float32)})
                   for i in range(samples)]


def fp16_overflow(samples: int = 2, seed: int = 0):
    """A MatMul whose output is scaled by 1e5 and back: the float part between the Q/DQ pairs
    overflows FP16 (65504) whatever the quantization does."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
         helper.make_node("Mul", ["h", "up"], ["big"], name="scale_up"),
         helper.make_node("Mul", ["big", "down"], ["y"], name="scale_down")],
        [_io("x", [1, 8, 16])], [_io("y", [1, 8, 16])],
        [tensor("w", w), tensor("up", 1e5), tensor("down", 1e-5)], opset=17)
    return model, [S(f"s{i}", {"x": rng.standard_normal((1, 8, 16)).astype(np.float32)})
                   for i in range(samples)]
