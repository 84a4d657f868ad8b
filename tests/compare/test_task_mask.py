"""Binary-mask IoU."""

import numpy as np

from precision_doctor.compare.tasks.image import mask_iou, mask_iou_per_sample


def test_iou_hand_computed_at_threshold():
    ref = np.zeros((1, 1, 4, 4), np.float32)
    ref[0, 0, :2, :2] = 0.9  # 4 pixels
    cand = np.zeros_like(ref)
    cand[0, 0, :2, :3] = 0.4  # 6 pixels above 0.3, none above 0.5
    # threshold 0.3: |A&B| = 4, |A|B| = 6 -> 2/3 ; threshold 0.5: |A&B| = 0, |A|B| = 4 -> 0
    assert np.isclose(mask_iou({"m": ref}, {"m": cand}, threshold=0.3), 4 / 6)
    assert mask_iou({"m": ref}, {"m": cand}) == 0.0


def test_threshold_is_strict_and_empty_masks_are_identical():
    ref = np.full((2, 1, 2, 2), 0.3, np.float32)  # == threshold -> background (pred > thresh)
    assert mask_iou_per_sample(ref, ref.copy(), threshold=0.3).tolist() == [1.0, 1.0]


def test_mean_over_samples_and_nan_counts_as_wrong():
    ref = np.zeros((2, 1, 2, 2))
    ref[:, 0, 0, :] = 1.0  # 2 pixels per sample
    cand = ref.copy()
    cand[1, 0, 1, 1] = np.nan  # background pixel turned NaN -> read as foreground
    per = mask_iou_per_sample(ref, cand)
    assert per.tolist() == [1.0, 2 / 3]
    assert np.isclose(mask_iou({"m": ref}, {"m": cand}), (1 + 2 / 3) / 2)
