"""The calibration pass's histograms and bias-correction means are pinned to the arithmetic they had
before their speed-ups (issue 28 item 3): the reference implementations below are the earlier code,
kept here verbatim, and the fast paths must give the same bits."""

from __future__ import annotations

import numpy as np
import pytest

from vitedge.quantize.histogram import MOMENT_CHUNK_CHANNELS, QMIN, ChannelHistogram
from vitedge.quantize.stats import QMAX


def _round_integral_ref(z, cap):
    edge = cap + 0.5
    zc = np.minimum(z, edge)
    m = np.floor(zc + 0.5)
    inside = (m - 1.0) * m / 2.0 + m * (zc - m + 0.5)
    return inside + cap * np.maximum(z - edge, 0.0)


def _mean_fake_quant_ref(h: ChannelHistogram, threshold: float, scale=None) -> np.ndarray:
    """mean_fake_quant as it was before the blockwise / shared-levels version."""
    step = threshold / QMAX
    if not (np.isfinite(step) and step > 0):
        step = 1e-8
    s = np.ones(h.channels) if scale is None else np.asarray(scale, dtype=np.float64).reshape(-1)
    width = h.top / h.bins / s
    lo = np.arange(h.bins, dtype=np.float64)[None, :] * width[:, None] / step
    hi = lo + (width / step)[:, None]
    error = np.zeros(h.channels, dtype=np.float64)
    counts = h.counts.astype(np.float64)
    for side, sign, cap in ((0, 1.0, QMAX), (1, -1.0, -QMIN)):
        n = counts[:, side, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            mean_level = np.where(hi > lo, (_round_integral_ref(hi, cap) - _round_integral_ref(lo, cap)) / (hi - lo),
                                  np.minimum(np.rint(lo), cap))
        error += sign * step * np.sum(n * (mean_level - (lo + hi) / 2.0), axis=1)
    return h.mean() / s + error / max(h.rows, 1)


def _signed_batches(channels: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(3):
        x = rng.standard_normal((50, channels)).astype(np.float32) * np.linspace(0.1, 4.0, channels, dtype=np.float32)
        x[:, 0] = 0.0  # a channel that is all zeros (top stays 0: bins without width)
        x[rng.random(x.shape) < 0.05] = 0.0
        x[:5, 1] = np.float32(2.0 * (k + 1))  # ties at bin edges after the grid grows
        out.append(x)
    return out


@pytest.mark.parametrize("channels", [3, MOMENT_CHUNK_CHANNELS + 37])
def test_mean_fake_quant_is_the_earlier_arithmetic(channels):
    h = ChannelHistogram(channels, 64, signed=True)
    for x in _signed_batches(channels, channels):
        h.add(x)
    scale = np.random.default_rng(1).uniform(0.25, 3.0, channels)
    # thresholds from far inside the values (many bins past 127.5 steps: both caps) to far outside
    for threshold in (0.01, 0.3, 1.0, float(h.absmax.max()), 50.0, 0.0):
        for s in (None, scale):
            got = h.mean_fake_quant(threshold, s)
            want = _mean_fake_quant_ref(h, threshold, s)
            assert got.tobytes() == want.tobytes(), (threshold, s is None)
    # and the case the shared levels are about: some bins of the negative side past 127.5 steps
    assert np.any(h.top / h.bins * h.bins / (0.01 / QMAX) > QMAX + 0.5)
