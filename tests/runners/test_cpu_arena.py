"""Sessions inside ``shared_cpu()`` share one CPU arena and give the same results."""

from __future__ import annotations

import numpy as np
from tiny_models import conv_bn, random_samples

from precision_doctor.runners.ort import OrtRunner
from precision_doctor.runners.sessions import cpu_arena


def test_shared_sessions_give_the_same_outputs_and_scopes_nest():
    model = conv_bn()
    feeds = random_samples((1, 3, 8, 8), 1)[0].feeds
    with OrtRunner(model) as runner:
        alone = runner.run(feeds)
    assert not cpu_arena.active()
    with cpu_arena.shared_cpu():
        with cpu_arena.shared_cpu():
            assert cpu_arena.active()
            with OrtRunner(model) as first, OrtRunner(model) as second:
                shared = [first.run(feeds), second.run(feeds)]
        assert cpu_arena.active()  # the outer scope is still open
    assert not cpu_arena.active()
    for out in shared:
        assert out.keys() == alone.keys()
        for name in alone:
            np.testing.assert_array_equal(out[name], alone[name])


def test_a_session_outlives_its_scope():
    model = conv_bn()
    feeds = random_samples((1, 3, 8, 8), 1)[0].feeds
    with cpu_arena.shared_cpu():
        runner = OrtRunner(model).__enter__()
    try:
        out = runner.run(feeds)  # the arena was shrunk, not freed: the session still runs
    finally:
        runner.__exit__()
    assert all(np.isfinite(v).all() for v in out.values())
