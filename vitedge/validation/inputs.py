"""Feeding a runner: model-ready float batches, or uint8 frames for graphs with baked preprocessing."""

from __future__ import annotations

import numpy as np

from vitedge.onnxkit.metadata import UINT8_NHWC_RGB
from vitedge.bundle.spec import Preprocess


def to_uint8_frames(batch: np.ndarray, pre: Preprocess) -> np.ndarray:
    """Invert the normalisation of a float NCHW batch back to the uint8 NHWC frames it came from.

    Exact for batches made by vitedge.bundle.preprocess (the values were k/255 before normalising)."""
    mean = np.asarray(pre.mean, dtype=np.float64).reshape(1, -1, 1, 1)
    std = np.asarray(pre.std, dtype=np.float64).reshape(1, -1, 1, 1)
    u = np.rint((batch.astype(np.float64) * std + mean) * 255.0)
    return np.ascontiguousarray(np.clip(u, 0, 255).astype(np.uint8).transpose(0, 2, 3, 1))


def feed_for(runner, batch: np.ndarray, pre: Preprocess) -> np.ndarray:
    return to_uint8_frames(batch, pre) if runner.input_format == UINT8_NHWC_RGB else batch
