"""Tiny text-to-speech-like models whose output length is set by rounded durations.

``duration_model`` is the shape of a VITS/Piper voice's length regulator: a duration
predictor (MatMul -> Relu -> a normalization -> MatMul -> Exp), ``Ceil`` (or ``Round``), a
``Cast`` to int64, ``CumSum`` and ``Range`` to build the alignment path, the phoneme features
expanded frame by frame, and a decoder that writes ``HOP`` audio samples per frame. So the
audio's length is ``HOP * sum(durations)`` and depends on the data.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tests.tiny_models import make_model

HOP = 8  # audio samples per frame
CHANNELS = 6


def duration_model(*, scale: float = 1.0, rounding: str = "Ceil", seed: int = 0,
                   log_bias: float = 1.0):
    """A VITS-like length regulator and decoder (opset 17).

    Args:
        scale: Multiplies the predictor's hidden layer before its RMS normalization; at
            ``scale`` >= 1e3 the normalization's sum of squares overflows FP16 (65504 =
            largest finite binary16), the normalized features become 0 and every duration
            becomes ``rounding(exp(log_bias))``: a destroyed predictor.
        rounding: ``Ceil`` (VITS) or ``Round`` (FastSpeech-like).
        seed: Weights' seed.
        log_bias: The predictor's output bias (log frames).

    Returns:
        A model with input ``x`` float32 ``[1, T, 6]`` (phoneme features) and output ``audio``
        float32 ``[1, 1, 8 * sum(durations)]``.
    """
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    rng = np.random.default_rng(seed)
    c = CHANNELS
    init = {
        "w1": rng.normal(0, 0.6, (c, c)) * scale, "b1": rng.normal(0, 0.2, c) * scale,
        "w2": rng.normal(0, 0.5, (c, 1)), "b2": np.array([log_bias]),
        "w3": rng.normal(0, 0.5, (c, HOP)), "eps": np.array(1e-6),
    }
    ints = {"zero": np.array(0), "step": np.array(1), "ax0": np.array(0),
            "axes0": np.array([0]), "ax1": np.array([1]), "flat": np.array([-1]),
            "audio_shape": np.array([1, 1, -1])}
    initializers = ([numpy_helper.from_array(np.asarray(v, np.float32), k)
                     for k, v in init.items()]
                    + [numpy_helper.from_array(np.asarray(v, np.int64), k)
                       for k, v in ints.items()])
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "w1"], ["h0"], name="dp/fc1"),
        n("Add", ["h0", "b1"], ["h1"], name="dp/fc1_bias"),
        n("Relu", ["h1"], ["h"], name="dp/relu"),
        n("Mul", ["h", "h"], ["sq"], name="dp/norm/square"),
        n("ReduceMean", ["sq"], ["ms"], name="dp/norm/mean", axes=[-1]),
        n("Add", ["ms", "eps"], ["mse"], name="dp/norm/add_eps"),
        n("Sqrt", ["mse"], ["rms"], name="dp/norm/sqrt"),
        n("Div", ["h", "rms"], ["hn"], name="dp/norm/div"),
        n("MatMul", ["hn", "w2"], ["logw0"], name="dp/fc2"),
        n("Add", ["logw0", "b2"], ["logw"], name="dp/fc2_bias"),
        n("Exp", ["logw"], ["w"], name="dp/exp"),
        n(rounding, ["w"], ["wr"], name=f"dp/{rounding.lower()}"),
        n("Cast", ["wr"], ["d3"], name="dp/cast", to=i64),
        n("Reshape", ["d3", "flat"], ["d"], name="lr/durations"),
        n("CumSum", ["d", "ax0"], ["cum"], name="lr/cumsum"),
        n("Sub", ["cum", "d"], ["start"], name="lr/start"),
        n("ReduceSum", ["d"], ["total"], name="lr/total", keepdims=0),
        n("Range", ["zero", "total", "step"], ["frames"], name="lr/range"),
        n("Unsqueeze", ["start", "ax1"], ["start_c"], name="lr/start_col"),
        n("Unsqueeze", ["cum", "ax1"], ["cum_c"], name="lr/cum_col"),
        n("GreaterOrEqual", ["frames", "start_c"], ["ge"], name="lr/ge"),
        n("Less", ["frames", "cum_c"], ["lt"], name="lr/lt"),
        n("And", ["ge", "lt"], ["path_b"], name="lr/path"),
        n("Cast", ["path_b"], ["path"], name="lr/path_float", to=f),
        n("Squeeze", ["x", "axes0"], ["x2"], name="lr/squeeze"),
        n("Transpose", ["path"], ["path_t"], name="lr/path_t", perm=[1, 0]),
        n("MatMul", ["path_t", "x2"], ["expanded"], name="lr/expand"),
        n("MatMul", ["expanded", "w3"], ["dec0"], name="dec/fc"),
        n("Tanh", ["dec0"], ["dec"], name="dec/tanh"),
        n("Reshape", ["dec", "audio_shape"], ["audio"], name="dec/reshape"),
    ]
    return make_model(nodes, [helper.make_tensor_value_info("x", f, [1, "T", c])],
                      [helper.make_tensor_value_info("audio", f, [1, 1, "samples"])],
                      initializers, opset=17)


def phonemes(count: int = 3, length: int = 12, seed: int = 1) -> list[dict]:
    """``count`` samples of ``length`` phoneme features each (float32 ``[1, length, 6]``)."""
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (1, length + 2 * k, CHANNELS)).astype(np.float32)}
            for k in range(count)]
