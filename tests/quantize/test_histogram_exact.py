"""The calibration pass's histograms and bias-correction means are pinned to the arithmetic they had
before their speed-ups (issue 28 item 3): the reference implementations below are the earlier code,
kept here verbatim, and the fast paths must give the same bits."""

from __future__ import annotations

import numpy as np
import pytest

from vitedge.quantize.histogram import COUNT_BLOCK_CHANNELS, MOMENT_CHUNK_CHANNELS, QMIN, ChannelHistogram
from vitedge.quantize.stats import MIN_SCALE, QMAX


def _round_integral_ref(z, cap):
    edge = cap + 0.5
    zc = np.minimum(z, edge)
    m = np.floor(zc + 0.5)
    inside = (m - 1.0) * m / 2.0 + m * (zc - m + 0.5)
    return inside + cap * np.maximum(z - edge, 0.0)


def _mean_fake_quant_ref(h: ChannelHistogram, threshold: float, scale=None) -> np.ndarray:
    """mean_fake_quant as it was before the blockwise / shared-levels version (steps below MIN_SCALE: MIN_SCALE)."""
    step = threshold / QMAX
    if not (np.isfinite(step) and step >= MIN_SCALE):
        step = MIN_SCALE
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


@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("channels", [1, 5, COUNT_BLOCK_CHANNELS + 61, 1536])
def test_every_value_is_counted_in_its_own_channels_bin(channels, signed):
    """One batch (no growth): each value lands in bin floor(|x| * bins / top_c) of its own channel (the
    float32 arithmetic of the pass), however many channels share one bincount. Before the channel blocks
    (issue 28 item 3), the unsigned per-channel path added each channel's offset to the scaled value in
    float32 before truncating it; with 1,536 channels x 256 bins the offsets reach 393,216, where float32
    steps by 1/32, and values within 1/32 of a bin edge went up one bin (8,430 of 1.15 million here; the
    last bin's went into the next channel)."""
    bins = 256 if channels > 1 else 4096
    rng = np.random.default_rng(channels)
    x = (rng.standard_normal((3, 100, channels)) * rng.gamma(1.0, 1.0, channels)).astype(np.float32)
    h = ChannelHistogram(channels, bins, signed=signed)
    h.add(x)
    x2 = x.reshape(-1, channels)
    scale = (bins / np.abs(x2).max(axis=0).astype(np.float64)).astype(np.float32)
    want = np.zeros((channels, 2, bins), dtype=np.int64)
    for c in range(channels):
        v = x2[:, c]
        j = np.minimum(np.floor(np.abs(v) * scale[c]), bins - 1).astype(np.int64)  # floor(y) of |x| ...
        if signed:  # ... and for negative x the pass floors x * scale itself: bin -floor(x * scale) - 1
            neg = v < 0
            j[neg] = np.minimum(-np.floor(v[neg] * scale[c]) - 1, bins - 1).astype(np.int64)
            np.add.at(want[c, 0], j[~neg], 1)
            np.add.at(want[c, 1], j[neg], 1)
        else:
            np.add.at(want[c, 0], j, 1)
    assert np.array_equal(h.counts.astype(np.int64), want if signed else want[:, :1, :])


@pytest.mark.parametrize("signed", [False, True])
def test_denormal_zero_and_huge_channels_count_and_threshold(signed):
    """Float32 denormals (~1e-41) made bins / top overflow to inf and bincount refuse negative indices (a crash of
    the build); zero and 1e30 channels sit beside them. Every value is counted, and every threshold is usable."""
    from vitedge.quantize.stats import MIN_THRESHOLD, safe_scale, threshold

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 4)).astype(np.float32)
    x[:, 0] = np.float32(1e-41) * np.sign(x[:, 0])
    x[:, 1] = 0.0
    x[:, 2] *= np.float32(1e30)
    h = ChannelHistogram(4, 256, signed=signed)
    with np.errstate(all="raise"):  # no overflow, no invalid value on the way
        h.add(x)
        h.add(x * np.float32(0.5))
    assert h.counts.sum(axis=(1, 2)).tolist() == [128] * 4
    assert np.all(np.isfinite(h.top)) and np.all(h._scale < np.inf)
    for c in range(4):
        whole = ChannelHistogram(1, 2048)
        whole.add(x[:, c])
        amax = float(np.abs(x[:, c]).max())
        for method in ("entropy", "percentile", "mse", "minmax"):
            t = threshold(method, amax, whole.histogram(amax, 256))
            assert np.isfinite(t) and t >= MIN_THRESHOLD, (c, method, t)
            assert safe_scale(t) >= np.float32(MIN_THRESHOLD / QMAX)
    if signed:
        assert np.all(np.isfinite(h.mean_fake_quant(1e-41)))
