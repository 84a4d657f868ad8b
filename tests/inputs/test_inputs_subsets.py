"""``inputs.subsets``: the seeded calibration/evaluation split, and samples loaded on access."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from precision_doctor.inputs import LazySamples, Sample, open_samples, pick, split_indices
from precision_doctor.runners.base import TensorMeta


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 3000), seed=st.integers(0, 2**32 - 1))
def test_the_split_is_deterministic_disjoint_and_covers_every_sample(n, seed):
    split = split_indices(n, seed)
    assert split == split_indices(n, seed)  # the same seed, the same split
    cal, ev = set(split.calibration), set(split.evaluation)
    assert split.disjoint and not cal & ev and cal | ev == set(range(n))
    assert len(ev) == n // 2 >= 1 and len(cal) >= len(ev)
    assert list(split.calibration) == sorted(cal) and list(split.evaluation) == sorted(ev)


def test_one_sample_calibrates_and_evaluates_and_says_it_is_not_disjoint():
    split = split_indices(1)
    assert split.calibration == split.evaluation == (0,) and not split.disjoint


def test_the_seed_changes_the_split():
    assert split_indices(100, 0) != split_indices(100, 1)


def test_lazy_samples_load_each_sample_when_it_is_read():
    loaded: list[int] = []

    def load(i: int) -> Sample:
        loaded.append(i)
        return Sample(f"s{i}", {"x": np.full((1,), i, np.float32)})

    lazy = LazySamples(6, load)
    part = pick(lazy, [4, 1])
    assert len(part) == 2 and loaded == []  # nothing read yet
    assert [s.name for s in part] == ["s4", "s1"] and loaded == [4, 1]
    assert part[1].name == "s1" and [s.name for s in lazy[::3]] == ["s0", "s3"]
    assert pick([1, 2, 3], [2]) == [3]


def test_an_image_folder_is_opened_lazily(tmp_path):
    for i in range(3):
        Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(tmp_path / f"im{i}.png")
    inputs = [TensorMeta("x", np.dtype(np.float32), (1, 3, 8, 8))]
    samples = open_samples(tmp_path, inputs, "size=8x8,scale=1/255,mean=0,std=1")
    assert isinstance(samples, LazySamples) and len(samples) == 3
    assert [s.name for s in samples] == ["im0.png", "im1.png", "im2.png"]
    assert np.allclose(samples[2].feeds["x"], 80 / 255)
    assert len(open_samples(tmp_path, inputs, "size=8x8", max_samples=2)) == 2
