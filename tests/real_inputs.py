"""Real PP-OCRv4 inputs shared by the real-model tests (images from ../shared/data/ocr).

Fixed sizes keep the tests fast; the normalization is each model's own (PaddleOCR det:
ImageNet mean/std; rec/cls: (x/255 - 0.5) / 0.5).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
HALF = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
CASES = {
    "det": ("full_images/ch_en_num.jpg", (640, 640), IMAGENET),
    "rec": ("rec_crops/rapidocr/en_rec.jpg", (48, 320), HALF),
    "cls": ("rec_crops/rapidocr/text_cls.jpg", (48, 192), HALF),
}


def real_image(shared_dir: Path, name: str) -> np.ndarray:
    """The real input of model ``name`` as a float32 [1, 3, H, W] tensor."""
    rel, (h, w), norm = CASES[name]
    path = shared_dir / "data" / "ocr" / rel
    rgb = np.asarray(Image.open(path).convert("RGB").resize((w, h), Image.BILINEAR), np.float32)
    x = (rgb / 255.0 - np.array(norm[0], np.float32)) / np.array(norm[1], np.float32)
    return x.transpose(2, 0, 1)[None].astype(np.float32)
