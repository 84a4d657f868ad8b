"""The log-spectral distance after DTW: audio of different lengths compared as heard."""

from __future__ import annotations

import numpy as np
import pytest

from precision_doctor.compare.tasks.audio import dtw_cost, is_signal, lsd, lsd_dtw
from precision_doctor.compare.tasks.registry import get_metric
from precision_doctor.errors import MetricError


def tone(seconds: float, rate: int = 22050, seed: int = 0) -> np.ndarray:
    """A chirp with a little noise: a signal whose spectrum changes over time."""
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(seed)
    return (np.sin(2 * np.pi * (200 + 400 * t) * t) + 0.01 * rng.normal(size=t.size)
            ).astype(np.float32)


def test_identical_audio_scores_zero_and_a_stretched_copy_scores_little() -> None:
    x = tone(1.0)
    assert lsd_dtw(x, x) == pytest.approx(0.0, abs=1e-5)  # the Gram expansion rounds
    longer = np.concatenate([x[:11025], x[11025 - 256:]])  # one 256-sample frame repeated
    near = lsd_dtw(x, longer)
    other = lsd_dtw(x, tone(1.0, seed=1)[::-1].copy())
    assert 0 <= near < 1.0 < other
    assert lsd({"audio": x[None, None]}, {"audio": longer[None, None]}) == pytest.approx(near)


def test_dtw_takes_the_cheapest_monotone_path() -> None:
    cost = np.array([[0.0, 5.0, 5.0], [5.0, 0.0, 0.0], [5.0, 5.0, 0.0]])
    assert dtw_cost(cost) == 0.0
    brute = np.array([[1.0, 2.0], [3.0, 1.0]])
    assert dtw_cost(brute) == 2.0  # the diagonal: 1 + 1


def test_bad_audio_is_a_clear_error_and_nan_scores_inf() -> None:
    x = tone(0.2)
    assert lsd({"a": x}, {"a": np.full_like(x, np.nan)}) == float("inf")
    with pytest.raises(MetricError, match="one signal"):
        lsd_dtw(np.zeros((2, 4096)), x)
    assert is_signal((1, 1, 36864)) and not is_signal((1, 80, 300))


def test_lsd_is_a_built_in_metric_where_lower_is_better() -> None:
    metric = get_metric("lsd:output=audio")
    assert not metric.higher_is_better and metric.default_threshold == 1.0
