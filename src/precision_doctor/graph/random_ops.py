"""Random operators without a seed, seeded so that the reference and the candidate draw the
same numbers.

A VITS voice run with its noise on (``RandomNormalLike`` without a ``seed``) gives another
waveform, and even another length, at every run of the same FP32 model: no comparison is
possible. ONNX's random operators take an optional float attribute ``seed`` (ONNX operator
specs: RandomNormal, RandomNormalLike, RandomUniform, RandomUniformLike, Multinomial,
Bernoulli); with it ONNX Runtime starts the operator's generator from that seed when the session
is created, so two sessions that run the same samples in the same order draw the same numbers.
Runs in another order (or several runs of one session) draw others: what nondeterminism remains
shows in the FP32 noise floor.
"""

from __future__ import annotations

import onnx
from onnx import helper

RANDOM_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform",
                        "RandomUniformLike", "Multinomial", "Bernoulli"})
FIRST_SEED = 1234.0  # seeds FIRST_SEED, FIRST_SEED + 1, ... in graph order


def unseeded_random_ops(model: onnx.ModelProto) -> list[str]:
    """Names of the top-level random operators without a ``seed`` attribute, graph order."""
    return [n.name or n.output[0] for n in model.graph.node
            if n.op_type in RANDOM_OPS and n.domain in ("", "ai.onnx")
            and not any(a.name == "seed" for a in n.attribute)]


def seed_random_ops(model: onnx.ModelProto) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """A copy of ``model`` whose unseeded random operators have a ``seed`` (module docstring).

    Args:
        model: The model (not modified).

    Returns:
        ``(model, seeded node names)``: ``model`` itself when nothing needed a seed.
    """
    names = unseeded_random_ops(model)
    if not names:
        return model, ()
    seeded = onnx.ModelProto()
    seeded.CopyFrom(model)
    wanted, k = set(names), 0
    for n in seeded.graph.node:
        if (n.name or n.output[0]) in wanted and n.op_type in RANDOM_OPS \
                and not any(a.name == "seed" for a in n.attribute):
            n.attribute.append(helper.make_attribute("seed", FIRST_SEED + k))
            k += 1
    return seeded, tuple(names)


def unseed_random_ops(model: onnx.ModelProto, names: tuple[str, ...]) -> onnx.ModelProto:
    """``model`` with the ``seed`` attribute of the nodes ``names`` removed again: a model
    written for deployment draws fresh numbers as the user's model did (in place; returned)."""
    wanted = set(names)
    for n in model.graph.node:
        if (n.name or n.output[0]) in wanted and n.op_type in RANDOM_OPS:
            kept = [a for a in n.attribute if a.name != "seed"]
            del n.attribute[:]
            n.attribute.extend(kept)
    return model


def seeded_note(names: tuple[str, ...]) -> str:
    """The report's sentence about seeded random operators ("" when none)."""
    if not names:
        return ""
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (f"{len(names)} random operator(s) without a seed ({shown}) were given the same "
            "ONNX `seed` in the reference and the candidate, so both draw the same numbers "
            "when they run the samples in the same order")


__all__ = ["RANDOM_OPS", "seed_random_ops", "seeded_note", "unseed_random_ops",
           "unseeded_random_ops"]
