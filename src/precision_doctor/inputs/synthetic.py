"""Seeded random feeds, only when asked for.

Example: ``random:seed=0,low=-1,high=1,count=4,shape=x:1x3x224x224``.

Random data hides real failures (a field report's fix was "evaluate on real images, not random
data"), so this source exists for smoke tests and for models without data. Values are uniform
in [low, high) for float inputs and uniform integers in [ceil(low), floor(high)] for integer
inputs; the default range [0, 1] is Polygraphy's ``DataLoader`` default ``val_range``. Bool
inputs get fair coin flips. One ``numpy.random.default_rng(seed)`` draws every sample in order
(sample by sample, inputs in model order), so a spec always yields the same data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from precision_doctor.errors import InputError, InputNameError, InputShapeError
from precision_doctor.inputs.feeds import Sample, check_sample, is_dynamic_dim
from precision_doctor.runners.base import TensorMeta

PREFIX = "random"


@dataclass(frozen=True)
class RandomSpec:
    """What random data to make.

    Attributes:
        seed: Seed of ``numpy.random.default_rng``.
        low: Lower bound (inclusive).
        high: Upper bound (exclusive for floats, inclusive for integers).
        count: Number of samples.
        shapes: Input name -> concrete shape; the key ``""`` means "the only input".
    """

    seed: int = 0
    low: float = 0.0
    high: float = 1.0
    count: int = 1
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.count < 1:
            raise InputError(f"random: count must be >= 1, got {self.count}")
        if not self.low <= self.high:
            raise InputError(f"random: low ({self.low}) must be <= high ({self.high})")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; ``from_dict`` reads it back."""
        return {"seed": self.seed, "low": self.low, "high": self.high, "count": self.count,
                "shapes": {k: list(v) for k, v in self.shapes.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RandomSpec:
        """Inverse of ``to_dict``."""
        shapes = {str(k): tuple(int(d) for d in v) for k, v in data.get("shapes", {}).items()}
        return cls(seed=int(data.get("seed", 0)), low=float(data.get("low", 0.0)),
                   high=float(data.get("high", 1.0)), count=int(data.get("count", 1)),
                   shapes=shapes)


def is_random_source(source: object) -> bool:
    """True for ``random`` or ``random:...`` strings."""
    return isinstance(source, str) and (source == PREFIX or source.startswith(PREFIX + ":"))


def is_random_sample(name: str) -> bool:
    """True for the name of a sample ``random_samples`` made (``random[0]``, ...)."""
    return name.startswith(PREFIX + "[")


def _parse_shape(text: str) -> tuple[int, ...]:
    dims = [d for d in text.lower().replace(",", "x").split("x") if d.strip()]
    try:
        shape = tuple(int(d) for d in dims)
    except ValueError as exc:
        raise InputError(f"random: shape {text!r} must be ints separated by x, "
                         "e.g. 1x3x224x224") from exc
    if any(d < 0 for d in shape):
        raise InputError(f"random: shape {text!r} has a negative dim")
    return shape


def parse_random(text: str) -> RandomSpec:
    """Parse ``random:seed=0,low=-1,high=1,count=4,shape=x:1x3x224x224,shape=y:1x10``.

    ``shape=`` may repeat (one per input); ``shape=1x3x224x224`` without a name is for a
    single-input model. Keys may come in any order; all are optional.

    Raises:
        InputError: Not a ``random`` source, unknown key or malformed value.
    """
    if not is_random_source(text):
        raise InputError(f"{text!r} is not a random source (expected random:key=value,...)")
    values: dict[str, Any] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for item in filter(None, (p.strip() for p in text[len(PREFIX) + 1:].split(","))):
        key, eq, value = item.partition("=")
        key = key.strip().lower()
        if not eq:
            raise InputError(f"random: {item!r} is not key=value")
        try:
            if key == "shape":
                name, colon, dims = value.rpartition(":")
                shapes[name.strip() if colon else ""] = _parse_shape(dims)
            elif key in ("seed", "count"):
                values[key] = int(value)
            elif key in ("low", "high"):
                values[key] = float(value)
            else:
                raise InputError(f"random: unknown key {key!r}; known: seed, low, high, count, "
                                 "shape")
        except ValueError as exc:
            raise InputError(f"random: {key}={value!r} is not a number") from exc
    return RandomSpec(shapes=shapes, **values)


def _resolve_shape(meta: TensorMeta, spec: RandomSpec, single: bool) -> tuple[int, ...]:
    if meta.name in spec.shapes:
        return spec.shapes[meta.name]
    if single and "" in spec.shapes:
        return spec.shapes[""]
    for index, dim in enumerate(meta.shape):
        if is_dynamic_dim(dim):
            example = "x".join("1" if is_dynamic_dim(d) else str(d) for d in meta.shape)
            raise InputShapeError(
                f"random: input {meta.name!r} dim {index} is dynamic ({dim!r}); give a concrete "
                f"shape, e.g. shape={meta.name}:{example}", input=meta.name, dim=index)
    return tuple(int(d) for d in meta.shape)


def _draw(rng: np.random.Generator, meta: TensorMeta, shape: tuple[int, ...],
          spec: RandomSpec) -> np.ndarray:
    dtype = np.dtype(meta.dtype)
    if dtype.kind == "f":
        return rng.uniform(spec.low, spec.high, size=shape).astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        low = max(math.ceil(spec.low), int(info.min))
        high = min(math.floor(spec.high), int(info.max))
        if low > high:
            raise InputError(f"random: no integer in [{spec.low}, {spec.high}] for {dtype} "
                             f"input {meta.name!r}; widen low/high", input=meta.name)
        return rng.integers(low, high, size=shape, endpoint=True, dtype=dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    raise InputError(f"random: cannot make {dtype} data for input {meta.name!r}; give real "
                     "data (.npz or Polygraphy JSON)", input=meta.name)


def random_samples(spec: RandomSpec | str, inputs: Sequence[TensorMeta]) -> list[Sample]:
    """Make ``spec.count`` seeded random samples (``random[0]``, ``random[1]``...).

    Args:
        spec: ``RandomSpec`` or its text form.
        inputs: Model inputs; every dynamic dim needs a ``shape=`` entry for its input.

    Returns:
        Validated samples (``check_feeds``).

    Raises:
        InputShapeError: A dynamic dim without a shape (the message names input and dim and
            suggests ``shape=name:...``), or a given shape that contradicts the model.
        InputNameError: ``shape=`` names an input the model does not have.
        InputError: Malformed spec, or a dtype that cannot be drawn (string inputs).
    """
    spec = parse_random(spec) if isinstance(spec, str) else spec
    names = [m.name for m in inputs]
    unknown = sorted(k for k in spec.shapes if k and k not in names)
    if unknown or ("" in spec.shapes and len(inputs) != 1):
        raise InputNameError(
            f"random: shape given for {unknown or 'an unnamed input'} but the model inputs are "
            f"{names}; write shape=<input name>:<dims>")
    shapes = {m.name: _resolve_shape(m, spec, len(inputs) == 1) for m in inputs}
    rng = np.random.default_rng(spec.seed)
    samples = []
    for i in range(spec.count):
        feeds = {m.name: _draw(rng, m, shapes[m.name], spec) for m in inputs}
        samples.append(check_sample(f"{PREFIX}[{i}]", feeds, inputs))
    return samples
