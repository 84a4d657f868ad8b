"""Scalars crossing segment boundaries in the I/O-bound (resident) layerwise path.

Exported attention reads its batch size as ``Gather(Shape(x), 0)``, a 0-d int64, then
``Unsqueeze -> Concat`` builds a reshape target from it. When a segment cut falls between the
``Gather`` and its readers, the scalar comes back to the host and is bound again as the next
segment's input; it must stay 0-d there (BERT-large failed with "Concat ...: Ranks of input
data are different" when it was bound as [1]).
"""

import math

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper
from tiny_models import make_model

from precision_doctor.formats import Precision
from precision_doctor.layerwise.candidates import emulated, reference_factory
from precision_doctor.layerwise.compare import compare_layerwise
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners.ort import OrtRunner


def scalar_boundaries():
    """``y = Reshape(x / max|x|, [batch, -1])``: the batch size (int64) and the maximum
    (float32) are 0-d tensors read by later nodes, so one segment per node carries both."""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("ReduceMax", ["a"], ["top"], name="top", keepdims=0),
        helper.make_node("Div", ["a", "top"], ["scaled"], name="scale"),
        helper.make_node("Shape", ["scaled"], ["shp"], name="shape"),
        helper.make_node("Gather", ["shp", "zero"], ["batch"], name="batch", axis=0),
        helper.make_node("Unsqueeze", ["batch", "axis0"], ["batch1"], name="unsqueeze"),
        helper.make_node("Concat", ["batch1", "minus1"], ["target"], name="concat", axis=0),
        helper.make_node("Reshape", ["scaled", "target"], ["y"], name="reshape"),
    ]
    inits = [helper.make_tensor("zero", i64, [], [0]),
             helper.make_tensor("axis0", i64, [1], [0]),
             helper.make_tensor("minus1", i64, [1], [-1])]
    return make_model(nodes, [helper.make_tensor_value_info("x", f, ["batch", 4, 8])],
                      [helper.make_tensor_value_info("y", f, ["batch", 32])], inits)


def _samples():
    rng = np.random.default_rng(11)
    return [{"x": rng.standard_normal((2, 4, 8)).astype(np.float32) * 50} for _ in range(2)]


def _compare(resident):
    plan = PrecisionPlan(Precision.FP16)
    return compare_layerwise(scalar_boundaries(), _samples(), reference_factory,
                             emulated(plan).factory, Precision.FP16, 1e-3, 1,
                             resident=resident, stats_threads=1)


def test_a_0d_array_is_bound_as_a_0d_input():
    model = scalar_boundaries()
    feeds = {"x": _samples()[0]["x"]}
    with OrtRunner(model, ["cpu"]) as runner:
        host = runner.run(feeds)["y"]
        bound = runner.run_resident(feeds)["y"]
    assert isinstance(bound, ort.OrtValue)
    np.testing.assert_array_equal(bound.numpy(), host)
    with OrtRunner(make_model(
            [helper.make_node("Unsqueeze", ["s", "axis0"], ["v"], name="unsqueeze")],
            [helper.make_tensor_value_info("s", TensorProto.INT64, [])],
            [helper.make_tensor_value_info("v", TensorProto.INT64, [1])],
            [helper.make_tensor("axis0", TensorProto.INT64, [1], [0])]), ["cpu"]) as runner:
        v = runner.run_resident({"s": np.array(7, np.int64)})["v"]
    assert tuple(v.shape()) == (1,) and v.numpy().tolist() == [7]


def test_scalars_across_segment_boundaries_give_the_host_paths_records():
    host, bound = _compare(False), _compare(True)
    assert bound.mode == host.mode == "segments" and bound.chunks == host.chunks == 8
    assert [r.tensor for r in bound.records] == [r.tensor for r in host.records]
    assert "top" in {r.tensor for r in bound.records}  # the float32 scalar is compared too
    for a, b in zip(host.records, bound.records):
        assert a.numel == b.numel and a.overflow == b.overflow, a.tensor
        for field in ("ref_max_abs", "cand_max_abs", "max_abs_err", "rel_l2"):
            assert math.isclose(getattr(a, field), getattr(b, field), rel_tol=1e-5,
                                abs_tol=1e-12), (a.tensor, field)
