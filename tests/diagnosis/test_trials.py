"""Impact trials (``diagnosis.causes.trials``): measured once each, and on a shared switched
emulation several together shape by shape, with the errors one trial at a time gives."""

from types import SimpleNamespace

import numpy as np
import pytest
from onnx import TensorProto, helper
from tiny_models import make_model, tensor

from precision_doctor.compare.metrics import l2_terms, relative_l2, relative_l2_of
from precision_doctor.diagnosis.causes.trials import ImpactTrials
from precision_doctor.formats import Precision
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners.ort import OrtRunner
from precision_doctor.runners.sessions import switched

RNG = np.random.default_rng(11)


def _model():
    """Conv -> Mul (large) -> Conv: FP16 rounding everywhere, batch and width symbolic."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Conv", ["x", "W1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["a", "S"], ["b"], name="mul"),
             helper.make_node("Conv", ["b", "W2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    return make_model(nodes, [helper.make_tensor_value_info("x", f, ["n", 3, 5, "w"])],
                      [helper.make_tensor_value_info("y", f, ["n", 3, 5, "w"])],
                      [tensor("W1", RNG.standard_normal((3, 3, 3, 3)).astype(np.float32)),
                       tensor("S", np.float32(3001.7)),
                       tensor("W2", RNG.standard_normal((3, 3, 3, 3)).astype(np.float32))],
                      opset=17)


@pytest.fixture()
def case():
    model = _model()
    widths = [7, 9, 7, 11, 9, 7]  # three shapes in turn, as real crops come
    samples = [SimpleNamespace(feeds={"x": RNG.standard_normal((1, 3, 5, w)).astype(np.float32)})
               for w in widths]
    with OrtRunner(model, ("cpu",)) as r:
        reference = {"y": [r.run(s.feeds)["y"] for s in samples]}
    return model, samples, reference


SETS = [["conv1"], ["mul"], ["conv2"], ["conv1", "mul", "conv2"]]


def test_each_node_set_is_measured_once(case):
    model, samples, reference = case
    trials = ImpactTrials(model, PrecisionPlan(Precision.FP16), "fused", samples, reference,
                          ["y"])
    assert trials.prefetch(SETS) == 0  # on the CPU: nothing shared, each on its own
    first = [trials(s) for s in SETS]
    assert trials.evaluations == 4
    assert [trials(list(reversed(s))) for s in SETS] == first  # a set, not a sequence
    assert trials.evaluations == 4
    assert first[3] < 1e-6 < first[0]  # everything in FP32: the reference itself


def test_prefetch_runs_every_trial_shape_by_shape_with_the_same_errors(case, monkeypatch):
    model, samples, reference = case
    plan = PrecisionPlan(Precision.FP16)
    with switched.sessions(on_cpu=True):  # one trial at a time, same switched emulation
        alone = ImpactTrials(model, plan, "fused", samples, reference, ["y"])
        expected = [alone(s) for s in SETS]
    shapes = []
    run = OrtRunner.run

    def counting(self, feeds, output_names=None):
        if self.name.endswith("-switched"):
            shapes.append(feeds["x"].shape)
        return run(self, feeds, output_names)

    monkeypatch.setattr(OrtRunner, "run", counting)
    with switched.sessions(on_cpu=True):
        trials = ImpactTrials(model, plan, "fused", samples, reference, ["y"])
        assert trials.prefetch(SETS + [["mul"]]) == 4
        # 3 shapes, the largest first, each one batched run per trial, plus the first batch's
        # one-sample check
        assert shapes == [*[(1, 3, 5, 11)] * 4, (2, 3, 5, 9), (1, 3, 5, 9), *[(2, 3, 5, 9)] * 3,
                          *[(3, 3, 5, 7)] * 4]
        got = [trials(s) for s in SETS]
    assert trials.evaluations == 4
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    # the error is relative_l2's, from per-sample terms added in sample order
    with OrtRunner(model, ("cpu",)) as r:
        same = [r.run(s.feeds)["y"] for s in samples]
    assert relative_l2_of([l2_terms(a, b) for a, b in zip(reference["y"], same)]) \
        == relative_l2(reference["y"], same)
    assert relative_l2_of([(1.0, 4.0), None]) == np.inf
