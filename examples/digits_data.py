"""scikit-learn's bundled 8x8 digits as 64x64 RGB images, with a fixed split.

Used by the bundled example training scripts (``train_digits_vit.py``,
``train_postnorm_vit.py``); needs only numpy, Pillow and scikit-learn, so it can be
imported by path from anywhere::

    sys.path.insert(0, "examples"); import digits_data

The split is stratified and deterministic (fixed seed): 397 validation images, 200
calibration images and the remaining 1200 for training. Each image keeps its sklearn
sample index, which is what the PNG file names under ``calibration/digits/`` use.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

SEED = 20240607
NUM_VAL = 397
NUM_CALIB = 200
IMAGE_SIZE = 64
CLASS_NAMES = [str(d) for d in range(10)]


@dataclass(frozen=True)
class Split:
    """Sample indices (into sklearn's ``load_digits()``) for each part of the split."""

    train: np.ndarray
    calib: np.ndarray
    val: np.ndarray


def digit_to_image(pixels_8x8: np.ndarray, size: int = IMAGE_SIZE) -> Image.Image:
    """One 8x8 digit (values 0..16) -> a ``size`` x ``size`` RGB uint8 Pillow image."""
    arr = np.asarray(pixels_8x8, dtype=np.float64).reshape(8, 8)
    gray = np.clip(np.round(arr * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    img = Image.fromarray(gray, mode="L").resize((size, size), Image.Resampling.BILINEAR)
    return img.convert("RGB")  # gray replicated on the three channels


def load_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The raw digits: (N, 8, 8) float64 pixels in 0..16 and (N,) int labels."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images, d.target.astype(np.int64)


def make_split(labels: np.ndarray, seed: int = SEED) -> Split:
    """Stratified, deterministic: 397 val, 200 calib, the rest (1200) train."""
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(labels))
    rest, val = train_test_split(idx, test_size=NUM_VAL, stratify=labels, random_state=seed)
    train, calib = train_test_split(rest, test_size=NUM_CALIB, stratify=labels[rest], random_state=seed + 1)
    return Split(train=np.sort(train), calib=np.sort(calib), val=np.sort(val))


def load(seed: int = SEED) -> tuple[list[Image.Image], np.ndarray, Split]:
    """All 1797 digits as 64x64 RGB images, their labels, and the split."""
    pixels, labels = load_arrays()
    images = [digit_to_image(p) for p in pixels]
    return images, labels, make_split(labels, seed)


if __name__ == "__main__":
    imgs, y, split = load()
    for name in ("train", "calib", "val"):
        part = getattr(split, name)
        print(name, len(part), np.bincount(y[part], minlength=10).tolist())
    print(imgs[0].mode, imgs[0].size)
