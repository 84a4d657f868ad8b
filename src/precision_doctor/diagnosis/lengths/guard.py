"""The length guard of ``fix``: rounded lengths whose FP32 value sits near a rounding boundary
keep their input cone in FP32, so the written model keeps the reference's shapes on any engine.

The search meets its objective on the emulator; but a duration predicted 1.4 FP16 ULP from
its rounding boundary flips on whichever engine rounds that last bit otherwise (ONNX Runtime
CPU's FP16 kernels did, on the tiny duration model of the tests, where the emulator did not).
A plan that rounds any of the value's inputs to FP16 leaves it to chance. So a shape-setting
rounding site (``diagnosis.lengths.sites``: ``Ceil``/``Floor``/``Round`` -> ``Cast``, or a
truncating ``Cast``, whose integer reaches a shape) is *at risk* when, on some sample, the
FP32 reference's value is within ``NEAR_TIE`` (3x) the low-precision candidate's error there
of its rounding boundary, or its integer already changed; its input cone is then kept in FP32,
where the value is the reference's up to FP32 rounding (2^13 times finer than FP16's).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx

from precision_doctor.diagnosis.lengths.measure import (
    NEAR_TIE,
    Outputs,
    boundary,
    decision_cone,
    run_sites,
)
from precision_doctor.diagnosis.lengths.sites import DecisionSite, decision_sites
from precision_doctor.layerwise.candidates import emulated
from precision_doctor.precision.plan import PrecisionPlan, candidate_nodes


def at_risk(site: DecisionSite, ref: Outputs, cand: Outputs) -> int:
    """How many of the site's values are at risk (module docstring), over all samples."""
    count = 0
    for i, r_int in enumerate(ref[site.tensor]):
        x_r = np.asarray(ref[site.source][i], np.float64)
        x_c = np.asarray(cand[site.source][i], np.float64)
        c_int = cand[site.tensor][i]
        if np.shape(r_int) != np.shape(c_int) or x_r.size != np.size(r_int) \
                or x_c.size != x_r.size:
            count += max(int(np.size(r_int)), 1)
            continue
        x_r, x_c = x_r.reshape(np.shape(r_int)), x_c.reshape(np.shape(r_int))
        err = np.abs(np.where(np.isfinite(x_c), x_c - x_r, np.inf))
        near = np.abs(x_r - boundary(x_r, site.rounding)) <= NEAR_TIE * err
        count += int(np.count_nonzero(near | (np.asarray(r_int) != np.asarray(c_int))))
    return count


def length_guard(model: onnx.ModelProto, samples: Sequence, plan: PrecisionPlan
                 ) -> list[tuple[list[str], str]]:
    """The shape-setting rounding sites at risk under ``plan``'s emulation: each one's input
    cone (the nodes to keep in FP32) and why, in words.

    Args:
        model: The model the plan is for (nodes named).
        samples: Objects with ``.feeds``.
        plan: The start plan (its default is the target format).

    Returns:
        ``(cone, detail)`` per site at risk, graph order; empty (and no run) when the model
        has no shape-setting rounding site.

    Raises:
        BackendError: A run fails.
    """
    sites = [s for s in decision_sites(model) if s.sets_shape and s.rounding]
    if not sites:
        return []
    ref, cand = run_sites(model, samples, emulated(plan), sites)
    out = []
    for site in sites:
        risky = at_risk(site, ref, cand)
        if risky:
            cone = set(decision_cone(model, [site]))
            out.append(([n.name for n in candidate_nodes(model) if n.name in cone], (
                f"{risky} value(s) rounded at {site.node} ({site.rounding}) set an output's "
                f"shape from within {NEAR_TIE:g}x the {plan.default.value.upper()} error of "
                "their rounding boundary: its input cone in FP32 keeps the reference's "
                "shapes (diagnosis.lengths.guard)")))
    return out


__all__ = ["at_risk", "length_guard"]
