"""The exact emulation of a quantized engine on ONNX Runtime CPU: the Q/DQ model
(``quant.qdq``) with everything between the Q/DQ pairs rounded to the engine's float precision
(FP16 by default) by the project's emulator (``precision.emulate``).

ONNX Runtime CPU runs QuantizeLinear/DequantizeLinear for INT8 and FLOAT8E4M3FN exactly as
ONNX specifies (round half to even, saturation; ``tests/quant/test_qformats.py`` checks it
against ``onnx.reference`` and ``quant.qformats``).
"""

from __future__ import annotations

from typing import Callable, Sequence, Union

import numpy as np
import onnx

from precision_doctor.formats import Precision
from precision_doctor.graph.outputs import mark_outputs
from precision_doctor.precision.emulate import emulate
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.quant.placement import QuantUnit
from precision_doctor.quant.qdq import QuantConfig, insert_qdq
from precision_doctor.runners.ort import OrtRunner

Outputs = dict[str, list[np.ndarray]]
# The float precision between the Q/DQ pairs: one format, or a plan (FP16 with the FP32 nodes
# the model needs in FP16 itself, found by ``fix --target fp16``'s search).
Between = Union[Precision, PrecisionPlan]


def as_plan(between: Between) -> PrecisionPlan:
    """``between`` as a plan (a format: every node in it)."""
    return between if isinstance(between, PrecisionPlan) else PrecisionPlan(between)


def describe_between(between: Between) -> str:
    """``fp16``, or ``fp16 + 3 nodes FP32`` for a plan with FP32 nodes."""
    plan = as_plan(between)
    kept = plan.fp32_nodes()
    return plan.default.value + (f" + {len(kept)} nodes FP32" if kept else "")
# ONNX Runtime's extended graph optimizations change what an FP8 Q/DQ model computes: on
# PP-OCR cls quantized to FP8 (E4M3), a depthwise Conv's output moved 0.0108 -> 0.556 relative
# error power between ``basic`` and ``extended`` (ONNX Runtime 1.32 CPU, 2026-11-28;
# ``tests/quant/test_emulation.py`` has the minimal case): the emulation runs at ``basic``
# (constant folding and exact eliminations only).
EMULATION_OPTIMIZATION = "basic"


def quantized_model(model: onnx.ModelProto, units: Sequence[QuantUnit], config: QuantConfig,
                    between: Between = Precision.FP16, marks: Sequence[str] = ()
                    ) -> onnx.ModelProto:
    """The emulation model of ``config``: Q/DQ inserted, ``marks`` made outputs, the rest
    emulated in ``between`` (FP32: the Q/DQ model as it is).

    Raises:
        UnsupportedModelError: As ``quant.qdq.insert_qdq`` and ``precision.emulate.emulate``.
    """
    qdq = insert_qdq(model, units, config)
    if marks:
        qdq = mark_outputs(qdq, [m for m in marks if m not in
                                 {o.name for o in qdq.graph.output}])
    plan = as_plan(between)
    if plan.default is Precision.FP32 and not plan.overrides:
        return qdq
    emulated, _ = emulate(qdq, plan)
    return emulated


def run_outputs(model: onnx.ModelProto, samples: Sequence, names: Sequence[str],
                stop: Callable[[int, dict[str, np.ndarray]], bool] | None = None
                ) -> Outputs:
    """Run ``model`` on ONNX Runtime CPU over ``samples``; outputs ``names`` as float32 lists.
    ``stop(index, outputs)`` returning True ends the run early (fail-fast trials)."""
    out: Outputs = {n: [] for n in names}
    with OrtRunner(model, name="quant-emulate",
                   graph_optimization=EMULATION_OPTIMIZATION) as runner:
        for i, sample in enumerate(samples):
            got = runner.run(sample.feeds, list(names))
            for n in names:
                a = got[n]
                out[n].append(a.astype(np.float32) if a.dtype.kind == "f" else a)
            if stop is not None and stop(i, got):
                break
    return out


def run_config(model: onnx.ModelProto, units: Sequence[QuantUnit], config: QuantConfig,
               samples: Sequence, between: Between = Precision.FP16) -> Outputs:
    """The model outputs of ``config``'s emulation on every sample."""
    names = [o.name for o in model.graph.output]
    return run_outputs(quantized_model(model, units, config, between), samples, names)
