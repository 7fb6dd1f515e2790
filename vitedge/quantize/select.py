"""Method ``select``: choose a model's calibration by what it does to the model's output.

The one calibration pass gives every activation's histogram, from which each candidate of
``vitedge.quantize.stats.CANDIDATES`` (entropy, percentile 99.99 and 99.999, minmax, mse) sets a
threshold per tensor at no cost. Which candidate suits a model is not knowable from one tensor's
histogram: entropy minimises a distribution distance, mse the tensor's own squared error, and
neither says how the errors of 20 or 70 tensors add up at the logits. So each candidate builds its
full-INT8 Q/DQ graph, and its distance to FP32 is measured per image (softmax KL for logits, 1 - cosine otherwise).
The candidate with the least mean distance wins when the first candidate, entropy (the former
default), is off by a real and large margin: a paired t statistic over the images of the log of
entropy's per-image distance over the winner's (``log_ratio_t``: is entropy farther on image after
image, not on a few) of at least ``SELECT_MIN_T`` (2.0, about 97.7 % one-sided) *and* a mean distance at
least ``SELECT_MIN_RATIO`` (10) times entropy's smaller. (Until issue 28 the t was over the plain
differences; a collapse whose error sits in a few images then passed as noise: kavishka-shallow,
entropy farther on 64 of 64 images, a median 985x, 132,960x on the mean, plain t 1.65, log t 16.0;
only the accuracy budget's second evaluation then found mse.) Otherwise entropy stays. The rule guards against collapse, not for the last decimal: on the
corpus the collapsed entropy graphs were 165-8,200x farther from FP32 than the winner, while on the
low-confidence digits ViT mse was 2.7x closer (t 4.1), 40 % closer on held-out images too, and yet
flipped one more held-out near-tie; moderate misses are the accuracy budget's to repair, which tries
every candidate before it returns layers to float (docs/quantization.md). Every candidate's score is kept as evidence, and every
candidate stays available (``Calibration.with_variant``) to the accuracy budget.

Measured on the digits ViTs and the corpus of ViTs trained by others: docs/quantization.md.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vitedge.core.errors import QuantizationError
from vitedge.onnxkit.session import SessionSettings, ort_session
from vitedge.quantize.qdq import build_qdq
from vitedge.quantize.record import Calibration, CandidateScore, Selection, Variant

if TYPE_CHECKING:
    from onnx import ModelProto

SELECT_THREADS = 2
SELECT_MIN_T = 2.0  # paired t of the per-image log distances a candidate must beat the first one by
SELECT_MIN_RATIO = 10.0  # ... and how many times closer to FP32 than the first one it must be
# Every candidate is scored on the first SELECT_FIRST_LOOK images; only the first one and those at least
# SELECT_CONTEND_RATIO times closer to FP32 there go on to all of them (docs/quantization.md: on the corpus
# and the digits ViTs every collapse was 150x or more closer on the first 8 images, 188x on 16; of the kept
# models one was 3.3x on 8, a contender that costs time, not the choice). 8, one batch: issue 28 item 3.
SELECT_FIRST_LOOK = 8
SELECT_CONTEND_RATIO = 3.0


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


LOG_FLOOR = 1e-12  # added to every per-image distance before its log (an exact match has distance 0)


def log_ratio_t(first: np.ndarray, other: np.ndarray) -> float:
    """``paired_t`` of the per-image log distances: positive when ``other`` is closer to FP32 image after image,
    whatever a few images' distances weigh (a collapse that breaks some images far more than others)."""
    a = np.log(np.asarray(first, dtype=np.float64) + LOG_FLOOR)
    b = np.log(np.asarray(other, dtype=np.float64) + LOG_FLOOR)
    return paired_t(a, b)


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def _outputs(model: str | Path | bytes | ModelProto, input_name: str, feeds: Sequence[np.ndarray], settings: SessionSettings) -> np.ndarray:
    try:
        sess = ort_session(model, settings, threads=SELECT_THREADS)
    except Exception as err:
        raise QuantizationError(f"ONNX Runtime cannot run a candidate graph of method 'select': {str(err).splitlines()[0][:200]}") from err
    out_name = sess.get_outputs()[0].name
    return np.concatenate([sess.run([out_name], {input_name: x})[0] for x in feeds])


@dataclass
class _Scorer:
    """Runs candidates' full-INT8 graphs on slices of the feeds and keeps each one's per-image error."""

    calibration: Calibration
    input_name: str
    settings: SessionSettings
    reference: np.ndarray  # the FP32 outputs on all the feeds
    kind: str
    log: Any = None
    runs: int = 0
    errors: dict[str, np.ndarray] = field(default_factory=dict)
    matches: dict[str, np.ndarray | None] = field(default_factory=dict)

    def score(self, name: str, feeds: Sequence[np.ndarray], offset: int) -> None:
        """Score candidate ``name`` on ``feeds`` (the images from ``offset`` on), after what it has."""
        graph = build_qdq(self.calibration.with_variant(name))
        got = _outputs(graph.model, self.input_name, feeds, self.settings)
        self.runs += len(feeds)
        del graph
        ref = self.reference[offset:offset + len(got)]
        errors, _ = distance(ref, got, self.kind)
        errors = np.where(np.isfinite(errors), errors, np.inf)
        match = (ref.reshape(len(ref), -1).argmax(1) == got.reshape(len(got), -1).argmax(1)) if self.kind == "logits" else None
        self.errors[name] = np.concatenate([self.errors[name], errors]) if name in self.errors else errors
        if match is not None:
            self.matches[name] = np.concatenate([self.matches[name], match]) if name in self.matches else match
        else:
            self.matches[name] = None
        if self.log is not None:
            self.log(f"select: {name} {float(np.mean(self.errors[name])):.4g} on {len(self.errors[name])} images")


def choose(calibration: Calibration, input_name: str, feeds: Sequence[np.ndarray], *, declared_kind: str | None = None,
           settings: SessionSettings | None = None, log: Callable[[str], None] | None = None, reference: np.ndarray | None = None) -> Selection:
    """Score every variant of ``calibration`` (its full-INT8 graph, the config's attention setting)
    against the FP32 graph on ``feeds`` (model-ready batches), best first. Every candidate runs on the
    first ``SELECT_FIRST_LOOK`` images; the first candidate and those ``SELECT_CONTEND_RATIO`` times
    closer than it there go on to all of them, where the rule decides. ``reference``: the FP32 graph's
    outputs on ``feeds`` when the caller has them (the calibration pass keeps them); otherwise
    ``calibration.model`` runs. Candidates whose thresholds and refinement are the same graph are run once."""
    start = time.perf_counter()
    if not calibration.variants:
        raise QuantizationError("method 'select' has no candidate calibrations to choose from (stale cache entry?)")
    settings = settings or SessionSettings()
    runs = 0
    if reference is None:
        reference = _outputs(calibration.model, input_name, feeds, settings)
        runs += len(feeds)
    scorer = _Scorer(calibration, input_name, settings, reference, output_kind_of(reference, declared_kind), log)
    head, tail = _first_look(feeds)
    same = _distinct(calibration)
    runnable = [n for n, s in same.items() if s is None]
    first = runnable[0]
    for name in runnable:
        scorer.score(name, head, 0)
    contenders = _contenders(scorer.errors, first) if tail else []
    if contenders:
        for name in (first, *contenders):
            scorer.score(name, tail, sum(len(x) for x in head))
    selection = _decide(calibration, scorer, same, first)
    return dataclasses.replace(selection, seconds=time.perf_counter() - start, runs=runs + scorer.runs,
                               available=int(sum(len(x) for x in feeds)))


def _first_look(feeds: Sequence[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(the batches holding the first ``SELECT_FIRST_LOOK`` images, the rest)."""
    count, cut = 0, len(feeds)
    for i, x in enumerate(feeds):
        if count >= SELECT_FIRST_LOOK:
            cut = i
            break
        count += len(x)
    return list(feeds[:cut]), list(feeds[cut:])


def _contenders(errors: dict[str, np.ndarray], first: str) -> list[str]:
    """The candidates at least ``SELECT_CONTEND_RATIO`` times closer to FP32 than ``first`` on the first look."""
    base = float(np.mean(errors[first]))
    return [n for n, e in errors.items() if n != first and float(np.mean(e)) * SELECT_CONTEND_RATIO <= base and base > 0]


def _decide(calibration: Calibration, scorer: _Scorer, same: dict[str, str | None], first: str) -> Selection:
    """The rule on what was scored: the closest candidate scored on as many images as ``first`` replaces it
    when it is ``SELECT_MIN_RATIO`` times closer at a paired t of at least ``SELECT_MIN_T``."""
    order = list(calibration.variants)
    full = len(scorer.errors[first])
    scores = []
    for name in order:
        rep = same[name] or name
        e, m = scorer.errors[rep], scorer.matches[rep]
        k = min(len(e), full)
        scores.append(CandidateScore(name, float(np.mean(e)), None if m is None else float(np.mean(m)),
                                     log_ratio_t(scorer.errors[first][:k], e[:k]), samples=len(e)))
    ranked = tuple(sorted(scores, key=lambda s: (s.samples < full, s.error, order.index(s.name))))
    best, first_error = ranked[0], next(sc.error for sc in scores if sc.name == first)
    switch = best.name != first and best.paired_t >= SELECT_MIN_T and best.error * SELECT_MIN_RATIO <= first_error
    return Selection(chosen=best.name if best.name == first or switch else first,
                     metric="softmax_kl" if scorer.kind == "logits" else "one_minus_cosine", samples=full, scores=ranked,
                     first=first, min_t=SELECT_MIN_T, min_ratio=SELECT_MIN_RATIO, first_look=SELECT_FIRST_LOOK,
                     contend_ratio=SELECT_CONTEND_RATIO)


def _distinct(calibration: Calibration) -> dict[str, str | None]:
    """Per candidate: None, or the earlier candidate whose thresholds and refinement are the same
    (its Q/DQ graph would be the same graph)."""
    out: dict[str, str | None] = {}
    for name, v in calibration.variants.items():
        out[name] = next((e for e in out if out[e] is None and _same_variant(calibration.variants[e], v)), None)
    return out


def _same_variant(a: Variant, b: Variant) -> bool:
    if a.thresholds != b.thresholds:
        return False
    if a.refinement is None or b.refinement is None:
        return a.refinement is None and b.refinement is None
    ia, xa = a.refinement.to_arrays()
    ib, xb = b.refinement.to_arrays()
    return ia == ib and xa.keys() == xb.keys() and all(np.array_equal(xa[k], xb[k]) for k in xa)
