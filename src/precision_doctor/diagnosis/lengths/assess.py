"""The assessment of a candidate whose outputs changed shape (``diagnosis.assess`` calls it
last).

A shape change is the most visible failure there is, so it is said first. The kind follows the
changed decisions (``diagnosis.lengths.measure``):

* every root a near-tie: ``decision-flips`` (the format's ordinary error carried a value
  across a rounding boundary it sat on), whatever the error of the equal-shaped outputs;
* otherwise a ``defect`` when the findings' measured cures explain the error (their sentence
  follows the length sentence) or when the roots' input cones in FP32 restore the shapes
  (a measured cure of its own);
* else what the other rules said, with the length sentence first.
"""

from __future__ import annotations

from dataclasses import replace

from precision_doctor.diagnosis.assessment import Assessment
from precision_doctor.diagnosis.lengths.records import LengthReport

NEAR_TIE_REMEDY = (
    "a near-tie is the format's ordinary error on a value that sits on a rounding boundary, "
    "not a defect: keep the decision's input cone in FP32 where the exact length matters "
    "(`precision-doctor fix` keeps the reference's shapes on every sample), or judge the "
    "output by its task")


def with_lengths(result: Assessment, lengths: LengthReport | None) -> Assessment:
    """``result`` re-read with the length report (module docstring); unchanged without one.

    Args:
        result: The assessment of the other rules.
        lengths: The length report, or None when every output kept its shape.

    Returns:
        The assessment, with the length report's sentences first and its numbers in the
        evidence (``shape_changes``, ``length_reading``, ``length_roots``).
    """
    if lengths is None or not lengths.changes:
        return result
    ev = {**result.evidence, "shape_changes": len(lengths.changes),
          "length_reading": lengths.reading, "length_roots": list(lengths.roots)}
    if lengths.cure_rel_l2 is not None:
        ev["length_cure_rel_l2"] = lengths.cure_rel_l2
    head = lengths.summary
    share = 1.0 if lengths.cured else result.explained_share
    if lengths.reading == "near-tie":
        return Assessment("decision-flips", head, ev, NEAR_TIE_REMEDY, share)
    if result.kind == "defect":
        return replace(result, summary=f"{head} {result.summary}", evidence=ev)
    if lengths.cured:
        remedy = (f"keep the {len(lengths.cure_nodes)} nodes before "
                  f"{', '.join(lengths.roots)} in FP32 (`precision-doctor fix` finds the "
                  "fewest of them that keep the reference's shapes)")
        return Assessment("defect", head, ev, remedy, share, tuple(lengths.cure_nodes))
    return replace(result, summary=f"{head} {result.summary}", evidence=ev)


__all__ = ["NEAR_TIE_REMEDY", "with_lengths"]
