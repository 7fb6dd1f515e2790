"""GPTQ weight rounding under vitedge's weight-range rules.

Round-to-nearest (RTN) rounds every weight on its own. GPTQ (Frantar et al., 2022) rounds
the input channels of a Linear layer one after another and pushes each rounding error onto
the channels not rounded yet, weighted by the inverse Hessian ``H = X^T X`` of the layer's
calibration inputs, so that the layer's *output* error ``||X W - X W_q||`` shrinks rather
than the weight error. Cost per layer: one Cholesky of a K x K matrix and O(K^2 N) flops
(K inputs, N outputs), no forward pass (``H`` comes from the refinement pass).

The per-output-channel scales are the ones ``weight_range.weight_scales`` picks for round-
to-nearest, and the rule's limits hold for every rounded weight: ``|q| <= 127`` (64 for
``7bit``) and, for ``pairwise``, ``|q_2k| + |q_2k+1| <= 128`` along K (the second weight of
a pair is clipped against the first, already rounded one; the clipping error is compensated
like any rounding error).
"""

from __future__ import annotations

import numpy as np

from vitedge.quantize.weight_range import PAIR_LIMIT, QMAX, SEVEN_BIT, weight_scales

DAMPING = 0.01  # of the mean diagonal of H, added to it (the paper's default)
BLOCK = 128  # columns per lazy-batch block


def gptq_quantize(w_kn: np.ndarray, hessian: np.ndarray, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """GPTQ-rounded INT8 weights of a [K, N] (input x output) matrix.

    Returns ``(q [K, N] int8, scale [N] float32)``: the same scales as round-to-nearest
    under ``rule``.
    """
    w = np.asarray(w_kn, dtype=np.float64)
    k, n = w.shape
    scale = weight_scales(w.astype(np.float32), 1, "MatMul", rule).astype(np.float64)
    limit = SEVEN_BIT if rule == "7bit" else QMAX
    h = np.array(hessian, dtype=np.float64, copy=True)
    if not np.all(np.isfinite(h)):  # X^T X past float32 (an activation near 1e19 or more): plain rounding, never NaN weights
        h = np.eye(k)
    dead = np.diag(h) <= 0
    h[dead, dead] = 1.0
    wt = w.T.copy()  # [N, K]: a column per input channel, as in the paper
    wt[:, dead] = 0.0
    h[np.diag_indices(k)] += DAMPING * float(np.mean(np.diag(h)))
    hinv = _inverse_cholesky_upper(h)
    q = np.zeros((n, k), dtype=np.float64)
    for b0 in range(0, k, BLOCK):
        b1 = min(b0 + BLOCK, k)
        errs = np.zeros((n, b1 - b0))
        for i in range(b0, b1):
            col = wt[:, i]
            cap = np.full(n, float(limit))
            if rule == "pairwise" and i % 2 == 1:
                cap = np.minimum(cap, PAIR_LIMIT - np.abs(q[:, i - 1]))
            qi = np.clip(np.rint(col / scale), -cap, cap)
            q[:, i] = qi
            err = (col - qi * scale) / hinv[i, i]
            wt[:, i + 1:b1] -= np.outer(err, hinv[i, i + 1:b1])
            errs[:, i - b0] = err
        wt[:, b1:] -= errs @ hinv[b0:b1, b1:]
    return q.T.astype(np.int8), scale.astype(np.float32)


def _inverse_cholesky_upper(h: np.ndarray) -> np.ndarray:
    """Upper Cholesky factor of H^-1 (more damping until H is positive definite)."""
    k = h.shape[0]
    extra = 0.0
    for _ in range(8):
        try:
            hi = np.linalg.inv(h + extra * np.eye(k))
            return np.linalg.cholesky(hi).T
        except np.linalg.LinAlgError:
            extra = max(extra * 10.0, 1e-6 * float(np.mean(np.diag(h))) or 1e-6)
    return np.eye(k)  # plain round-to-nearest (each error stays where it is)
