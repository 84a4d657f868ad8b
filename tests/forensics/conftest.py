"""Fixtures for the forensics tests: a seeded synthetic natural-looking image (no shared data)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image


def make_natural_image(height: int = 150, width: int = 420, seed: int = 0) -> Image.Image:
    """Smooth colour gradients, coloured rectangles and disks (edges), dark strokes and noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    y, x = y / height, x / width
    img = np.stack([0.3 + 0.5 * x, 0.2 + 0.6 * y, 0.7 - 0.4 * x * y], axis=-1)
    for _ in range(12):
        top, left = rng.integers(0, height - 10), rng.integers(0, width - 10)
        img[top:top + rng.integers(8, 60), left:left + rng.integers(8, 90)] = rng.uniform(0, 1, 3)
    for _ in range(8):
        cy, cx, r = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.03, 0.15)
        inside = (y - cy) ** 2 + ((x - cx) * width / height) ** 2 < r ** 2
        img[inside] = rng.uniform(0, 1, 3)
    for _ in range(25):  # text-like dark strokes, 2-3 px wide
        row, col = rng.integers(0, height - 20), rng.integers(0, width - 20)
        if rng.uniform() < 0.5:
            img[row:row + rng.integers(6, 20), col:col + rng.integers(2, 4)] = 0.05
        else:
            img[row:row + rng.integers(2, 4), col:col + rng.integers(6, 20)] = 0.05
    img += rng.normal(0.0, 0.02, img.shape)
    return Image.fromarray((np.clip(img, 0, 1) * 255).round().astype(np.uint8))


@pytest.fixture
def natural_image() -> Image.Image:
    return make_natural_image()


@pytest.fixture
def small_image() -> Image.Image:
    """24x60: PP-OCR rec preprocessing upscales it 2x (nearest then copies rows/columns)."""
    return make_natural_image(24, 60, seed=1)
