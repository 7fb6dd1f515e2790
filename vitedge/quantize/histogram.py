"""Streaming histograms of activations whose range is not known in advance.

Calibration makes one pass over the data, so the range of a histogram cannot come from an
earlier pass. ``ChannelHistogram`` keeps, per channel (the last axis; one channel for a
whole tensor), counts of ``|x|`` in ``bins`` equal bins over ``[0, top]``, where ``top``
starts at the first non-zero batch's max ``|x|`` (never below ``MIN_TOP``: a float32 denormal
top, ~1e-41, made ``bins / top`` overflow to inf) and doubles whenever a later batch goes
past it: the counts of bin pairs are then added (exact: a bin of the doubled grid is the
union of two bins of the old one). Memory is fixed by ``channels x bins``, whatever the
number of images. With ``signed`` the counts of negative values are kept apart (what the
bias correction's ``E[Q(x)]`` needs).

From the counts, after the pass:

* ``histogram(top, num_bins, scale)``: the histogram of ``|x_c| / scale_c`` over all
  channels on a new grid of ``num_bins`` bins over ``[0, top]`` (SmoothQuant's scales are
  only known once the pass is over), each old bin spread evenly over the new bins it
  overlaps; values past ``top`` land in the last bin. When the max of a one-channel
  histogram was in the first batch and ``bins`` is a multiple of ``num_bins``, this is
  exactly the histogram a second pass over ``[0, max]`` would count.
* ``mean_fake_quant(threshold, scale)``: per channel, the mean of ``Q(x_c / scale_c)``,
  ``Q`` the symmetric INT8 Q/DQ of that threshold, with the values spread evenly inside
  each bin.
"""

from __future__ import annotations

import numpy as np

from vitedge.quantize.stats import MIN_SCALE, QMAX

QMIN = -128  # what QuantizeLinear saturates to below
# Channels per block in mean_fake_quant (128 x 256 bins x 8 bytes: 256 KB per temporary).
MOMENT_CHUNK_CHANNELS = 128
# Channels counted per bincount: 128 x 512 bins of int64 (512 KB) stay in a core's L2 while the block's values are
# scattered into them; all 1,536 of ViT-S/16's fc2 input at once (6 MB) did not, and took 1.4-1.8x as long (AVX2 EPYC,
# 1 MB L2 per core). The counts are integers: the same whatever the blocking.
COUNT_BLOCK_CHANNELS = 128
# ... and rows per bincount: about this many values (1 MB of float32), so that each pass over a block's values
# (scale, floor, clip, to integers) finds them still in the cache (one-channel histograms of 2.4 M values: ~25 %
# faster in 256 K pieces than in one). Counts are integers: the same whatever the pieces.
COUNT_CHUNK_VALUES = 1 << 18
# The smallest top of a grid: ``bins / top`` (float32) and every ``|x| * bins / top`` stay finite for any bins we use.
# Far below stats.MIN_THRESHOLD, the clipping threshold of a tensor that small, so no threshold reads a grid this fine.
MIN_TOP = 2.0 ** -100


class ChannelHistogram:
    def __init__(self, channels: int, bins: int, *, signed: bool = False):
        if bins < 2 or bins & (bins - 1):
            raise ValueError(f"bins must be a power of two >= 2, got {bins}")
        self.channels = int(channels)
        self.bins = int(bins)
        self.signed = signed
        self.sides = 2 if signed else 1
        self.counts = np.zeros((self.channels, self.sides, self.bins), dtype=np.int64 if channels == 1 else np.int32)
        self.top = np.zeros(self.channels, dtype=np.float64)  # 0: no non-zero value seen yet (every count in bin 0)
        self.absmax = np.zeros(self.channels, dtype=np.float64)
        self.sums = np.zeros(self.channels, dtype=np.float64)  # sum of x (signed histograms only)
        self.rows = 0
        self._scale = np.zeros(self.channels, dtype=np.float32)  # bins / top, 0 while top is 0
        # each channel's first index in its block's bincount (float32: exact below 2^24)
        first = np.arange(min(self.channels, COUNT_BLOCK_CHANNELS), dtype=np.float64) * (self.sides * self.bins) + (self.bins if signed else 0)
        if first.size and first[-1] + self.bins >= 2**24:
            raise ValueError(f"{first.size} channels x {bins} bins is too many for one bincount")
        self._block_offset = first.astype(np.float32)[None, :]
        self._counts_f64: np.ndarray | None = None  # the counts as float64, for the readers (reset by add)

    # ------------------------------------------------------------------ collecting
    def add(self, x: np.ndarray) -> float:
        """Count a batch (any shape whose last axis is the channels; one channel: any shape).
        Returns the batch's max |x| (not finite when the batch holds inf / NaN; nothing is
        counted then)."""
        self._counts_f64 = None
        x = np.asarray(x, dtype=np.float32)
        x2 = x.reshape(-1, self.channels)
        if not x2.shape[0]:
            return 0.0
        cmax = np.maximum(x2.max(axis=0), -x2.min(axis=0)).astype(np.float64)
        peak = float(cmax.max())
        if not np.isfinite(peak):
            return peak
        self._grow(cmax)
        np.maximum(self.absmax, cmax, out=self.absmax)
        self.rows += x2.shape[0]
        if self.signed:
            self.sums += x2.sum(axis=0, dtype=np.float64)
        for c0 in range(0, self.channels, COUNT_BLOCK_CHANNELS):
            c1 = min(c0 + COUNT_BLOCK_CHANNELS, self.channels)
            rows = max(1, COUNT_CHUNK_VALUES // (c1 - c0))
            for r0 in range(0, x2.shape[0], rows):
                self._count(x2[r0:r0 + rows], c0, c1)
        return peak

    def _count(self, x2: np.ndarray, c0: int, c1: int) -> None:
        """Count channels [c0, c1) of the rows ``x2`` ([rows, channels]); one bincount."""
        b = self.bins
        offset = self._block_offset[:, : c1 - c0]
        if self.signed:
            # floor(x * bins / top) in [-bins, bins): bin j of |x| is index bins + j for
            # x >= 0 and bins - 1 - j for x < 0 (the offsets are exact in float32)
            y = x2[:, c0:c1] * self._scale[None, c0:c1]
            np.floor(y, out=y)
            np.clip(y, -b, b - 1, out=y)
            y += offset
            counts = np.bincount(y.astype(np.intp).ravel(), minlength=(c1 - c0) * 2 * b).reshape(c1 - c0, 2 * b)
            del y
            self.counts[c0:c1, 0] += counts[:, b:].astype(self.counts.dtype, copy=False)
            self.counts[c0:c1, 1] += counts[:, b - 1::-1].astype(self.counts.dtype, copy=False)
            return
        a = np.abs(x2[:, c0:c1])
        a *= self._scale[None, c0:c1]
        np.minimum(a, np.float32(b - 1), out=a)
        if self.channels > 1:  # whole bins before the offset: a float32 sum of the two would round near bin edges
            np.floor(a, out=a)
            a += offset
        counts = np.bincount(a.astype(np.intp).ravel(), minlength=(c1 - c0) * b)
        self.counts[c0:c1] += counts.reshape(c1 - c0, 1, b).astype(self.counts.dtype, copy=False)

    def _grow(self, cmax: np.ndarray) -> None:
        start = (self.top == 0) & (cmax > 0)
        if start.any():  # the counts so far are all zeros, in bin 0 of any grid
            self.top[start] = np.maximum(cmax[start], MIN_TOP)
        over = (self.top > 0) & (cmax > self.top)
        if over.any():
            k = np.ceil(np.log2(cmax[over] / self.top[over])).astype(np.int64)
            k += self.top[over] * np.exp2(k) < cmax[over]  # log2 rounding
            k = np.maximum(k, 1)
            rows = np.flatnonzero(over)
            for step in np.unique(k):
                sel = rows[k == step]
                self.counts[sel] = _merge(self.counts[sel], int(step))
                self.top[sel] *= 2.0 ** int(step)
        with np.errstate(divide="ignore"):
            self._scale = np.where(self.top > 0, self.bins / self.top, 0.0).astype(np.float32)

    # ------------------------------------------------------------------ reading
    def histogram(self, top: float, num_bins: int, scale: np.ndarray | None = None) -> np.ndarray:
        """Counts (float64) of ``|x_c| / scale_c`` over all channels in ``num_bins`` equal bins
        over ``[0, top]``; values at or past ``top`` land in the last bin."""
        h = self.counts.sum(axis=1, dtype=np.float64)  # [C, bins] of |x|
        total = float(h.sum())
        out = np.zeros(num_bins, dtype=np.float64)
        if top <= 0.0:
            out[0] = total
            return out
        s = np.ones(self.channels) if scale is None else np.asarray(scale, dtype=np.float64).reshape(-1)
        cum = np.concatenate([np.zeros((self.channels, 1)), np.cumsum(h, axis=1)], axis=1)
        width = self.top / self.bins
        edges = np.arange(num_bins + 1, dtype=np.float64) * (top / num_bins)
        with np.errstate(divide="ignore", invalid="ignore"):
            pos = np.where(width[:, None] > 0, edges[None, :] * (s / np.where(width > 0, width, 1.0))[:, None], np.inf)
        pos[:, 0] = 0.0
        np.minimum(pos, self.bins, out=pos)
        near = np.rint(pos)
        snap = np.abs(pos - near) <= 1e-9 * np.maximum(near, 1.0)  # grids that line up: no float rounding across a bin edge
        pos[snap] = near[snap]
        i = np.minimum(pos.astype(np.intp), self.bins - 1)
        frac = pos - i
        below = np.take_along_axis(cum, i, axis=1) + frac * np.take_along_axis(h, i, axis=1)  # count of |x/s| < edge
        cdf = below.sum(axis=0)
        cdf[-1] = total
        return np.diff(cdf)

    def mean(self) -> np.ndarray:
        """Mean of x per channel (signed histograms only)."""
        return self.sums / max(self.rows, 1)

    def mean_fake_quant(self, threshold: float, scale: np.ndarray | None = None) -> np.ndarray:
        """Per channel, the mean of ``Q(x_c / scale_c)`` with ``Q`` the INT8 Q/DQ of
        ``threshold`` (step ``threshold / 127``, levels -128..127) (signed histograms only).

        The exact mean of x / s plus the mean quantisation error ``Q(y) - y``, the error
        integrated over each bin with its values spread evenly: a bin many steps wide then
        contributes its clipping error and about no rounding error, whatever the shape of
        the values inside it (the mean of x itself never comes from bin centres)."""
        if not self.signed:
            raise ValueError("mean_fake_quant needs a signed histogram")
        step = threshold / QMAX
        if not (np.isfinite(step) and step >= MIN_SCALE):  # the scale the Q/DQ pair gets (stats.safe_scale)
            step = MIN_SCALE
        s = np.ones(self.channels) if scale is None else np.asarray(scale, dtype=np.float64).reshape(-1)
        width = self.top / self.bins / s  # a bin's width in units of x / s
        if self._counts_f64 is None:  # method select reads every candidate's means from the same counts
            self._counts_f64 = self.counts.astype(np.float64)
        j = np.arange(self.bins, dtype=np.float64)[None, :]
        error = np.zeros(self.channels, dtype=np.float64)
        # a few channels at a time: the (channels x bins) temporaries stay in the CPU's cache (ViT-S/16's
        # 1,536 channels x 256 bins: 3 MB each, ~20 of them). Element by element and row by row the same
        # arithmetic as all channels at once, so the same bits.
        for c0 in range(0, self.channels, MOMENT_CHUNK_CHANNELS):
            c1 = min(c0 + MOMENT_CHUNK_CHANNELS, self.channels)
            w = width[c0:c1]
            lo = j * w[:, None] / step  # bin edges in steps
            hi = lo + (w / step)[:, None]
            error[c0:c1] = _quant_error(self._counts_f64[c0:c1], lo, hi, step)
        return self.mean() / s + error / max(self.rows, 1)


def _quant_error(counts: np.ndarray, lo: np.ndarray, hi: np.ndarray, step: float) -> np.ndarray:
    """Per row of ``counts`` ([rows, 2 sides, bins]), the summed error ``Q(y) - y`` of its values, spread
    evenly over the bins ``[lo, hi)`` (in steps): the positive side (levels up to 127), then the negative
    one (up to 128). Both sides' mean levels are the same number in every bin below 127.5 steps (neither
    cap is reached there): the negative side's are computed again only where they can differ."""
    with np.errstate(divide="ignore", invalid="ignore"):
        mid = (lo + hi) / 2.0
        d = _mean_level(lo, hi, QMAX) - mid
        error = np.zeros(counts.shape[0], dtype=np.float64)  # (0 + x, as before: the same signed zeros)
        error += 1.0 * step * np.sum(counts[:, 0, :] * d, axis=1)
        past = hi >= QMAX + 0.5
        if past.any():
            d[past] = _mean_level(lo[past], hi[past], -QMIN) - mid[past]
        error += -1.0 * step * np.sum(counts[:, 1, :] * d, axis=1)
    return error


def _mean_level(lo: np.ndarray, hi: np.ndarray, cap: int) -> np.ndarray:
    """The mean of min(round(t), cap) over [lo, hi) (round(lo) where the bin has no width)."""
    return np.where(hi > lo, (_round_integral(hi, cap) - _round_integral(lo, cap)) / (hi - lo), np.minimum(np.rint(lo), cap))


def _round_integral(z: np.ndarray, cap: int) -> np.ndarray:
    """The integral from 0 to z (>= 0) of min(round(t), cap) dt."""
    edge = cap + 0.5  # round(t) reaches cap here
    zc = np.minimum(z, edge)
    m = np.floor(zc + 0.5)
    inside = (m - 1.0) * m / 2.0 + m * (zc - m + 0.5)
    return inside + cap * np.maximum(z - edge, 0.0)


def _merge(counts: np.ndarray, k: int) -> np.ndarray:
    """Bins of width 2^k times the old: bin j of the new grid holds old bins [j 2^k, (j+1) 2^k)."""
    rows, sides, bins = counts.shape
    out = np.zeros_like(counts)
    if k >= bins.bit_length() - 1:
        out[..., 0] = counts.sum(axis=-1)
        return out
    merged = counts.reshape(rows, sides, bins >> k, 1 << k).sum(axis=-1)
    out[..., : bins >> k] = merged
    return out
