"""What `Model.predict` returns: one `Prediction` per frame, `Predictions` for a batch.

numpy only. Classes are ranked on the raw logits (so top-1 is exactly ``argmax``, the
same rule the build's validation used); probabilities are the softmax of the logits.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Prediction:
    """Top-k classes of one frame, best first."""

    indices: tuple[int, ...]  # class indices
    probs: tuple[float, ...]  # softmax probabilities, same order
    names: tuple[str, ...] | None  # class names when the bundle's manifest has them

    @property
    def index(self) -> int:
        """The top-1 class index."""
        return self.indices[0]

    @property
    def prob(self) -> float:
        """The top-1 probability."""
        return self.probs[0]

    @property
    def name(self) -> str | None:
        """The top-1 class name, or None when the bundle has no class names."""
        return self.names[0] if self.names else None

    @property
    def label(self) -> str:
        """The top-1 class name, or its index as text: always printable."""
        return self.name if self.name is not None else str(self.index)

    def to_dict(self) -> dict[str, Any]:
        return {"indices": list(self.indices), "probs": list(self.probs), "names": list(self.names) if self.names else None}


@dataclass(frozen=True, eq=False)
class Predictions(Sequence[Prediction]):
    """Top-k classes of a batch of N frames: arrays for vectorised use, `Prediction` per item.

    ``indices`` is an (N, k) int64 array and ``probs`` an (N, k) float32 array, best
    first; ``class_names`` maps an index to its name (None when the bundle has none).
    Indexing or iterating gives one `Prediction` per frame.
    """

    indices: np.ndarray
    probs: np.ndarray
    class_names: tuple[str, ...] | None = None

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return Predictions(self.indices[i], self.probs[i], self.class_names)
        idx = tuple(self.indices[i].tolist())
        names = tuple(self.class_names[j] for j in idx) if self.class_names else None
        return Prediction(idx, tuple(self.probs[i].tolist()), names)

    def __iter__(self) -> Iterator[Prediction]:
        for i in range(len(self)):
            yield self[i]

    @property
    def top1(self) -> np.ndarray:
        """(N,) top-1 class indices."""
        return self.indices[:, 0] if len(self) else np.zeros((0,), dtype=np.int64)

    @property
    def names(self) -> list[tuple[str, ...]] | None:
        """Per frame, the top-k class names (None when the bundle has none)."""
        if not self.class_names:
            return None
        return [tuple(self.class_names[j] for j in row) for row in self.indices]

    def to_list(self) -> list[dict[str, Any]]:
        return [p.to_dict() for p in self]


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, in float32, stable for large logits."""
    z = logits.astype(np.float32, copy=True)
    z -= z.max(axis=-1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z


def top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, C) logits -> (indices (N, k) int64, softmax probs (N, k) float32), best first.

    Ranked by logit (top-1 is exactly argmax); equal logits rank by lower index. Kept to a
    handful of numpy calls: for a small model this runs once per frame beside a ~1 ms inference."""
    n, c = logits.shape
    k = min(k, c)
    z = logits.astype(np.float32, copy=False)
    if k == 1:
        idx = z.argmax(axis=1)[:, None]
    elif c <= 2048:
        idx = np.argsort(-z, axis=1, kind="stable")[:, :k]
    else:  # many classes: partition first, then order the k candidates
        cand = np.sort(np.argpartition(-z, k - 1, axis=1)[:, :k], axis=1)
        order = np.argsort(-np.take_along_axis(z, cand, axis=1), axis=1, kind="stable")
        idx = np.take_along_axis(cand, order, axis=1)
    rows = np.arange(n)[:, None]
    e = np.exp(z - z[rows, idx[:, :1]])  # the top-1 logit is the row maximum
    probs = e[rows, idx] / e.sum(axis=1, keepdims=True)
    return idx.astype(np.int64, copy=False), probs


# Below this many classes one frame's top-k is done in plain Python: right after an inference
# the caches hold the model, and a few list operations touch far less cold code than ~10
# numpy calls (measured: ~35 us vs ~90 us per frame, benchmarks/results/runtime_overhead.md).
SMALL_HEAD = 256


def top_k_one(logits: np.ndarray, k: int, class_names: tuple[str, ...] | None) -> Prediction:
    """One frame's (C,) logits -> its `Prediction`; the same ranking and softmax as `top_k`."""
    row = logits.tolist()
    k = min(k, len(row))
    top = max(row)
    e = [math.exp(v - top) for v in row]
    total = sum(e)
    order = sorted(range(len(row)), key=row.__getitem__, reverse=True)[:k]  # stable: ties keep the lower index first
    names = tuple(class_names[i] for i in order) if class_names else None
    return Prediction(tuple(order), tuple(e[i] / total for i in order), names)
