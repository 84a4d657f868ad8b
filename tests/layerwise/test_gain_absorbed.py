"""An Inf born in FP16 that the next op absorbs (an attention mask before Softmax) is not the
first divergence by error jump; one that propagates still is."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper
from tiny_models import make_model, tensor

from precision_doctor.formats import FORMATS, Precision
from precision_doctor.graph.outputs import producer_inputs
from precision_doctor.layerwise.candidates import emulated, reference_factory
from precision_doctor.layerwise.compare import compare_layerwise
from precision_doctor.layerwise.gain import absorbed_births, largest_jump
from precision_doctor.precision.plan import PrecisionPlan

FP16 = Precision.FP16


def _masked(after: str):
    """scores + mask (-3.4e38 on the masked half) -> ``after`` (Softmax or Mul by 2)."""
    mask = np.zeros((1, 8), np.float32)
    mask[:, 4:] = -3.4e38
    nodes = [helper.make_node("MatMul", ["x", "w"], ["s"], name="scores"),
             helper.make_node("Add", ["s", "mask"], ["masked"], name="mask_add")]
    if after == "Softmax":
        nodes.append(helper.make_node("Softmax", ["masked"], ["y"], name="softmax", axis=-1))
    else:
        nodes.append(helper.make_node("Mul", ["masked", "two"], ["y"], name="double"))
    w = np.random.default_rng(0).normal(0, 0.3, (8, 8)).astype(np.float32)
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
                      [tensor("w", w), tensor("mask", mask),
                       tensor("two", np.array(2.0, np.float32))])


def _jump(model):
    samples = [{"x": np.random.default_rng(i).normal(size=(1, 8)).astype(np.float32)}
               for i in range(2)]
    lw = compare_layerwise(model, samples, reference_factory,
                           emulated(PrecisionPlan(FP16)).factory, FP16, 1e-2)
    inputs_of = producer_inputs(model)
    return lw, inputs_of, largest_jump(lw.records, inputs_of, FORMATS[FP16].unit_roundoff,
                                       lw.threshold)


def test_a_mask_softmax_absorbs_is_not_the_jump():
    lw, inputs_of, jump = _jump(_masked("Softmax"))
    assert lw.nan_birth == "masked"  # the -inf is born in FP16...
    assert absorbed_births(lw.records, inputs_of, lw.threshold) == {"mask_add"}
    assert jump is None  # ...and the Softmax output is right: nothing diverged


def test_an_inf_that_propagates_is_still_the_jump():
    lw, inputs_of, jump = _jump(_masked("Mul"))
    assert not absorbed_births(lw.records, inputs_of, lw.threshold)
    assert jump is not None and jump.record.tensor == "masked" and jump.born_nonfinite
