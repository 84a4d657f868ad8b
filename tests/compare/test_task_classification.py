"""Top-1 / top-k agreement on hand-made scores."""

import numpy as np
import pytest

from precision_doctor.compare.tasks.classification import (
    top1_agreement,
    top5_agreement,
    topk_agreement_per_position,
)
from precision_doctor.errors import MetricError


def test_top1_counts_argmax_matches():
    ref = np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1], [0.2, 0.3, 0.5], [0.3, 0.3, 0.4]])
    cand = np.array([[0.2, 0.7, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8], [0.5, 0.2, 0.3]])
    # rows 0 and 2 agree, rows 1 and 3 do not -> 2/4
    assert top1_agreement({"p": ref}, {"p": cand}) == 0.5


def test_top1_class_axis_and_named_output():
    ref = np.zeros((1, 3, 2, 2))
    ref[0, 1] = 1.0  # class 1 everywhere (class axis 1, NCHW segmentation logits)
    cand = ref.copy()
    cand[0, 2, 0, 0] = 5.0  # one pixel flips to class 2
    outs_r = {"other": np.zeros(1), "seg": ref}
    outs_c = {"other": np.zeros(1), "seg": cand}
    assert top1_agreement(outs_r, outs_c, output="seg", axis=1) == 0.75


def test_topk_definition_reference_top1_in_candidate_topk():
    ref = np.array([[9.0, 1, 2, 3, 4, 5, 6]])  # reference top-1 is class 0
    cand_rank5 = np.array([[5.0, 9, 8, 7, 6, 1, 0]])  # class 0 is 5th best -> in top-5
    cand_rank6 = np.array([[4.0, 9, 8, 7, 6, 5, 0]])  # class 0 is 6th best -> out
    assert top5_agreement({"p": ref}, {"p": cand_rank5}) == 1.0
    assert top5_agreement({"p": ref}, {"p": cand_rank6}) == 0.0
    assert top5_agreement({"p": ref}, {"p": cand_rank6}, k=6) == 1.0


def test_topk_tie_counts_as_in_and_nan_never_agrees():
    ref = np.array([[1.0, 0, 0], [1.0, 0, 0]])
    cand = np.array([[1.0, 1.0, 0], [np.nan, 0, 0]])
    agree = topk_agreement_per_position(ref, cand, k=2)
    assert agree.tolist() == [True, False]
    # top-1 with a tie: numpy argmax picks the lowest index, class 0 -> agrees
    assert topk_agreement_per_position(ref, cand, k=1).tolist() == [True, False]


def test_errors_are_metric_errors():
    with pytest.raises(MetricError, match="k >= 1"):
        topk_agreement_per_position(np.ones((2, 3)), np.ones((2, 3)), k=0)
    with pytest.raises(MetricError, match="out of range"):
        topk_agreement_per_position(np.ones((2, 3)), np.ones((2, 3)), axis=4)
    with pytest.raises(MetricError, match="differs from candidate shape"):
        top1_agreement({"p": np.ones((2, 3))}, {"p": np.ones((2, 4))})
    with pytest.raises(MetricError, match="'q' is not a model output"):
        top1_agreement({"p": np.ones((2, 3))}, {"p": np.ones((2, 3))}, output="q")
