"""Tiny models of the failures of a one-step diffusion UNet in FP16, built with onnx.helper.

* ``timestep_embedding``: the sinusoidal timestep embedding of diffusion models,
  ``Concat(Sin(t * freqs), Cos(t * freqs)) @ W``, with ``freqs = 10000^(-i / half)`` as in
  DDPM/ADM. With ``t`` up to 1000 the argument reaches 1000 rad, where FP16's spacing is
  0.5 rad: the phase is lost.
* ``destroyed_residual``: ``blocks`` residual blocks ``h = InstanceNorm(h + MatMul(h, W_k))``
  whose pre-norm sum exceeds 65504 (the largest finite FP16) in every block and is normalized
  back to O(1) after it: one overflow per block, each alone enough to turn the output NaN.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from tiny_models import S, make_model, tensor

F = TensorProto.FLOAT


def timestep_embedding(half: int = 16, width: int = 32):
    """``emb = Concat(Sin(t * freqs), Cos(t * freqs)) @ W`` for ``t`` float32 ``[batch, 1]``,
    ``emb`` float32 ``[batch, width]``."""
    rng = np.random.default_rng(3)
    freqs = np.exp(-np.log(10000.0) * np.arange(half) / half).astype(np.float32)[None, :]
    w = rng.normal(0, 1 / np.sqrt(2 * half), (2 * half, width)).astype(np.float32)
    nodes = [
        helper.make_node("Mul", ["t", "freqs"], ["arg"], name="/time_embed/Mul"),
        helper.make_node("Sin", ["arg"], ["sin"], name="/time_embed/Sin"),
        helper.make_node("Cos", ["arg"], ["cos"], name="/time_embed/Cos"),
        helper.make_node("Concat", ["sin", "cos"], ["emb0"], name="/time_embed/Concat", axis=-1),
        helper.make_node("MatMul", ["emb0", "w"], ["emb"], name="/time_embed/linear/MatMul"),
    ]
    return make_model(nodes, [helper.make_tensor_value_info("t", F, ["batch", 1])],
                      [helper.make_tensor_value_info("emb", F, ["batch", width])],
                      [tensor("freqs", freqs), tensor("w", w)], opset=17)


def timestep_samples(n: int = 4) -> list[S]:
    """``n`` samples of 4 timesteps each, spread over 80..1000 (deterministic)."""
    t = np.linspace(80.0, 1000.0, 4 * n, dtype=np.float32).reshape(n, 4, 1)
    return [S(f"t{i}", {"t": t[i]}) for i in range(n)]


def destroyed_residual(blocks: int = 12, channels: int = 8, gain: float = 10000.0):
    """``blocks`` blocks ``h = InstanceNorm(h + MatMul(h, W_k))`` on float32 ``[batch, channels,
    16]`` (``x`` in, ``y`` out); ``W_k`` has entries of about ``gain``, so every pre-norm sum
    reaches 1e5-1e6 > 65504."""
    rng = np.random.default_rng(5)
    nodes, inits = [], []
    h = "x"
    for k in range(blocks):
        p = f"/output_blocks.{k}"
        w = rng.normal(0, gain, (16, 16)).astype(np.float32)
        inits += [tensor(f"w{k}", w), tensor(f"s{k}", np.ones(channels)),
                  tensor(f"b{k}", np.zeros(channels))]
        nodes += [
            helper.make_node("MatMul", [h, f"w{k}"], [f"m{k}"], name=f"{p}/branch/MatMul"),
            helper.make_node("Add", [h, f"m{k}"], [f"a{k}"], name=f"{p}/Add"),
            helper.make_node("InstanceNormalization", [f"a{k}", f"s{k}", f"b{k}"], [f"h{k}"],
                             name=f"{p}/norm/InstanceNormalization"),
        ]
        h = f"h{k}"
    nodes.append(helper.make_node("Identity", [h], ["y"], name="/out/Identity"))
    return make_model(nodes, [helper.make_tensor_value_info("x", F, ["batch", channels, 16])],
                      [helper.make_tensor_value_info("y", F, ["batch", channels, 16])],
                      inits, opset=17)


def noise_samples(n: int = 2, channels: int = 8) -> list[S]:
    """Gaussian noise times 80 (sigma 80, a diffusion model's first step), float32."""
    rng = np.random.default_rng(7)
    return [S(f"n{i}", {"x": (80.0 * rng.standard_normal((1, channels, 16))).astype(np.float32)})
            for i in range(n)]


def diffusion_unet(inputs: int = 8, outputs: int = 16, channels: int = 8, gain: float = 1e4):
    """A one-step diffusion UNet in miniature: the timestep embedding (``t`` float32
    ``[batch, 1]``, up to 1000) projected to ``channels`` and added to the noisy input (``x``
    float32 ``[batch, channels, 16]``), then residual blocks ``h = InstanceNorm(h + MatMul(h,
    W))`` named like a torch export (``/input_blocks.3/input_blocks.3.0/Add``,
    ``/middle_block/...``, ``/output_blocks.7/output_blocks.7.0/...``), each overflowing FP16
    before its normalization (``W`` of about ``gain``); output ``y`` like ``x``."""
    rng = np.random.default_rng(11)
    half = 8
    freqs = np.exp(-np.log(10000.0) * np.arange(half) / half).astype(np.float32)[None, :]
    nodes = [
        helper.make_node("Mul", ["t", "freqs"], ["arg"], name="/time_embed/Mul"),
        helper.make_node("Sin", ["arg"], ["sin"], name="/time_embed/Sin"),
        helper.make_node("Cos", ["arg"], ["cos"], name="/time_embed/Cos"),
        helper.make_node("Concat", ["sin", "cos"], ["emb0"], name="/time_embed/Concat", axis=-1),
        helper.make_node("MatMul", ["emb0", "wt"], ["emb1"], name="/time_embed/linear/MatMul"),
        helper.make_node("Unsqueeze", ["emb1", "last"], ["emb"], name="/time_embed/Unsqueeze"),
        helper.make_node("Add", ["x", "emb"], ["h_in"], name="/input_add/Add"),
    ]
    inits = [tensor("freqs", freqs), tensor("wt", rng.normal(0, 30.0, (2 * half, channels))),
             numpy_helper.from_array(np.array([-1], np.int64), "last")]
    scopes = ([f"/input_blocks.{k}/input_blocks.{k}.0" for k in range(inputs)]
              + ["/middle_block/middle_block.0"]
              + [f"/output_blocks.{k}/output_blocks.{k}.0" for k in range(outputs)])
    h = "h_in"
    for k, p in enumerate(scopes):
        inits += [tensor(f"w{k}", rng.normal(0, gain, (16, 16))),
                  tensor(f"s{k}", np.ones(channels)), tensor(f"b{k}", np.zeros(channels))]
        nodes += [
            helper.make_node("MatMul", [h, f"w{k}"], [f"m{k}"], name=f"{p}/out_layers/MatMul"),
            helper.make_node("Add", [h, f"m{k}"], [f"a{k}"], name=f"{p}/Add"),
            helper.make_node("InstanceNormalization", [f"a{k}", f"s{k}", f"b{k}"], [f"h{k}"],
                             name=f"{p}/norm/InstanceNormalization"),
        ]
        h = f"h{k}"
    nodes.append(helper.make_node("Identity", [h], ["y"], name="/out/Identity"))
    return make_model(nodes, [helper.make_tensor_value_info("x", F, ["batch", channels, 16]),
                              helper.make_tensor_value_info("t", F, ["batch", 1])],
                      [helper.make_tensor_value_info("y", F, ["batch", channels, 16])],
                      inits, opset=17)


def unet_samples(n: int = 2, channels: int = 8) -> list[S]:
    """Noise times 80 (sigma 80) and a timestep of 999, float32."""
    rng = np.random.default_rng(13)
    return [S(f"n{i}", {"x": (80.0 * rng.standard_normal((1, channels, 16))).astype(np.float32),
                        "t": np.array([[999.0 - 10 * i]], np.float32)}) for i in range(n)]
