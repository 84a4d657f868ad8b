"""How each engine converts an FP32 constant beyond the FP16/BF16 range: the table, with sources.

A constant of finite magnitude above the format's largest finite value (an attention mask filled
with -FLT_MAX = -3.4028235e38, ``torch.finfo(torch.float32).min``) has no value in FP16. What
it becomes depends on who converts it:

- ``strongly-typed``: IEEE round-to-nearest gives +-inf (ONNX ``Cast``), silently. The
  emulator's default; the strongly typed writer refuses and keeps the node FP32.
- ``tensorrt``: clamped to +-65504 when its builder converts weights (a weakly typed ``--fp16``
  build), with a warning; TensorRT 7 refused the build instead. Its BF16 conversion is not
  documented in the sources read, so the row covers FP16.
- ``onnxconverter-common``: clamped to +-``max_finite_val`` (default 1e4), with a Python
  warning; FP16 only.
- ``ort-cuda``: runs the model as written: a constant is what the model stores (FP32 stays FP32;
  FP16 is what its converter wrote).

Sources (``ConstantConversion.source``): the ONNX ``Cast`` operator specification and IEEE-754
round-to-nearest (values at or beyond max + half an ulp round to inf); TensorRT's builder
warning ``Weights [name=...] had the following issues when converted to FP16`` followed by one
line per issue and ``If this is not the desired behavior, please modify the weights or retrain
with regularization to reduce the magnitude of the weights`` (quoted from TensorRT 8.2/8.4 logs in
discuss.pytorch.org/t/157663 and NVIDIA/TensorRT#3257), and TensorRT 7's error ``Weights are
outside of fp16 range`` (NVIDIA/TensorRT#420); ``onnxconverter_common/float16.py``,
``convert_np_to_float16`` (onnxconverter-common 1.16.0: ``np.where(between(-inf, x,
-max_finite_val), -max_finite_val, x)`` and ``warnings.warn("the float32 number {} will be
truncated to {}")``); ONNX Runtime executes the graph's types (no conversion pass). TensorRT
cannot be installed on the machine this was written on: its row is read from those logs, not
measured here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from precision_doctor.formats import FORMATS, Precision, round_to

CAST, CLAMP, AS_WRITTEN = "cast", "clamp", "as-written"
ONNXCONVERTER_MAX_FINITE = 1e4  # float16.convert_float_to_float16(max_finite_val=1e4)


@dataclass(frozen=True)
class ConstantConversion:
    """What one engine makes of an FP32 constant when it runs the model in FP16/BF16.

    Attributes:
        engine: Key of ``CONVERSIONS`` (``strongly-typed``, ``tensorrt``, ...).
        title: In words (``TensorRT``).
        rule: ``cast`` (round to nearest: beyond the range -> +-inf), ``clamp`` (to
            +-``limit``, or +-the format max when ``limit`` is None) or ``as-written`` (the
            model's own types decide; a converted model is whatever its converter wrote).
        warning: What the engine logs when it converts such a constant ("" when silent).
        source: Where the rule comes from (document, source file and function, or log).
        limit: The clamp bound for ``clamp`` (None: the format's largest finite value).
        formats: The reduced formats the row is known for.
    """

    engine: str
    title: str
    rule: str
    warning: str
    source: str
    limit: float | None = None
    formats: tuple[Precision, ...] = (Precision.FP16, Precision.BF16)

    def bound(self, target: Precision) -> float:
        """The largest magnitude a converted constant keeps (``limit`` or the format max)."""
        fmax = FORMATS[target].max
        return fmax if self.limit is None else min(float(self.limit), fmax)

    def convert(self, values: np.ndarray, target: Precision) -> np.ndarray:
        """``values`` as this engine stores them in ``target``, returned as float32.

        ``as-written`` is shown as the strongly typed conversion: what the model stores in
        ``target`` is a Cast's result (ONNX Runtime converts nothing itself).

        Raises:
            ValueError: The row does not cover ``target`` (onnxconverter-common writes FP16).
        """
        if target not in self.formats:
            raise ValueError(f"{self.title} converts constants to "
                             f"{', '.join(p.value for p in self.formats)} only, not {target.value}")
        x = np.asarray(values, dtype=np.float32)
        if self.rule == CLAMP:
            b = np.float32(self.bound(target))
            finite = np.isfinite(x)
            x = np.where(finite & (x > b), b, np.where(finite & (x < -b), -b, x))
        return round_to(x, target)

    def describe(self, value: float, target: Precision) -> str:
        """``TensorRT: clamped to -65504 with a warning`` for the constant ``value``."""
        if target not in self.formats:
            return (f"{self.title}: no {target.value.upper()} conversion known (the row covers "
                    f"{', '.join(p.value.upper() for p in self.formats)})")
        out = float(self.convert(np.array([value], np.float32), target)[0])
        if self.rule == AS_WRITTEN:
            return (f"{self.title}: runs the model as written ({value:.8g} stays FP32 in an "
                    f"FP32 node; stored in {target.value.upper()} it is what its converter made "
                    "of it)")
        how = "clamped to" if self.rule == CLAMP and np.isfinite(out) else "becomes"
        warned = " with a warning" if self.warning else ""
        return f"{self.title}: {how} {out:.8g}{warned}"


CONVERSIONS: Mapping[str, ConstantConversion] = {
    "strongly-typed": ConstantConversion(
        "strongly-typed", "strongly typed Cast", CAST, "",
        "ONNX Cast (onnx.ai/onnx/operators/onnx__Cast.html): FLOAT to FLOAT16/BFLOAT16 rounds to "
        "nearest, out-of-range values become +-inf (IEEE-754 round-to-nearest overflow); "
        "precision_doctor.formats.round_to"),
    "tensorrt": ConstantConversion(
        "tensorrt", "TensorRT", CLAMP,
        "Weights [name=...] had the following issues when converted to FP16: ... If this is not "
        "the desired behavior, please modify the weights or retrain with regularization to "
        "reduce the magnitude of the weights.",
        "TensorRT builder log of a weakly typed FP16 build (TensorRT 8.2/8.4: "
        "discuss.pytorch.org/t/157663; 8.6: NVIDIA/TensorRT#3257 'TensorRT encountered issues "
        "when converting weights between types'); TensorRT 7 refused the build: 'Weights are "
        "outside of fp16 range' (NVIDIA/TensorRT#420). Not measured here (no TensorRT)",
        None, (Precision.FP16,)),
    "onnxconverter-common": ConstantConversion(
        "onnxconverter-common", "onnxconverter-common", CLAMP,
        "the float32 number {} will be truncated to {}",
        "onnxconverter_common/float16.py, convert_np_to_float16(min_positive_val=1e-7, "
        "max_finite_val=1e4) as called by convert_float_to_float16 (onnxconverter-common "
        "1.16.0)", ONNXCONVERTER_MAX_FINITE, (Precision.FP16,)),
    "ort-cuda": ConstantConversion(
        "ort-cuda", "ONNX Runtime CUDA", AS_WRITTEN, "",
        "ONNX Runtime runs the graph's own element types; it has no FP32 -> FP16 weight "
        "conversion pass (a model is converted before, by a writer or a converter)"),
}
ASSUMED = "strongly-typed"  # what the emulation and the strongly typed writer assume


def conversion_of(engine: str | None) -> ConstantConversion:
    """The row of ``engine`` (``tensorrt``, ``ort-cuda``, ...); the assumed one for None.

    Raises:
        KeyError: Not a row of ``CONVERSIONS``; the message lists them.
    """
    key = (engine or ASSUMED).strip().lower().replace("_", "-").replace(":", "-")
    if key not in CONVERSIONS:
        raise KeyError(f"no constant conversion known for engine {engine!r}; known: "
                       f"{', '.join(CONVERSIONS)}")
    return CONVERSIONS[key]


def engines_on(value: float, target: Precision) -> dict[str, str]:
    """Every engine's conversion of the constant ``value`` in ``target``, in words, keyed by
    engine (the ``engines`` evidence of an out-of-range parameter)."""
    return {k: c.describe(value, target) for k, c in CONVERSIONS.items()}


def clamping_engines(target: Precision) -> tuple[str, ...]:
    """The engines that clamp out-of-range constants to a finite value in ``target``."""
    return tuple(k for k, c in CONVERSIONS.items() if c.rule == CLAMP and target in c.formats)


def clamp_constants(model: onnx.ModelProto, target: Precision, engine: str = "tensorrt"
                    ) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """``model`` with its out-of-range float constants as the clamping ``engine`` stores them.

    Finite float32 values of initializers and ``Constant`` nodes beyond the engine's bound
    (``ConstantConversion.bound``: 65504 for TensorRT in FP16) are clamped to +-bound, in FP32:
    an emulation of the copy in ``target`` then sees what that engine's build sees.

    Args:
        model: The FP32 model (not modified).
        target: FP16 or BF16.
        engine: A ``clamp`` row of ``CONVERSIONS``.

    Returns:
        ``(copy, names of the clamped constants)``; the model itself when nothing is clamped.

    Raises:
        KeyError: ``engine`` is not a row; ValueError: it does not clamp in ``target``.
    """
    row = conversion_of(engine)
    if row.rule != CLAMP or target not in row.formats:
        raise ValueError(f"{row.title} does not clamp constants in {target.value.upper()}")
    bound = row.bound(target)

    def clamped(t: onnx.TensorProto) -> onnx.TensorProto | None:
        if t.data_type != onnx.TensorProto.FLOAT or t.data_location == onnx.TensorProto.EXTERNAL:
            return None
        a = numpy_helper.to_array(t)
        over = np.isfinite(a) & (np.abs(a) > bound)
        if not over.any():
            return None
        return numpy_helper.from_array(np.clip(a, -bound, bound).astype(np.float32), t.name)

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    names: list[str] = []
    for i, t in enumerate(copy.graph.initializer):
        new = clamped(t)
        if new is not None:
            copy.graph.initializer[i].CopyFrom(new)
            names.append(t.name)
    for node in copy.graph.node:
        if node.op_type != "Constant":
            continue
        for attr in node.attribute:
            if attr.name == "value_float" and np.isfinite(attr.f) and abs(attr.f) > bound:
                attr.f = float(np.clip(attr.f, -bound, bound))
                names.append(node.output[0])
            new = clamped(attr.t) if attr.name == "value" else None
            if new is not None:
                attr.t.CopyFrom(new)
                names.append(node.output[0])
    return (copy, tuple(names)) if names else (model, ())
