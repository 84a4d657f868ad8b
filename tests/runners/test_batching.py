"""Batched runs on a GPU (``runners.batching``): per-sample outputs, shape grouping and order,
the one-sample check, the search's evaluations and layerwise batches (tested on the CPU, with
the GPU's control flow: CI has no GPU)."""

from types import SimpleNamespace

import numpy as np
import pytest
from tiny_models import random_samples, relu_batch, transformer_block

from precision_doctor.formats import Precision
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners import batching
from precision_doctor.runners import device as dev
from precision_doctor.runners.base import TensorMeta
from precision_doctor.runners.fake import FakeRunner
from precision_doctor.runners.ort import OrtRunner
from precision_doctor.search.evalpool import SampleRunner


def test_batched_runs_give_the_per_sample_outputs():
    from precision_doctor.runners.batching import batch_symbol, groups, run_batched

    model = transformer_block()
    assert batch_symbol(model) == "batch"
    samples = random_samples((2, 8, 16), 5)
    feeds = [s.feeds for s in samples]
    feeds.insert(2, {"x": np.ones((1, 8, 16), np.float32)})  # batch dim 1: still groups
    assert groups(feeds) == [[0, 1, 2, 3, 4, 5]]
    assert groups(feeds, max_batch=4) == [[0, 1, 2, 3], [4, 5]]
    with OrtRunner(model, ("cpu",)) as r:
        one = [r.run(f) for f in feeds]
        many = run_batched(r, feeds)
    for a, b in zip(one, many):
        for k in a:
            assert a[k].shape == b[k].shape
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_search_evaluations_on_a_gpu_run_in_batches_and_stop_early():
    """SampleRunner on a CUDA device batches the evaluation's samples (iter_batched); the
    outputs are the per-sample ones, in the search's order, and a consumer that stops after
    the first sample leaves the later batches unrun. The one-sample check of the first batch
    runs once per model, not once per evaluation."""
    model = transformer_block()
    samples = random_samples((2, 8, 16), 6)
    calls = []

    class Counting(OrtRunner):
        def run(self, feeds, output_names=None):
            calls.append(int(next(iter(feeds.values())).shape[0]))
            return super().run(feeds, output_names)

    def open_plan(plan, threads=0):  # pinned to the CPU: this machine has no GPU
        runner = Counting(model, ("cpu",))
        return runner

    names = [o.name for o in model.graph.output]
    order = [5, 0, 3, 1, 4, 2]
    with OrtRunner(model, ("cpu",)) as r:
        alone = {i: r.run(samples[i].feeds) for i in order}
    plan = PrecisionPlan(Precision.FP16)
    with SampleRunner(open_plan, samples, names, device=dev.Device("cuda")) as pool:
        got = list(pool.run(plan, order))
        assert [i for i, _ in got] == order
        for i, out in got:
            for k in names:
                np.testing.assert_allclose(out[k], alone[i][k], rtol=1e-5, atol=1e-6)
        assert calls[0] == 12  # one batch of 6 samples (2 rows each), then the probe
        calls.clear()
        first = pool.run(plan, order)
        next(first)
        first.close()
        assert calls == [12]  # the batch (the model's check is kept); nothing after
        assert batching.checked(model) is True


def test_a_gpu_evaluation_runs_each_shape_at_once_from_its_first_sample():
    """The search's order alternates two input shapes; on a GPU an evaluation runs the first
    sample's shape first (all its samples, in their order), then the other: one run per
    shape, not one per change of shape. Stopping after the first sample runs one batch."""
    from precision_doctor.runners.batching import shapes_together

    model = relu_batch()
    samples = [SimpleNamespace(feeds={"x": np.full((1, 8 if i % 2 else 4), i, np.float32)})
               for i in range(6)]  # 4 wide, 8 wide, 4, 8, ...
    order = [3, 0, 5, 2, 1, 4]
    assert shapes_together([s.feeds for s in samples], order) == [3, 5, 1, 0, 2, 4]
    shapes = []

    class Counting(OrtRunner):
        def run(self, feeds, output_names=None):
            shapes.append(next(iter(feeds.values())).shape)
            return super().run(feeds, output_names)

    plan = PrecisionPlan(Precision.FP16)
    with SampleRunner(lambda p, threads=0: Counting(model, ("cpu",)), samples, ["y"],
                      device=dev.Device("cuda")) as pool:
        got = list(pool.run(plan, order))
        assert [i for i, _ in got] == [3, 5, 1, 0, 2, 4]
        for i, out in got:
            np.testing.assert_array_equal(out["y"], samples[i].feeds["x"])
        assert shapes == [(3, 8), (1, 8), (3, 4)]  # the first batch's one-sample check once
        shapes.clear()
        first = pool.run(plan, order)
        assert next(first)[0] == 3
        first.close()
        assert shapes == [(3, 8)]


def test_batching_refuses_models_without_a_shared_batch_symbol():
    from precision_doctor.runners.batching import batch_symbol, run_batched

    model = transformer_block()
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "other"
    assert batch_symbol(model) == "batch"  # exporters name the dims apart: checked at run time
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 2
    assert batch_symbol(model) is None

    class Summing(FakeRunner):  # reduces over the batch: not per sample along axis 0
        pass

    runner = Summing([TensorMeta("x", np.dtype(np.float32), (1, 4))], ["y"],
                     lambda f: {"y": f["x"].sum(axis=0)})
    feeds = [{"x": np.full((1, 4), i, np.float32)} for i in range(3)]
    out = run_batched(runner, feeds)
    assert [float(o["y"][0]) for o in out] == [0.0, 1.0, 2.0]  # redone one at a time


def test_layerwise_on_a_gpu_folds_batches_as_its_samples():
    from precision_doctor.layerwise.compare import batched_samples, compare_layerwise
    from precision_doctor.precision.emulate import emulate

    model = transformer_block(hot_value=10.0)
    feeds = [dict(s.feeds) for s in random_samples((2, 8, 16), 6)]

    def ref(m):
        return OrtRunner(m, ("cpu",))

    def cand(m):  # the emulation graph, pinned to the CPU (this machine has no GPU)
        return OrtRunner(emulate(m, PrecisionPlan(Precision.FP16))[0], ("cpu",))

    plain = compare_layerwise(model, feeds, ref, cand, Precision.FP16, 1e-2)
    with dev.use(dev.Device("cuda")):
        assert len(batched_samples(model, feeds, [], 256 << 20)) == 1
        batched = compare_layerwise(model, feeds, ref, cand, Precision.FP16, 1e-2)
    assert batched.mode == "segments"
    for a, b in zip(plain.records, batched.records):
        assert (a.tensor, a.numel, a.overflow) == (b.tensor, b.numel, b.overflow)
        assert b.rel_l2 == pytest.approx(a.rel_l2, rel=1e-4)
        assert b.ref_max_abs == pytest.approx(a.ref_max_abs, rel=1e-6)


def test_layerwise_batches_are_capped_per_input_shape():
    """A wider sample holds more activations: its batches are smaller, whatever the shape of
    the first sample (which sizes ``sites``)."""
    from precision_doctor.graph.outputs import float_activations
    from precision_doctor.layerwise.compare import batched_samples

    model = relu_batch()
    narrow = [{"x": np.full((1, 8), i, np.float32)} for i in range(4)]
    wide = [{"x": np.full((1, 32), i, np.float32)} for i in range(4)]
    feeds = narrow + wide
    sites = float_activations(model, {"x": (1, 8)})
    # 512 bytes: narrow samples (2 runners x 32 bytes) fit 8 at once, wide ones (2 x 128) 2
    batches = batched_samples(model, feeds, sites, 512)
    assert [b["x"].shape for b in batches] == [(4, 8), (2, 32), (2, 32)]
    np.testing.assert_array_equal(np.concatenate([b["x"][:, 0] for b in batches]),
                                  [0, 1, 2, 3, 0, 1, 2, 3])
    # no shape fits twice: every sample alone, the list as given
    assert batched_samples(model, feeds, sites, 100) is feeds


def test_a_batch_whose_first_sample_disagrees_runs_one_at_a_time():
    from precision_doctor.runners.batching import run_batched

    # axis 0 keeps its length but is not the sample axis (the batch comes out reversed)
    runner = FakeRunner([TensorMeta("x", np.dtype(np.float32), (1, 4))], ["y"],
                        lambda f: {"y": np.flip(f["x"], axis=0)})
    feeds = [{"x": np.full((1, 4), i + 1.0, np.float32)} for i in range(4)]
    out = run_batched(runner, feeds)
    assert [float(o["y"][0, 0]) for o in out] == [1.0, 2.0, 3.0, 4.0]


def test_batched_runs_group_alternating_shapes_and_keep_the_order():
    from precision_doctor.runners.batching import run_batched, shape_order

    model = relu_batch()
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.standard_normal((1, 8 if i % 2 == 0 else 4)).astype(np.float32)}
             for i in range(6)]  # wide, narrow, wide, ...
    assert shape_order(feeds) == [0, 2, 4, 1, 3, 5]  # each signature together, largest first
    calls = []

    class Counting(OrtRunner):
        def run(self, feeds, output_names=None):
            calls.append(tuple(next(iter(feeds.values())).shape))
            return super().run(feeds, output_names)

    with Counting(model, ("cpu",)) as r:
        batched = run_batched(r, feeds)
    # one run per signature (+ the one-sample probe of the first batch), not six
    assert calls == [(3, 8), (1, 8), (3, 4)]
    for feed, out in zip(feeds, batched):
        np.testing.assert_array_equal(out["y"], np.maximum(feed["x"], 0))


def test_a_failed_batch_check_is_kept_for_the_model():
    from precision_doctor.runners.batching import checked, run_batched

    calls = []

    def reversed_rows(f):  # axis 0 keeps its length but is not the sample axis
        calls.append(f["x"].shape[0])
        return {"y": np.flip(f["x"], axis=0)}

    runner = FakeRunner([TensorMeta("x", np.dtype(np.float32), (1, 4))], ["y"], reversed_rows)
    runner.model = object()  # what the verdict is kept for (a runner's .model)
    feeds = [{"x": np.full((1, 4), i + 1.0, np.float32)} for i in range(3)]
    assert [float(o["y"][0, 0]) for o in run_batched(runner, feeds)] == [1.0, 2.0, 3.0]
    assert calls == [3, 1, 1, 1, 1] and checked(runner.model) is False
    calls.clear()
    assert [float(o["y"][0, 0]) for o in run_batched(runner, feeds)] == [1.0, 2.0, 3.0]
    assert calls == [1, 1, 1]  # no batch tried again
