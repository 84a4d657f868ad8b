"""Local error gain: how much a node magnifies the error it receives, and where Inf/NaN is born.

One definition, used wherever the tool asks "which layer made the error grow":

    gain(t) = rel_l2(t) / max(input_rel_l2(t), u)
    input_rel_l2(t) = max rel_l2 over the compared, finite-error inputs of t's producer

where ``u`` is the unit roundoff of the target format (2^-11 for FP16). The floor ``u`` is the
error a correctly rounded result carries anyway, so an op whose inputs are exact (graph inputs,
weights) and whose output is merely rounded has gain ~1, not infinity. A well-conditioned op
(condition number ~1..10) keeps the gain in that range; a large gain marks cancellation or an
out-of-range value (e.g. a BatchNorm variance that becomes inf in FP16).

A tensor whose candidate has NaN/Inf while every compared input of its producer is finite is
an Inf/NaN *birth* (gain = inf); NaN/Inf inherited from an input has gain 0 (the node did not
create it), and so has a finite tensor computed from an input with NaN/Inf (the node absorbs
an Inf born upstream, e.g. 1/sqrt(inf) = 0: its error is the upstream event's, not an
amplification of rounding). A reference overflow (|x| > format max) is reported as
``overflow``.

Callers: ``diagnosis.causes.findings`` (amplifier findings), the diagnosis' ``largest_jump`` (first
divergence where the error jumps), and the search's sensitivity ranking / layerwise Inf birth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Collection, Mapping, Sequence

from precision_doctor.graph.random_ops import RANDOM_OPS
from precision_doctor.layerwise.stats import LayerRecord


@dataclass(frozen=True)
class Gain:
    """The local error gain of one tensor.

    Attributes:
        record: The tensor's layerwise record.
        input_rel_l2: Largest finite rel_l2 among its producer's compared inputs (0.0 if none).
        gain: ``rel_l2 / max(input_rel_l2, u)``; ``inf`` at an Inf/NaN birth; 0.0 when the
            NaN/Inf was inherited from an input.
        born_nonfinite: The candidate has NaN/Inf here and every compared input is finite.
        overflow: The reference exceeds the format max here (``record.overflow > 0``).
    """

    record: LayerRecord
    input_rel_l2: float
    gain: float
    born_nonfinite: bool
    overflow: bool

    @property
    def sensitivity(self) -> float:
        """``inf`` where the tensor overflows or Inf/NaN is born, else ``gain`` (search order)."""
        return math.inf if (self.overflow or self.born_nonfinite) else self.gain


def _nonfinite(r: LayerRecord) -> bool:
    return bool(r.cand_nan or r.cand_inf)


def local_gains(records: Sequence[LayerRecord], inputs_of: Mapping[str, Sequence[str]],
                unit_roundoff: float) -> list[Gain]:
    """The local gain of every record, in the records' (topological) order.

    Args:
        records: Layerwise records (``LayerwiseResult.records``).
        inputs_of: Tensor -> input tensors of its producer (``graph.outputs.producer_inputs``).
        unit_roundoff: ``u`` of the target format (``FloatFormat.unit_roundoff``), > 0.

    Returns:
        One ``Gain`` per record. Records whose reference is non-finite get gain 0, and so do
        random operators (``graph.random_ops.RANDOM_OPS``): their values do not depend on
        their input's, so no error grows there.
    """
    by_name = {r.tensor: r for r in records}
    gains = []
    for r in records:
        ups = [by_name[i] for i in inputs_of.get(r.tensor, ()) if i in by_name]
        upstream = max((u.rel_l2 for u in ups if math.isfinite(u.rel_l2)), default=0.0)
        inherited = any(_nonfinite(u) for u in ups)
        born = _nonfinite(r) and not r.ref_nonfinite and not inherited
        if born:
            gain = math.inf
        elif r.ref_nonfinite or not math.isfinite(r.rel_l2) or inherited \
                or r.op_type in RANDOM_OPS:
            gain = 0.0
        else:
            gain = r.rel_l2 / max(upstream, unit_roundoff)
        gains.append(Gain(r, upstream, gain, born, r.overflow > 0))
    return gains


def nonfinite_birth(records: Sequence[LayerRecord], inputs_of: Mapping[str, Sequence[str]]
                    ) -> LayerRecord | None:
    """The first tensor (topological order) where the candidate's NaN/Inf is born, or None."""
    for g in local_gains(records, inputs_of, 1.0):
        if g.born_nonfinite:
            return g.record
    return None


def absorbed_births(records: Sequence[LayerRecord], inputs_of: Mapping[str, Sequence[str]],
                    threshold: float) -> set[str]:
    """Nodes whose Inf/NaN birth their consumers absorb: the tensor has compared consumers, and
    every one of them is finite in the candidate with rel_l2 <= ``threshold``. The typical case
    is an additive attention mask of -3.4e38 (float32's lowest) that FP16 turns into -inf and
    the Softmax after it turns into exact zeros: the candidate is right there, the "birth" is
    the FP16 spelling of the same mask.

    Args:
        records / inputs_of: As :func:`local_gains`.
        threshold: The divergence threshold (``LayerwiseResult.threshold``).
    """
    by_name = {r.tensor: r for r in records}
    consumers: dict[str, list[LayerRecord]] = {}
    for tensor, inputs in inputs_of.items():
        if tensor in by_name:
            for name in inputs:
                consumers.setdefault(name, []).append(by_name[tensor])
    out = set()
    for g in local_gains(records, inputs_of, 1.0):
        after = consumers.get(g.record.tensor, [])
        if g.born_nonfinite and after and all(
                not _nonfinite(c) and math.isfinite(c.rel_l2) and c.rel_l2 <= threshold
                for c in after):
            out.add(g.record.node)
    return out


def top_gains(records: Sequence[LayerRecord], inputs_of: Mapping[str, Sequence[str]],
              unit_roundoff: float, threshold: float, k: int, min_gain: float = 2.0
              ) -> list[Gain]:
    """The ``k`` finite largest gains among tensors whose rel_l2 ends above ``threshold``.

    Args:
        records / inputs_of / unit_roundoff: As :func:`local_gains`.
        threshold: Only tensors with ``rel_l2 > threshold`` count (the divergence threshold).
        k: How many to return.
        min_gain: Gains at or below this are ordinary rounding (a rounded op has ~1; 2 allows
            for the factor-of-two spread of measured rel_l2).

    Returns:
        Largest gain first; ties in topological order.
    """
    scored = [g for g in local_gains(records, inputs_of, unit_roundoff)
              if math.isfinite(g.gain) and g.gain > min_gain
              and math.isfinite(g.record.rel_l2) and g.record.rel_l2 > threshold]
    scored.sort(key=lambda g: (-g.gain, g.record.index))
    return scored[:k]


def largest_jump(records: Sequence[LayerRecord], inputs_of: Mapping[str, Sequence[str]],
                 unit_roundoff: float, threshold: float,
                 harmless: Collection[str] = ()) -> Gain | None:
    """The first divergence by error jump: where the error grows most beyond its inputs.

    An Inf/NaN birth is the largest possible jump (the first one wins), unless its node is in
    ``harmless`` (e.g. an attention mask whose -inf was measured not to change the outputs) or
    its consumers absorb it (``absorbed_births``).
    Otherwise the largest finite gain among tensors that end above ``threshold`` (a jump to an
    error that stays below the tolerance is not a divergence).

    Returns:
        The ``Gain`` or None when no tensor ends above ``threshold``.
    """
    gains = local_gains(records, inputs_of, unit_roundoff)
    harmless = set(harmless) | absorbed_births(records, inputs_of, threshold)
    born = next((g for g in gains if g.born_nonfinite and g.record.node not in harmless), None)
    if born is not None:
        return born
    above = [g for g in gains if math.isfinite(g.gain) and math.isfinite(g.record.rel_l2)
             and g.record.rel_l2 > threshold]
    if not above:
        return None
    return min(above, key=lambda g: (-g.gain, g.record.index))


__all__ = ["Gain", "largest_jump", "local_gains", "nonfinite_birth", "top_gains"]
