"""Accuracy of a quantized model against its FP32 reference and against labels."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vitedge.targets.profiles import DEFAULT_DROP_CONFIDENCE, DEFAULT_NEAR_TIE_MARGIN
from vitedge.validation.inputs import feed_for
from vitedge.validation.noise import near_ties, paired_drop
from vitedge.validation.sanity import fp32_at_chance

EVAL_BATCH = 32  # the most inputs per inference call while collecting outputs


def eval_batch(batch_sizes: tuple[int, ...] | list[int] = ()) -> int:
    """Inputs per inference call while collecting outputs: the largest of the profile's batch sizes up to
    EVAL_BATCH (an engine built for batches up to 4 runs at 4), EVAL_BATCH when none fits.

    The one rule for single-process validation and the shards of `vitedge.distributed`, which start on
    multiples of it so every input runs in the same batch either way."""
    fits = [int(b) for b in batch_sizes if 1 <= int(b) <= EVAL_BATCH]
    return max(fits) if fits else EVAL_BATCH


@dataclass
class Outputs:
    values: np.ndarray  # (N, C) logits or (N, D) embeddings
    labels: np.ndarray | None


def collect_outputs(runner, source, pre, *, batch_size: int = EVAL_BATCH) -> Outputs:
    """The runner's outputs on every item of ``source`` (and their labels), in order: one pass, through
    ``Runner.infer_all`` (several batches in flight where the runtime can)."""
    labels: list[np.ndarray] = []
    has_labels = True

    def feeds():
        nonlocal has_labels
        for batch in source.batches(batch_size):
            if batch.labels is None:
                has_labels = False
            else:
                labels.append(batch.labels)
            yield feed_for(runner, batch.images, pre)

    outs = [np.asarray(o, dtype=np.float32) for o in runner.infer_all(feeds())]
    return Outputs(np.concatenate(outs), np.concatenate(labels) if has_labels and labels else None)


def _softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def topk_accuracy(logits: np.ndarray, labels: np.ndarray, k: int) -> float:
    k = min(k, logits.shape[1])
    top = np.argsort(-logits, axis=1)[:, :k]
    return float(np.mean(np.any(top == labels[:, None], axis=1)))


def compare_logits(ref: np.ndarray, got: np.ndarray, labels: np.ndarray | None, *,
                   near_tie_margin: float = DEFAULT_NEAR_TIE_MARGIN, drop_confidence: float = DEFAULT_DROP_CONFIDENCE) -> dict:
    """Classifier parity: top-1/top-5 (with labels), agreement, cosine, logit error, KL; and the
    near-tie statistics the gate reads (vitedge.validation.noise): agreement where FP32 is decisive,
    the expected drop under FP32's probabilities, and with labels the drop's exact paired interval and whether
    FP32 itself is at chance on them (``fp32_at_chance``: then the labels cannot excuse flips)."""
    out: dict = {"samples": int(ref.shape[0])}
    if labels is not None:
        out["fp32_top1"] = topk_accuracy(ref, labels, 1)
        out["int8_top1"] = topk_accuracy(got, labels, 1)
        out["top1_drop_points"] = 100.0 * (out["fp32_top1"] - out["int8_top1"])
        out["fp32_at_chance"] = fp32_at_chance(out["fp32_top1"], int(ref.shape[1]), int(ref.shape[0]))
        out["fp32_top5"] = topk_accuracy(ref, labels, 5)
        out["int8_top5"] = topk_accuracy(got, labels, 5)
        if drop_confidence > 0:
            out.update(paired_drop(ref.argmax(1), got.argmax(1), labels, drop_confidence))
    out["top1_agreement"] = float(np.mean(ref.argmax(1) == got.argmax(1)))
    if len(ref):
        out.update(near_ties(ref, got, near_tie_margin, labels))
    cos = np.sum(ref * got, axis=1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1) + 1e-12)
    out["logit_cosine_mean"] = float(cos.mean())
    out["logit_cosine_min"] = float(cos.min())
    err = np.abs(ref - got)
    out["logit_abs_error_mean"] = float(err.mean())
    out["logit_abs_error_max"] = float(err.max())
    p, q = _softmax(ref.astype(np.float64)), _softmax(got.astype(np.float64))
    out["softmax_kl_mean"] = float(np.mean(np.sum(p * (np.log(p + 1e-12) - np.log(q + 1e-12)), axis=1)))
    return out


def compare_embeddings(ref: np.ndarray, got: np.ndarray, percentile: float = 5.0) -> dict:
    """Encoder parity: per-sample cosine similarity of INT8 vs FP32 embeddings (mean, the
    ``percentile``-th percentile, worst 1%) and nearest-neighbour agreement (reported; gated only
    on request, see Thresholds.min_nn_agreement)."""
    cos = np.sum(ref * got, axis=1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1) + 1e-12)
    worst = np.sort(cos)[: max(1, int(np.ceil(0.01 * len(cos))))]

    def nn(x: np.ndarray) -> np.ndarray:
        xn = x / (np.linalg.norm(x, axis=1, keepdims=True) + 1e-12)
        sim = xn @ xn.T
        np.fill_diagonal(sim, -np.inf)
        return sim.argmax(1)

    out = {
        "samples": int(ref.shape[0]),
        "embedding_cosine_mean": float(cos.mean()),
        "embedding_cosine_low": float(np.percentile(cos, percentile)),
        "embedding_cosine_low_percentile": float(percentile),
        "embedding_cosine_worst1pct": float(worst.mean()),
    }
    if ref.shape[0] > 1:
        out["nn_agreement"] = float(np.mean(nn(ref) == nn(got)))
        out["top1_agreement"] = out["nn_agreement"]  # what `compare` tracks for encoders; not a gate unless asked
    return out
