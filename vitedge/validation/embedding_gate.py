"""The gate rows of an embedding model (a headless encoder).

An encoder is gated on the per-sample cosine similarity between its INT8 and FP32 embeddings
of the same inputs: the mean over the samples, and a low percentile of them (by default the
5th: the worst samples, which a mean hides). Nearest-neighbour agreement (does each sample's
nearest other sample stay the same?) is reported, but gated only when ``min_nn_agreement`` is
set: when the embeddings lie close together (random weights, a model fine-tuned on a narrow
domain) tiny differences swap neighbours, and agreement is chaotic even at cosine 1.000.
"""

from __future__ import annotations

from typing import Any

from vitedge.targets.profiles import Thresholds
from vitedge.validation.gate import FAIL, PASS, SKIP, GateRow

# the rows an embedding model adds to the gate, in order (after min_agreement, before min_speedup)
EMBEDDING_GATE_NAMES = ("min_embedding_cosine", "min_embedding_cosine_low", "min_nn_agreement")
ACCURACY_GATE_NAMES = ("max_top1_drop", "min_agreement", "min_decisive_agreement", "max_expected_drop") + EMBEDDING_GATE_NAMES  # what the budget applies


def agreement_skip_row(t: Thresholds) -> GateRow:
    return GateRow("min_agreement", None, t.min_agreement, True,
                   "not checked: an embedding model is gated on embedding cosine (nearest-neighbour agreement only "
                   "with min_nn_agreement / --min-nn-agreement)", SKIP, "fraction")


def embedding_rows(accuracy: dict[str, Any], t: Thresholds) -> list[GateRow]:
    rows = [_cosine_row("min_embedding_cosine", accuracy.get("embedding_cosine_mean"), t.min_embedding_cosine, "mean"),
            _cosine_row("min_embedding_cosine_low", accuracy.get("embedding_cosine_low"), t.min_embedding_cosine_low,
                        f"p{accuracy.get('embedding_cosine_low_percentile', t.embedding_cosine_percentile):g}")]
    if t.min_nn_agreement is not None:
        agree = accuracy.get("nn_agreement")
        if agree is None:
            rows.append(GateRow("min_nn_agreement", None, t.min_nn_agreement, True,
                                "not checked: nearest-neighbour agreement needs at least 2 samples", SKIP, "fraction"))
        else:
            short = t.min_nn_agreement - agree
            ok = short <= 1e-12
            rows.append(GateRow("min_nn_agreement", agree, t.min_nn_agreement, ok,
                                f"nearest-neighbour agreement with FP32 {100 * agree:.2f}% (limit {100 * t.min_nn_agreement:.2f}%)"
                                + ("" if ok else f", short by {100 * short:.3f} points"), PASS if ok else FAIL, "fraction", short))
    return rows


def _cosine_row(name: str, value: float | None, limit: float, what: str) -> GateRow:
    if value is None:
        return GateRow(name, None, limit, True, f"not checked: no embedding cosine ({what}) was measured", SKIP, "cosine")
    short = limit - value
    ok = short <= 1e-12
    return GateRow(name, value, limit, ok,
                   f"INT8 vs FP32 embedding cosine, {what} over samples, {value:.5f} (limit {limit:g})"
                   + ("" if ok else f", short by {short:.5f}"), PASS if ok else FAIL, "cosine", short)
