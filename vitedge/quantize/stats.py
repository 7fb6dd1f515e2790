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
# The smallest clipping threshold, and so the smallest scale (MIN_SCALE ~ 7.9e-15) any Q/DQ pair gets. A tensor whose
# every |x| is below it (all zeros, float32 denormals ~1e-41) quantises to zero. A scale of 0 or a denormal one is
# invalid in QuantizeLinear (x / scale is inf or NaN); this one is a normal float32 whose inverse is finite too.
MIN_THRESHOLD = 1e-12
MIN_SCALE = MIN_THRESHOLD / QMAX
_TINY = MIN_THRESHOLD
_EPS = 1e-10  # KL: an empty q bin under a non-empty p bin counts as holding this much


def safe_scale(threshold: float) -> np.float32:
    """The float32 Q/DQ scale of a clipping threshold: ``threshold / 127``, never below ``MIN_SCALE`` (nor NaN)."""
    scale = np.float32(threshold / QMAX)
    return scale if np.isfinite(scale) and scale >= MIN_SCALE else np.float32(MIN_SCALE)


def absmax(x: np.ndarray) -> float:
    return max(float(x.max()), -float(x.min())) if x.size else 0.0


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
    """The clipping threshold for one tensor (always >= MIN_THRESHOLD)."""
    if not amax > MIN_THRESHOLD:  # zero, denormal or tiny everywhere: quantised to zero
        return MIN_THRESHOLD
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
    """TensorRT's entropy calibration on a |x| histogram: returns the number of bins kept.

    For every candidate ``i`` (bins kept) in ``[levels, n]`` the reference ``p`` is
    ``hist[:i]`` with the clipped tail added to its last bin, and ``q`` quantises ``hist[:i]``
    into ``levels`` groups (bin ``floor(g i / levels)`` starts group ``g``), each group's
    count spread evenly over its non-empty bins. The ``i`` of least KL(p || q) wins (the first
    of equals). ``q`` is constant over a group's non-empty bins, so the KL of a candidate is
    a sum over its ``levels`` groups, not its ``i`` bins: all candidates at once, as one
    (candidates x levels) array, from prefix sums."""
    hist = np.asarray(hist, dtype=np.float64)
    n = hist.size
    if n <= levels:
        return n
    total = float(hist.sum())
    if total <= 0:
        return n
    csum = np.concatenate([[0.0], np.cumsum(hist)])  # csum[j] = sum(hist[:j])
    cnz = np.concatenate([[0.0], np.cumsum(hist != 0, dtype=np.float64)])
    p = hist / total
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.concatenate([[0.0], np.cumsum(np.where(hist > 0, p * np.log(np.where(hist > 0, p, 1.0)), 0.0))])
        cand = np.arange(levels, n + 1)  # candidates i
        edges = (np.arange(levels + 1)[None, :] * cand[:, None]) // levels  # group g is bins [edges[g], edges[g+1])
        sums = csum[edges[:, 1:]] - csum[edges[:, :-1]]
        counts = cnz[edges[:, 1:]] - cnz[edges[:, :-1]]
        kept = csum[cand]  # = sum of q before normalising
        q_group = np.maximum(sums / np.maximum(counts, 1.0) / kept[:, None], _EPS)  # q of each non-empty bin of a group
        log_q = np.log(q_group)
        cross = np.sum(np.where(counts > 0, (sums / total) * log_q, 0.0), axis=1)  # sum p log q over the kept bins
        last = cand - 1
        tail = (total - kept) / total
        p_last = p[last] + tail
        # the last kept bin holds the tail too: its q is its group's (or eps when the bin is empty)
        cross += tail * np.where(hist[last] > 0, log_q[:, -1], np.log(_EPS))
        self_term = plogp[last] + np.where(p_last > 0, p_last * np.log(np.where(p_last > 0, p_last, 1.0)), 0.0)
        kl = np.where(kept > 0, self_term - cross, np.inf)
    return int(cand[int(np.argmin(kl))])


def _mse(hist: np.ndarray, width: float) -> float:
    """Threshold (a bin edge) minimising the expected squared quantisation error.

    For the candidate t_k = k * width, bins whose centre c lies above t_k are clipped ((c - t)^2),
    the others round: c^2 below half a step (t / 127 / 2), step^2 / 12 above. Every candidate at once
    from prefix sums of h, h c and h c^2 (O(n), where a candidates x bins matrix was O(n^2))."""
    h = hist.astype(np.float64)
    n = h.size
    c = (np.arange(n) + 0.5) * width
    s0 = np.concatenate([[0.0], np.cumsum(h)])
    s1 = np.concatenate([[0.0], np.cumsum(h * c)])
    s2 = np.concatenate([[0.0], np.cumsum(h * c * c)])
    k = np.arange(1, n + 1)
    t = k * width
    step = t / QMAX
    # clipped: the bins from j on (centre above t_k; the same float comparison as bin by bin)
    j = np.searchsorted(c, t, side="right")
    clip = (s2[n] - s2[j]) - 2.0 * t * (s1[n] - s1[j]) + t * t * (s0[n] - s0[j])
    # below half a step: bins before m (centre < step / 2) keep c^2; the rest up to j round to step^2 / 12
    m = np.minimum(np.searchsorted(c, step / 2.0, side="left"), j)
    small = s2[m]
    rest = (s0[j] - s0[m]) * step * step / 12.0
    total = clip + small + rest
    best = int(np.argmin(total))
    return float(t[best])
