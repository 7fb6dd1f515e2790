"""Method ``select``: choose a model's calibration by what it does to the model's output.

The one calibration pass gives every activation's histogram, from which each candidate of
``vitedge.quantize.stats.CANDIDATES`` (entropy, percentile 99.99 and 99.999, minmax, mse) sets a
threshold per tensor at no cost. Which candidate suits a model is not knowable from one tensor's
histogram: entropy minimises a distribution distance, mse the tensor's own squared error, and
neither says how the errors of 20 or 70 tensors add up at the logits. So each candidate builds its
full-INT8 Q/DQ graph, and its distance to FP32 is measured per image (softmax KL for logits, 1 - cosine otherwise).
The candidate with the least mean distance wins when the first candidate, entropy (the former
default), is off by a real and large margin: a paired t statistic over the images (entropy's
per-image distance minus the winner's, mean over standard error) of at least ``SELECT_MIN_T`` (2.0,
about 97.7 % one-sided) *and* a mean distance at least ``SELECT_MIN_RATIO`` (10) times entropy's
smaller. Otherwise entropy stays. The rule guards against collapse, not for the last decimal: on the
corpus the collapsed entropy graphs were 165-8,200x farther from FP32 than the winner, while on the
low-confidence digits ViT mse was 2.7x closer (t 4.1), 40 % closer on held-out images too, and yet
flipped one more held-out near-tie; moderate misses are the accuracy budget's to repair, which tries
every candidate before it returns layers to float (docs/quantization.md). Every candidate's score is kept as evidence, and every
candidate stays available (``Calibration.with_variant``) to the accuracy budget.

Measured on the digits ViTs and the corpus of ViTs trained by others: docs/quantization.md.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from vitedge.errors import QuantizationError
from vitedge.onnxutil import SessionSettings, ort_session
from vitedge.quantize.qdq import build_qdq
from vitedge.quantize.record import Calibration, CandidateScore, Selection

SELECT_THREADS = 2
SELECT_MIN_T = 2.0  # paired t over the scored images a candidate must beat the first one by
SELECT_MIN_RATIO = 10.0  # ... and how many times closer to FP32 than the first one it must be


def output_kind_of(values: np.ndarray, declared: str | None) -> str:
    """``logits`` (softmax KL, agreement) or ``embedding`` (1 - cosine)."""
    if declared in ("logits", "embedding"):
        return declared
    return "logits" if values.ndim == 2 and values.shape[1] >= 2 else "embedding"


def distance(ref: np.ndarray, got: np.ndarray, kind: str) -> tuple[np.ndarray, float | None]:
    """(per-image error, top-1 agreement or None) of outputs ``got`` against ``ref`` (same inputs, same order)."""
    a = ref.reshape(len(ref), -1).astype(np.float64)
    b = got.reshape(len(got), -1).astype(np.float64)
    if kind == "logits":
        pa, lb = _log_softmax(a), _log_softmax(b)
        kl = np.maximum(np.sum(np.exp(pa) * (pa - lb), axis=1), 0.0)
        return kl, float(np.mean(a.argmax(1) == b.argmax(1)))
    num = (a * b).sum(1)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cos = np.where(den > 0, num / np.maximum(den, 1e-300), 1.0)
    return 1.0 - cos, None


def paired_t(first: np.ndarray, other: np.ndarray) -> float:
    """Mean of ``first - other`` over its standard error (positive: ``other`` is closer to FP32);
    +inf when every image agrees on a nonzero difference, 0 when there is none."""
    d = np.asarray(first, dtype=np.float64) - np.asarray(other, dtype=np.float64)
    if len(d) < 2 or not np.all(np.isfinite(d)):
        return float("inf") if np.isinf(first).any() and not np.isinf(other).any() else 0.0
    se = float(np.std(d, ddof=1)) / np.sqrt(len(d))
    mean = float(np.mean(d))
    if se == 0.0:
        return 0.0 if mean == 0.0 else float(np.sign(mean) * np.inf)
    return mean / se


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def _outputs(model: Any, input_name: str, feeds: Sequence[np.ndarray], settings: SessionSettings) -> np.ndarray:
    try:
        sess = ort_session(model, settings, threads=SELECT_THREADS)
    except Exception as err:
        raise QuantizationError(f"ONNX Runtime cannot run a candidate graph of method 'select': {str(err).splitlines()[0][:200]}") from err
    out_name = sess.get_outputs()[0].name
    return np.concatenate([sess.run([out_name], {input_name: x})[0] for x in feeds])


def choose(calibration: Calibration, input_name: str, feeds: Sequence[np.ndarray], *, declared_kind: str | None = None,
           settings: SessionSettings | None = None, log: Any = None, reference: np.ndarray | None = None) -> Selection:
    """Score every variant of ``calibration`` (its full-INT8 graph, the config's attention setting)
    against the FP32 graph on ``feeds`` (model-ready batches), best first. ``reference``: the FP32
    graph's outputs on ``feeds`` when the caller has them (the calibration pass keeps them);
    otherwise ``calibration.model`` runs. Candidates whose thresholds and refinement are the same
    graph are run once."""
    start = time.perf_counter()
    settings = settings or SessionSettings()
    if not calibration.variants:
        raise QuantizationError("method 'select' has no candidate calibrations to choose from (stale cache entry?)")
    runs = 0
    if reference is None:
        reference = _outputs(calibration.model, input_name, feeds, settings)
        runs += len(feeds)
    kind = output_kind_of(reference, declared_kind)
    per_image: dict[str, np.ndarray] = {}
    agreements: dict[str, float | None] = {}
    for name, same in _distinct(calibration).items():
        if same is not None:  # the same graph as an earlier candidate's
            per_image[name], agreements[name] = per_image[same], agreements[same]
            continue
        graph = build_qdq(calibration.with_variant(name))
        got = _outputs(graph.model, input_name, feeds, settings)
        runs += len(feeds)
        del graph
        errors, agreements[name] = distance(reference, got, kind)
        per_image[name] = np.where(np.isfinite(errors), errors, np.inf)
        if log is not None:
            log(f"select: {name} {float(np.mean(per_image[name])):.4g}")
    order = list(calibration.variants)
    first = order[0]
    scores = [CandidateScore(n, float(np.mean(per_image[n])), agreements[n], paired_t(per_image[first], per_image[n])) for n in order]
    ranked = tuple(sorted(scores, key=lambda s: (s.error, order.index(s.name))))
    best, first_error = ranked[0], next(sc.error for sc in scores if sc.name == first)
    chosen = best.name if best.name == first or (best.paired_t >= SELECT_MIN_T and best.error * SELECT_MIN_RATIO <= first_error) else first
    return Selection(chosen=chosen, metric="softmax_kl" if kind == "logits" else "one_minus_cosine",
                     samples=int(sum(len(x) for x in feeds)), scores=ranked, seconds=time.perf_counter() - start,
                     first=first, min_t=SELECT_MIN_T, min_ratio=SELECT_MIN_RATIO, runs=runs)


def _distinct(calibration: Calibration) -> dict[str, str | None]:
    """Per candidate: None, or the earlier candidate whose thresholds and refinement are the same
    (its Q/DQ graph would be the same graph)."""
    out: dict[str, str | None] = {}
    for name, v in calibration.variants.items():
        out[name] = next((e for e in out if out[e] is None and _same_variant(calibration.variants[e], v)), None)
    return out


def _same_variant(a: Any, b: Any) -> bool:
    if a.thresholds != b.thresholds:
        return False
    if a.refinement is None or b.refinement is None:
        return a.refinement is None and b.refinement is None
    ia, xa = a.refinement.to_arrays()
    ib, xb = b.refinement.to_arrays()
    return ia == ib and xa.keys() == xb.keys() and all(np.array_equal(xa[k], xb[k]) for k in xa)
