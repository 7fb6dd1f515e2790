"""Activation statistics and clipping thresholds.

Statistics are collected deterministically: a first pass records each tensor's
max |x| (and, for SmoothQuant, the per-channel max |x|), a second pass fills
histograms of |x| over the fixed range [0, max|x|] found by the first. Everything is
symmetric: a threshold ``t`` becomes the INT8 scale ``t / 127`` with zero point 0.

Threshold methods (all on the |x| histogram):

* ``minmax``      t = max |x|
* ``percentile``  t = the p-th percentile of |x| (upper edge of the bin where it falls)
* ``entropy``     TensorRT's calibrator: the t whose 128-level quantised distribution
                  has the least KL divergence from the clipped reference distribution
* ``mse``         the t minimising the expected squared error: clipping error for values
                  above t, rounding error (x^2 below half a step, step^2/12 above) below
"""

from __future__ import annotations

import numpy as np

QMAX = 127  # symmetric INT8: [-127, 127] * scale covers [-t, t]
_TINY = 1e-12


def absmax(x: np.ndarray) -> float:
    return max(float(x.max()), -float(x.min())) if x.size else 0.0


def channel_absmax(x: np.ndarray) -> np.ndarray:
    """max |x| per channel (last axis), float64."""
    a = x.reshape(-1, x.shape[-1])
    if not a.shape[0]:
        return np.zeros(x.shape[-1])
    return np.maximum(a.max(axis=0), -a.min(axis=0)).astype(np.float64)


def histogram(x: np.ndarray, top: float, num_bins: int) -> np.ndarray:
    """Counts of |x| in ``num_bins`` equal bins over [0, top]; values above ``top`` land in
    the last bin. The bin index is computed in float32 (fast); the result is deterministic."""
    if top <= 0.0:
        out = np.zeros(num_bins, dtype=np.int64)
        out[0] = x.size
        return out
    a = np.abs(x.ravel(), dtype=np.float32)
    a *= np.float32(num_bins / top)
    idx = a.astype(np.intp)
    np.minimum(idx, num_bins - 1, out=idx)
    return np.bincount(idx, minlength=num_bins).astype(np.int64)


def threshold(method: str, amax: float, hist: np.ndarray | None, *, percentile: float = 99.99) -> float:
    """The clipping threshold for one tensor (always > 0)."""
    if amax <= 0.0:
        return _TINY
    if method == "auto":  # placeholder until the refinement pass chooses: entropy
        method = "entropy"
    if method == "minmax" or hist is None or hist.sum() == 0:
        return float(amax)
    width = amax / hist.size
    if method == "percentile":
        t = _percentile(hist, percentile) * width
    elif method == "entropy":
        t = _entropy(hist) * width
    elif method == "mse":
        t = _mse(hist, width)
    else:  # pragma: no cover - QuantConfig validates
        raise ValueError(method)
    return float(min(max(t, _TINY), amax))


# What method "auto" chooses from, per tensor (vitedge.quantize.refine picks one).
CANDIDATES = ("entropy", "p99.99", "p99.999", "minmax", "mse")


def candidate_thresholds(amax: float, hist: np.ndarray | None) -> dict[str, float]:
    """The threshold of every candidate in ``CANDIDATES`` for one tensor."""
    out = {}
    for c in CANDIDATES:
        if c.startswith("p"):
            out[c] = threshold("percentile", amax, hist, percentile=float(c[1:]))
        else:
            out[c] = threshold(c, amax, hist)
    return out


def _percentile(hist: np.ndarray, p: float) -> int:
    """Number of bins (from 0) holding at least p % of the values."""
    cdf = np.cumsum(hist, dtype=np.float64)
    k = int(np.searchsorted(cdf, cdf[-1] * (p / 100.0), side="left"))
    return min(k + 1, hist.size)


def _entropy(hist: np.ndarray, levels: int = QMAX + 1) -> int:
    """TensorRT's entropy calibration on a |x| histogram: returns the number of bins kept."""
    hist = hist.astype(np.float64)
    n = hist.size
    if n <= levels:
        return n
    total_tail = np.concatenate([np.cumsum(hist[::-1])[::-1], [0.0]])  # total_tail[i] = sum(hist[i:])
    best_i, best_kl = n, np.inf
    for i in range(levels, n + 1):
        ref = hist[:i].copy()
        ref[-1] += total_tail[i]  # outliers clipped into the last kept bin
        if ref.sum() == 0:
            continue
        # quantise hist[:i] into `levels` groups, then spread each group back over its
        # non-empty bins
        starts = (np.arange(levels) * i) // levels
        part = hist[:i]
        nonzero = (part != 0).astype(np.float64)
        sums = np.add.reduceat(part, starts)
        counts = np.add.reduceat(nonzero, starts)
        sizes = np.diff(np.append(starts, i))
        per_bin = np.repeat(np.divide(sums, counts, out=np.zeros_like(sums), where=counts > 0), sizes)
        q = per_bin * nonzero
        kl = _kl(ref, q)
        if kl < best_kl:
            best_kl, best_i = kl, i
    return best_i


def _kl(p: np.ndarray, q: np.ndarray, eps: float = 1e-10) -> float:
    """KL(p || q) of two (unnormalised) histograms; an empty q bin under a non-empty p bin
    costs as if q held ``eps`` there."""
    ps, qs = p.sum(), q.sum()
    if ps <= 0 or qs <= 0:
        return np.inf
    p = p / ps
    q = q / qs
    m = p > 0
    return float(np.sum(p[m] * np.log(p[m] / np.maximum(q[m], eps))))


def _mse(hist: np.ndarray, width: float) -> float:
    """Threshold (a bin edge) minimising the expected squared quantisation error."""
    h = hist.astype(np.float64)
    n = h.size
    centres = (np.arange(n) + 0.5) * width
    best_t, best_err = n * width, np.inf
    # candidate thresholds t_k = k * width, evaluated in blocks to bound memory
    for lo in range(1, n + 1, 256):
        ks = np.arange(lo, min(lo + 256, n + 1))
        t = ks[:, None] * width
        step = t / QMAX
        c = centres[None, :]
        rounding = np.where(c < step / 2, c * c, step * step / 12.0)
        err = np.where(c > t, (c - t) ** 2, rounding)
        total = err @ h
        k = int(np.argmin(total))
        if total[k] < best_err:
            best_err, best_t = float(total[k]), float(t[k, 0])
    return best_t
