"""The records of how decisions fared: one ``DecisionFlip`` per changed decision, one
``DecisionSummary`` per decision output (definitions: ``diagnosis.decisions.reading``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping

from precision_doctor.jsonable import from_json_float, json_float


@dataclass(frozen=True)
class DecisionFlip:
    """One position whose decision changed. See the module docstring for the definitions.

    Attributes:
        output / sample: Output name; the input's name (file name or index).
        position: Index in the sample's output array without the class axis (batch first).
        fp32_margin: Reference top-1 minus top-2 score (sigmoid maps: |p - threshold|).
        fp32_noise: Largest per-class change at the position under the FP32 noise probes
            (output units); None when no probe output was available.
        task_changed: Whether the task-level result changed (None: unknown).
        error_share: Squared error at the position / total squared error of the output.
        fp32_top: Reference top-1 and top-2 class (sigmoid maps: [decision, other]).
        candidate_top: Candidate top-1 class (-1 when its scores are NaN).
        detail: One sentence for reports.
        reading: ``task-neutral``, ``near-tie`` or ``damage`` (module docstring).
    """

    output: str
    sample: str
    position: tuple[int, ...]
    fp32_margin: float
    fp32_noise: float | None
    task_changed: bool | None
    error_share: float
    fp32_top: tuple[int, int]
    candidate_top: int
    detail: str = ""
    reading: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["position"], d["fp32_top"] = list(self.position), list(self.fp32_top)
        return {k: json_float(v) for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: Mapping) -> DecisionFlip:
        noise = d.get("fp32_noise")
        return cls(d["output"], str(d["sample"]), tuple(int(i) for i in d["position"]),
                   from_json_float(d["fp32_margin"]),
                   from_json_float(noise) if noise is not None else None, d.get("task_changed"),
                   from_json_float(d["error_share"]), tuple(d.get("fp32_top", (0, 0))),
                   int(d.get("candidate_top", -1)), d.get("detail", ""), d.get("reading", ""))


@dataclass(frozen=True)
class DecisionSummary:
    """How one decision output's decisions fared.

    Attributes:
        output / kind / axis: The output, its kind (module docstring) and class axis.
        positions / flips: Decisions compared and decisions changed (all samples).
        argmax_agreement: ``1 - flips / positions``.
        task_agreement: CTC: share of items whose decoded text is equal; classifier: the
            argmax agreement; else None.
        task_metric: The metric behind ``task_agreement`` (``ctc-string``, ``top1``) or None.
        suggested_metric: The ``--metric`` spec that ``fix`` should target, or None.
        why: Why (one sentence).
        rel_l2_without_flips: L2 error of the positions that did not flip over the L2 norm
            of the whole reference output.
        flip_error_share: Share of the output's squared error carried by the flips (1.0 when
            flipped positions hold NaN/Inf scores and every such position flipped).
        near_ties / task_neutral / damage: Flips by reading (module docstring).
        typical_error: The RMS per-position error of the positions that did not flip
            (output units), the scale a near-tie margin is compared with; None if all flipped.
        damage_margin: Median FP32 margin of the damage flips, or None.
        destroyed: More than ``DESTROYED_SHARE`` of the decisions flipped.
    """

    output: str
    kind: str
    axis: int
    positions: int
    flips: int
    argmax_agreement: float
    task_agreement: float | None
    task_metric: str | None
    suggested_metric: str | None
    why: str
    rel_l2_without_flips: float | None
    flip_error_share: float = 0.0
    near_ties: int = 0
    task_neutral: int = 0
    damage: int = 0
    typical_error: float | None = None
    damage_margin: float | None = None
    destroyed: bool = False

    @property
    def benign(self) -> bool:
        """Every flip is a near-tie or task-neutral, and the output is not destroyed."""
        return not self.damage and not self.destroyed

    def to_dict(self) -> dict:
        return {k: json_float(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: Mapping) -> DecisionSummary:
        f = {k: (from_json_float(v) if k in ("argmax_agreement", "task_agreement",
                                              "rel_l2_without_flips", "flip_error_share",
                                              "typical_error", "damage_margin")
                 and v is not None else v) for k, v in d.items()}
        return cls(**f)


__all__ = ["DecisionFlip", "DecisionSummary"]
