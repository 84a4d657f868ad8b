"""The invariant every search and attribution rests on: the plan with every candidate node in
FP32 is the FP32 model.

``precision.plan.candidate_nodes`` is what a plan can move to FP32. If some node that rounds a
floating-point value were not a candidate (a Cast from int32, a custom-domain op), then "not
even every candidate in FP32 removes the error" would be a statement about the tool, not the
model: the search would give up and the diagnosis would say "unexplained". So before attribution
and before the search, ``check_all_fp32`` verifies it once:

1. statically: the emulation of the all-FP32 plan (``precision.emulate``) inserts no rounding
   at all (no activation round trip, no rounded weight). Where it does, the nodes that still
   round are named: a tool defect (``InvariantError``), never a diagnosis;
2. by measurement, on one sample: that same emulation, run by ONNX Runtime
   (``runners.emulator.EmulatorRunner``), equals the FP32 reference within ``bound`` (relative
   L2 error, ``compare.metrics``) and is finite wherever the reference is: ONNX Runtime must
   optimize it as it optimized the model (the emulation keeps its value_info for that).

Cost: one emulation build (a pass over the graph) and one run of one sample.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import onnx

from precision_doctor.compare.metrics import relative_l2
from precision_doctor.errors import InvariantError
from precision_doctor.formats import Precision
from precision_doctor.precision.conv_bias import FUSED
from precision_doctor.precision.emulate import EmulationInfo, emulate
from precision_doctor.precision.plan import PrecisionPlan, candidate_nodes
from precision_doctor.runners.emulator import EmulatorRunner

# FP32 reassociation between two graphs of the same FP32 arithmetic (ONNX Runtime fuses nodes
# differently around a switched emulation's guards) stays far below this on well-conditioned
# models; an ill-conditioned one is judged against its measured FP32 noise floor instead
# (``check_all_fp32(bound=...)``). A rounding the plan cannot reach is >= FP16's unit roundoff.
DEFAULT_BOUND = 1e-5


def all_fp32_plan(model: onnx.ModelProto, plan: PrecisionPlan) -> PrecisionPlan:
    """``plan`` with every candidate node (``precision.plan.candidate_nodes``) in FP32."""
    return plan.keep_fp32([n.name for n in candidate_nodes(model)], "invariant",
                          "every candidate node in FP32")


def unreached_nodes(model: onnx.ModelProto, plan: PrecisionPlan, conv_bias: str = FUSED
                    ) -> list[str]:
    """Nodes of ``model`` whose values the emulation of the all-FP32 plan still rounds.

    Returns:
        Their names in graph order (empty: the invariant holds statically).

    Raises:
        UnsupportedModelError: Shape/type inference of the model failed.
    """
    if plan.default is Precision.FP32:
        return []
    return _unreached(model, emulate(model, all_fp32_plan(model, plan), conv_bias))


def _unreached(model: onnx.ModelProto, emulation: tuple[onnx.ModelProto, EmulationInfo]
               ) -> list[str]:
    """``unreached_nodes`` read from the all-FP32 plan's emulation."""
    graph, info = emulation
    if info.rounded_activations == 0 and info.rounded_initializers == 0:
        return []
    round_nodes = [n for n in graph.graph.node if n.name.startswith("pd_round/")]
    # an input rounding (pd_round/<p>/in/...) or a rounded weight: its reader still rounds;
    # an output rounding (pd_round/<p>/out/...) reads the raw output of a node that rounds
    rounded = {o for n in round_nodes if n.name.split("/")[2] == "in" for o in n.output}
    rounded |= {t.name for t in graph.graph.initializer if "__pd_" in t.name}
    raw = {i for n in round_nodes if n.name.split("/")[2] == "out" for i in n.input}
    names = {n.name for n in model.graph.node}
    found = [n.name for n in graph.graph.node if n.name in names
             and (set(n.input) & rounded or set(n.output) & raw)]
    order = {n.name: i for i, n in enumerate(model.graph.node)}
    return sorted(set(found), key=lambda n: order.get(n, 0))


def check_all_fp32(model: onnx.ModelProto, plan: PrecisionPlan,
                   feeds: Mapping[str, np.ndarray] | None = None,
                   reference: Mapping[str, np.ndarray] | None = None,
                   conv_bias: str = FUSED, bound: float = DEFAULT_BOUND) -> None:
    """Check that ``plan`` with every candidate in FP32 is the FP32 model (module docstring).

    Args:
        model: The FP32 model (nodes named).
        plan: The plan a search or attribution starts from (its default is the target).
        feeds: One sample's feeds for the measured check (None: static check only).
        reference: The FP32 reference outputs of that sample (output name -> array).
        conv_bias: The candidate's convolution bias model (``precision.conv_bias``).
        bound: Largest relative L2 error allowed between the two (default ``DEFAULT_BOUND``;
            callers with a measured FP32 noise floor pass twice that floor when larger).

    Raises:
        InvariantError: Some node still rounds under the all-FP32 plan (they are named), or
            its outputs differ from the reference beyond ``bound`` or are not finite where the
            reference is.
        BackendError: The emulation fails to run.
    """
    if plan.default is Precision.FP32:
        return
    full = all_fp32_plan(model, plan)
    emulation = emulate(model, full, conv_bias)  # built once: checked, then run
    unreached = _unreached(model, emulation)
    if unreached:
        shown = ", ".join(unreached[:5]) + (f" (+{len(unreached) - 5} more)"
                                            if len(unreached) > 5 else "")
        raise InvariantError(
            f"tool defect: with every candidate node in FP32 the emulation still rounds "
            f"{len(unreached)} node(s) the plan cannot reach: {shown}. The search and the "
            "attribution would be wrong on this model; please report it with the model's op "
            "types.", node=unreached[0])
    if feeds is None or reference is None:
        return
    names = list(reference)
    with EmulatorRunner(model, full, conv_bias=conv_bias, emulation=emulation) as runner:
        outs = runner.run(dict(feeds), names)
    for name in names:
        ref = np.asarray(reference[name])
        if not np.issubdtype(ref.dtype, np.floating):
            continue
        got = np.asarray(outs[name], dtype=ref.dtype)
        bad = int(np.count_nonzero(~np.isfinite(got) & np.isfinite(ref)))
        err = relative_l2([ref], [got])
        if bad or not err <= bound:
            raise InvariantError(
                f"tool defect: with every candidate node in FP32 the emulation of output "
                f"{name!r} differs from the FP32 reference (relative L2 {err:.3g} > {bound:.3g}"
                f"{f', {bad} non-finite values' if bad else ''}). Nothing would be measured "
                "correctly on this model; please report it.", output=name)


__all__ = ["DEFAULT_BOUND", "all_fp32_plan", "check_all_fp32", "unreached_nodes"]
