"""Held-out evaluation of ``fix``: samples kept out of the search, and the written model scored
on them afterwards, by the same objective, so that a pass holds on samples the search did not
tune on.

    samples -> split_holdout -> HoldoutSplit (search samples | held-out samples)
    written model + held-out samples -> score_held -> Score -> holdout_check -> HoldoutCheck

Every ``fix`` (FP16, BF16, INT8, FP8) splits where its samples enter (``api.fixing.fix``,
``api.quantizing.fix_quantized``), once. The plan is chosen on the search samples (for INT8/FP8
they also calibrate, unless a calibration set is given); the held-out ones are run only after
the model is written. A plan that passes the search samples and fails the held-out ones
overfits them: the verdict says ``overfits``.

Which samples are held out is deterministic: the samples sorted by the SHA-256 of
``"<seed>:<name>"`` (index to break ties), the first N held out, then put back in sample order.
The choice depends on the names only, so adding samples never moves one already held out into
the search unless it is displaced by a new one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from precision_doctor.errors import InputError
from precision_doctor.jsonable import json_float
from precision_doctor.layerwise.candidates import (
    check_finite_reference,
    reference_factory,
    run_samples,
)
from precision_doctor.repair.stages import FixRequest
from precision_doctor.repair.verify import Verification, Written, written_runner
from precision_doctor.runners.base import Runner
from precision_doctor.search.near_ties import find_near_ties
from precision_doctor.search.objective import Objective, Score

# With fewer samples than this, no sample is held out by default: one sample fewer for the
# search is a large share of the evidence the plan is chosen on (a design choice, not measured).
DEFAULT_MIN_SAMPLES = 8
DEFAULT_SHARE = 10  # by default, one sample in this many is held out (at least one)
SEED = 0


@dataclass(frozen=True)
class HoldoutSplit:
    """The samples the search sees and the ones it never sees.

    Attributes:
        search: Samples the plan is chosen on (and, for INT8/FP8 without a calibration set,
            calibrated on), in sample order.
        held: Samples kept out of the search, in sample order.
        held_indices: Their indices among all the samples given.
        total: How many samples were given.
        requested: The ``--holdout`` asked for; None: the default rule (``default_holdout``).
        seed: Seed of the choice (module docstring).
    """

    search: tuple = field(repr=False)
    held: tuple = field(repr=False)
    held_indices: tuple[int, ...]
    total: int
    requested: int | None
    seed: int = SEED

    def held_objective(self, objective: Objective) -> Objective:
        """``objective`` for the held-out samples: per-sample contexts (labels, source sizes)
        taken from an objective built for all the samples, near-tie exclusions dropped (they
        are found again on the held-out samples)."""
        contexts = tuple(objective.contexts[i] for i in self.held_indices) \
            if objective.contexts else ()
        return replace(objective, contexts=contexts, exclude=frozenset())


def default_holdout(total: int) -> int:
    """How many of ``total`` samples are held out when ``--holdout`` is not given: none below
    ``DEFAULT_MIN_SAMPLES``, else one in ``DEFAULT_SHARE`` (at least one)."""
    return 0 if total < DEFAULT_MIN_SAMPLES else max(1, total // DEFAULT_SHARE)


def split_holdout(samples: Sequence, holdout: int | None = None, seed: int = SEED
                  ) -> HoldoutSplit:
    """Split ``samples`` into the search's and the held-out ones (module docstring).

    Args:
        samples: Samples (``.name``), in order.
        holdout: How many to hold out; None: ``default_holdout``; 0: none.
        seed: Seed of the choice.

    Returns:
        ``HoldoutSplit``.

    Raises:
        InputError: ``holdout`` is negative, or leaves no sample for the search.
    """
    total = len(samples)
    count = default_holdout(total) if holdout is None else int(holdout)
    if count < 0 or (count and count >= total):
        raise InputError(f"--holdout {holdout} of {total} samples leaves "
                         f"{'a negative count' if count < 0 else 'no sample for the search'}:"
                         f" hold out 0 to {max(total - 1, 0)} samples (0 turns the check off)")

    def key(i: int) -> tuple[str, int]:
        name = str(getattr(samples[i], "name", i))
        return hashlib.sha256(f"{seed}:{name}".encode()).hexdigest(), i

    held = sorted(sorted(range(total), key=key)[:count])
    kept = [i for i in range(total) if i not in held]
    return HoldoutSplit(tuple(samples[i] for i in kept), tuple(samples[i] for i in held),
                        tuple(held), total, holdout, seed)


def score_held(model: Any, runner: Runner, samples: Sequence, objective: Objective,
               names: Sequence[str]) -> Score:
    """Score the written model (``runner``, not yet entered) on held-out samples against the
    FP32 reference of ``model``, as ``fix`` verifies on the search samples: the objective with
    the samples' contexts, near-ties of a decision metric left out (``search.near_ties``).

    Raises:
        ReferenceError_: The FP32 reference produces NaN/Inf on a held-out sample.
        BackendError: ONNX Runtime fails.
        MetricError: The task metric fails.
    """
    reference = run_samples(reference_factory(model), samples, names)
    check_finite_reference(reference, [getattr(s, "name", str(i)) for i, s in enumerate(samples)])
    objective = objective.with_samples(samples)
    ties = find_near_ties(model, samples, reference, objective)
    if ties and len(ties) < len(samples):
        objective = replace(objective, exclude=frozenset(t.index for t in ties))
    return objective.score(reference, run_samples(runner, samples, names))


@dataclass(frozen=True)
class HoldoutCheck:
    """The ``holdout`` object of a fix report.

    Attributes:
        samples: How many samples were held out (0: not checked).
        indices / names: Which, by index among the samples split (every sample given; for
            INT8/FP8, the evaluation samples) and by name.
        search_samples: How many samples the search saw (evaluated on).
        chosen: ``requested`` (``--holdout N``), ``default`` (``default_holdout``) or ``off``
            (``--holdout 0``, or too few samples for the default).
        seed: Seed of the choice (``split_holdout``).
        score: The objective's value on the held-out samples (``Score.value``: worst relative
            L2 / tolerance, or the worst sample's task metric); None when not checked.
        passed: Whether the held-out samples meet the objective; None when not checked.
        search_score / search_passed: The written model on the search samples (the fix's
            ``score_after``), for the line beside it.
        score_label: What the scores measure (``Objective.score_label``).
        message: The check in one sentence, with what to do.
    """

    samples: int
    indices: tuple[int, ...]
    names: tuple[str, ...]
    search_samples: int
    chosen: str
    seed: int
    score: float | None
    passed: bool | None
    search_score: float | None
    search_passed: bool | None
    score_label: str = "score"
    message: str = ""

    @property
    def overfits(self) -> bool:
        """The plan passes the search samples and fails the held-out ones."""
        return bool(self.search_passed) and self.passed is False

    def to_dict(self) -> dict:
        """JSON form (``from_dict`` reads it back)."""
        return {"samples": self.samples, "indices": list(self.indices),
                "names": list(self.names), "search_samples": self.search_samples,
                "chosen": self.chosen, "seed": self.seed,
                "score": None if self.score is None else json_float(self.score),
                "passed": self.passed,
                "search_score": None if self.search_score is None
                else json_float(self.search_score),
                "search_passed": self.search_passed, "score_label": self.score_label,
                "overfits": self.overfits, "message": self.message}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HoldoutCheck:
        """The check from ``to_dict``'s JSON."""
        def num(x: Any) -> float | None:
            return None if x is None else float(x)

        return cls(int(data["samples"]), tuple(data["indices"]), tuple(data["names"]),
                   int(data["search_samples"]), str(data["chosen"]), int(data["seed"]),
                   num(data.get("score")), data.get("passed"), num(data.get("search_score")),
                   data.get("search_passed"), str(data.get("score_label", "score")),
                   str(data.get("message", "")))


def check_written(request: FixRequest, written: Written, verified: Verification,
                  split: HoldoutSplit, objective: Objective) -> HoldoutCheck:
    """The held-out check of an FP16/BF16 ``fix``: the written model, run by the runner that
    verified it (``repair.verify.written_runner``), scored on ``split.held`` with
    ``objective`` (``HoldoutSplit.held_objective``); ``verified.score`` is the search
    samples' score beside it.

    Raises:
        ReferenceError_, BackendError, MetricError: As ``score_held``.
    """
    score = None
    if split.held:
        _requested, _note, runner = written_runner(written, request)
        score = score_held(request.model, runner, split.held, objective, request.output_names)
    return holdout_check(split, score, verified.score, objective.score_label())


def holdout_check(split: HoldoutSplit, held: Score | None, search: Score,
                  score_label: str = "score") -> HoldoutCheck:
    """The report's ``holdout`` object: ``held`` (``score_held`` on ``split.held``; None when
    nothing was held out) beside the search samples' ``search`` score."""
    names = tuple(str(getattr(s, "name", i)) for s, i in zip(split.held, split.held_indices))
    n, searched = len(split.held), len(split.search)
    chosen = "off" if not n else ("default" if split.requested is None else "requested")
    check = HoldoutCheck(n, split.held_indices, names, searched, chosen, split.seed,
                         None if held is None else float(held.value),
                         None if held is None else bool(held.passed), float(search.value),
                         bool(search.passed), score_label)
    return replace(check, message=_message(check, split))


def _message(c: HoldoutCheck, split: HoldoutSplit) -> str:
    """The check in one sentence: what was held out, and what the result means."""
    if not c.samples:
        why = ("--holdout 0" if split.requested == 0 else
               f"{split.total} samples are fewer than {DEFAULT_MIN_SAMPLES}, so none was held "
               "out by default; --holdout N keeps N out of the search")
        return f"the plan was not checked on unseen samples ({why})"
    how = ("by default (one in " f"{DEFAULT_SHARE}, from {DEFAULT_MIN_SAMPLES} samples up; "
           "--holdout N to choose, 0 for none)" if c.chosen == "default" else "(--holdout)")
    which = ", ".join(c.names[:3]) + (f" +{c.samples - 3}" if c.samples > 3 else "")
    head = (f"{c.samples} of {split.total} samples held out of the search {how}: {which}; "
            f"the written model scores {c.score_label} {c.score:.4g} on them "
            f"({'pass' if c.passed else 'fail'})")
    if c.overfits:
        return (f"{head}. The plan overfits: it meets the objective on the {c.search_samples} "
                "samples the search saw, not on the ones it never saw. Add more (and more "
                "varied) samples to --data so the search sees what the held-out ones need")
    return head


def check_quantized(model: Any, written: Any, split: HoldoutSplit, objective: Objective,
                    search: Score) -> HoldoutCheck:
    """The held-out check of an INT8/FP8 ``fix``: the written Q/DQ model, run by its exact
    emulation (``runners.emulator.WrittenEmulatorRunner``, as ``quant.fix.write_and_verify``
    verifies it), scored on ``split.held`` against the FP32 ``model``; ``search`` is the
    written model's score on the evaluation samples.

    Raises:
        ReferenceError_, BackendError, MetricError: As ``score_held``.
    """
    from precision_doctor.quant.emulation import EMULATION_OPTIMIZATION
    from precision_doctor.runners.emulator import WrittenEmulatorRunner

    score = None
    if split.held:
        runner = WrittenEmulatorRunner(written, graph_optimization=EMULATION_OPTIMIZATION)
        score = score_held(model, runner, split.held, split.held_objective(objective),
                           [o.name for o in model.graph.output])
    return holdout_check(split, score, search, objective.score_label())
