"""Range-bound FP16 cures: where FP16 needs many FP32 nodes only for its range, say so and
measure BF16, which has FP32's range, as the alternative.

An FP16 plan is *range-bound* when all of these hold (measured quantities only):

* the FP32 reference reaches a magnitude above FP16's max (65504) in the layerwise comparison
  the ranking ran (``repair.ranking.Ranking.peak``), in at least one overflow region (tensors
  above 65504, their producers and readers: ``diagnosis.causes.cures.layerwise_regions``);
* the cure is large: at least ``MIN_NODES`` (16) nodes kept in FP32 by the search, or at least
  ``MIN_FLOPS`` (10%) of the FLOPs in FP32. 16 is the count of overflow nodes from which the
  search goes by regions (``repair.ranking.REGION_MIN_OVERFLOW``); 10% of the FLOPs in FP32
  already takes a visible part of FP16's speed-up on an engine that runs those nodes at FP32
  rate.

The kept nodes need not all lie in overflow regions: a stream far above 65504 also makes
its neighbours lose digits (a GroupNorm's mean subtracted from values of 1e7). What settles it
is the measurement that follows: BF16 rounds 8x coarser than FP16 (unit roundoff 2^-8 against
2^-11) and has FP32's range, so where BF16 alone meets its tolerance, what FP16 needed its FP32
nodes for is range, not rounding.

Then ``fix`` runs the rewritten model once in emulated BF16 (every node, the CPU emulator) on
all calibration samples and reports its worst output's relative L2 against BF16's default
tolerance (``compare.tolerance.default_tolerance``: 8e-2, from BF16's unit roundoff 3.9e-3
times a deep network's accumulation), and whether it meets the objective ``fix`` was given.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import onnx

from precision_doctor.compare.metrics import compute_metrics
from precision_doctor.compare.tolerance import default_tolerance
from precision_doctor.formats import FORMATS, Precision
from precision_doctor.layerwise.candidates import run_samples
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners.emulator import EmulatorRunner
from precision_doctor.search.objective import Objective, Outputs

MIN_NODES = 16  # FP32 nodes kept for range from which a cure is range-bound
MIN_FLOPS = 0.10  # or this share of the FLOPs in FP32


def is_range_bound(target: Precision, peak: float, kept: Sequence[str],
                   overflow: Mapping[str, tuple[str, ...]], flops: float) -> bool:
    """Whether an FP16 cure is range-bound (module docstring).

    Args:
        target: The target format (only FP16 can be range-bound).
        peak: Largest |x| of the FP32 reference in the ranking's layerwise comparison.
        kept: Nodes the search kept in FP32.
        overflow: Candidate node -> its overflow region (``Ranking.overflow``).
        flops: Share of the FLOPs in FP32 in the written plan, in [0, 1].
    """
    if target is not Precision.FP16 or peak <= FORMATS[Precision.FP16].max or not overflow:
        return False
    return len(kept) >= MIN_NODES or flops >= MIN_FLOPS


def bf16_alternative(model: onnx.ModelProto, samples: Sequence, reference: Outputs,
                     objective: Objective, conv_bias: str) -> dict:
    """The rewritten model all in emulated BF16, against BF16's default tolerance and against
    ``objective``.

    Returns:
        ``{"rel_l2", "output", "tolerance", "passed", "objective_passed", "score"}``:
        the worst output's relative L2, which output, BF16's default tolerance, whether that
        error is within it, and the objective's verdict and value on BF16.

    Raises:
        BackendError: ONNX Runtime fails on the model.
    """
    names = list(reference)
    outputs = run_samples(EmulatorRunner(model, PrecisionPlan(Precision.BF16),
                                         conv_bias=conv_bias), samples, names)
    errors = {k: compute_metrics(reference[k], outputs[k]).rel_l2 for k in names
              if getattr(reference[k][0], "dtype", None) is not None
              and reference[k][0].dtype.kind == "f"}
    worst = max(errors, key=lambda k: errors[k]) if errors else names[0]
    tol = default_tolerance(Precision.BF16).rel_l2 or 0.0
    score = objective.score(reference, outputs)
    rel = errors.get(worst, float("nan"))
    return {"rel_l2": rel, "output": worst, "tolerance": tol, "passed": bool(rel <= tol),
            "objective_passed": score.passed, "score": score.value}


def range_bound_report(fp32_nodes: int, in_overflow: int, flops: float, peak: float,
                       bf16: Mapping) -> dict:
    """The ``range_bound`` section of the fix report, with its one-line ``message``."""
    verdict = ("BF16 alone meets its tolerance" if bf16["passed"]
               else "BF16 alone does not meet its tolerance either")
    sign = "<=" if bf16["passed"] else ">"
    message = (f"range-bound: the FP16 cure keeps {fp32_nodes} nodes ({flops:.1%} of FLOPs) in "
               f"FP32 ({in_overflow} in overflow regions, values up to {peak:.3g} > 65504); "
               f"{verdict} (rel L2 {bf16['rel_l2']:.3g} {sign} {bf16['tolerance']:g})")
    if bf16["passed"] and bf16["objective_passed"]:
        message += ": `fix --target bf16` meets this objective with BF16's range"
    return {"fp32_nodes": fp32_nodes, "in_overflow": in_overflow, "flops": flops, "peak": peak,
            "format_max": FORMATS[Precision.FP16].max, "bf16": dict(bf16), "message": message}


__all__ = ["MIN_FLOPS", "MIN_NODES", "bf16_alternative", "is_range_bound",
           "range_bound_report"]
