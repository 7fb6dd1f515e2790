"""How far INT8 weights may reach, so that no CPU kernel saturates.

x86 CPUs without VNNI (AVX2-only, AVX-512 without VNNI) multiply u8 activations by s8
weights with ``VPMADDUBSW``, which adds each *pair* of adjacent products along the
reduction axis K into a signed 16-bit lane **with saturation**. Signed INT8 activations
are first shifted to u8 (x + 128), so a pair reaches ``255 * (|w_2k| + |w_2k+1|)`` and
overflows int16 (32767) once ``|w_2k| + |w_2k+1| > 128``: the result is silently wrong.
ONNX Runtime (MLAS U8S8 kernels) and OpenVINO (oneDNN) both do this; VNNI
(``VPDPBUSD``), AMX and NVIDIA GPUs accumulate in int32 and never saturate.

The rules (``QuantConfig.weight_range``):

* ``full``: the whole signed range, per output channel ``scale = max|w| / 127``. Exact on
  VNNI/AMX CPUs and TensorRT; wrong on pre-VNNI x86.
* ``pairwise`` (the default for CPU targets): per output channel, the smallest scale with
  ``|q| <= 127`` and ``|q_2k| + |q_2k+1| <= 128`` for every adjacent pair along K of a
  MatMul/Gemm weight, so no pair can saturate whichever kernel runs it. A convolution
  (the patch embedding) is bounded in both layouts its kernels pair weights in: adjacent
  input channels at one kernel position (oneDNN's ``...4i`` blocked weights) and adjacent
  positions of the flattened (in, kh, kw) row (im2col GEMM). Costs under a bit of weight
  resolution on the channels that need it, nothing where no pair is large.
* ``7bit``: ``|q| <= 64`` everywhere (NNCF's ``overflow_fix``, ONNX Runtime's
  ``reduce_range``), kept for comparison.

Which CPU a bundle is safe on is recorded in its manifest (``cpu_requirement``) and checked
by ``vitedge.runtime`` when it loads the bundle.
"""

from __future__ import annotations

import numpy as np

from vitedge.quantize.config import CPU_REQUIREMENT, WEIGHT_RANGES  # noqa: F401 - the rules' names live with the settings
from vitedge.quantize.stats import MIN_SCALE

QMAX = 127
PAIR_LIMIT = 128  # 255 * 128 = 32640 <= 32767
SEVEN_BIT = 64  # 255 * 2 * 64 = 32640



def weight_scales(w: np.ndarray, axis: int, op_type: str, rule: str) -> np.ndarray:
    """Per-output-channel scales (float32, shape ``[w.shape[axis]]``) for ``rule``.

    ``axis`` is the output-channel axis. For MatMul ([K, N], axis 1) and Gemm with
    transB ([N, K], axis 0) the other axis is K, paired (0, 1), (2, 3), ... as the
    kernels pack it.
    """
    if rule not in WEIGHT_RANGES:
        raise ValueError(f"unknown weight range rule {rule!r}")
    w = np.asarray(w, dtype=np.float32)
    reduce = tuple(i for i in range(w.ndim) if i != axis)
    amax = np.max(np.abs(w), axis=reduce).astype(np.float64)
    if rule == "full":
        scale = amax / QMAX
    elif rule == "7bit":
        scale = amax / SEVEN_BIT
    else:
        # the pair bound holds after rounding too: |rint(a)| + |rint(b)| <= PAIR_LIMIT when
        # a + b <= PAIR_LIMIT - 1 (each rint adds at most 0.5)
        scale = np.maximum(amax / QMAX, _max_pairs(np.abs(w).astype(np.float64), axis) / (PAIR_LIMIT - 1))
    # an all-zero channel: 1; a denormal or tiny one: MIN_SCALE (a scale of 0 or a denormal is invalid in ONNX)
    return np.where(amax > 0, np.maximum(scale, MIN_SCALE), 1.0).astype(np.float32)


def quantize_weight(w: np.ndarray, axis: int, op_type: str, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """(int8 weights, per-channel scales) under ``rule``."""
    scale = weight_scales(w, axis, op_type, rule)
    shape = [1] * np.ndim(w)
    shape[axis] = -1
    limit = SEVEN_BIT if rule == "7bit" else QMAX
    q = np.clip(np.rint(np.asarray(w, dtype=np.float32) / scale.reshape(shape)), -limit, limit).astype(np.int8)
    return q, scale


def _pair_sums(rows: np.ndarray) -> np.ndarray:
    """[channels, K] -> [channels, ceil(K/2)] sums of adjacent pairs (0,1), (2,3), ..."""
    if rows.shape[1] % 2:
        rows = np.concatenate([rows, np.zeros((rows.shape[0], 1), dtype=rows.dtype)], axis=1)
    return rows[:, 0::2] + rows[:, 1::2]


def _max_pairs(absw: np.ndarray, axis: int) -> np.ndarray:
    """Per output channel, the largest pair sum in every layout a CPU kernel may pair weights in."""
    w = np.moveaxis(absw, axis, 0)  # [channels, ...]
    if w.ndim == 2:  # MatMul / Gemm: pairs along K
        return _pair_sums(w).max(axis=1) if w.shape[1] else np.zeros(w.shape[0])
    channels = w.shape[0]
    flat = _pair_sums(w.reshape(channels, -1)).max(axis=1)  # im2col order (in, kh, kw)
    by_input = np.moveaxis(w, 1, -1).reshape(-1, w.shape[1])  # [channels * positions, in]
    per_position = _pair_sums(by_input).max(axis=1).reshape(channels, -1).max(axis=1)
    return np.maximum(flat, per_position)


def max_pair_sum(q: np.ndarray, axis: int) -> int:
    """The largest |q_a| + |q_b| over the pairs ``weight_scales`` bounds (for checks and tests)."""
    absq = np.abs(np.asarray(q, dtype=np.int64))
    return int(_max_pairs(absq, axis).max()) if absq.size else 0
