"""What `Model.predict` returns: one `Prediction` per frame, `Predictions` for a batch.

numpy only. Classes are ranked on the raw logits (so top-1 is exactly ``argmax``, the
same rule the build's validation used); probabilities are the softmax of the logits.
"""

from __future__ import annotations

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
        idx = tuple(int(v) for v in self.indices[i])
        names = tuple(self.class_names[j] for j in idx) if self.class_names else None
        return Prediction(idx, tuple(float(p) for p in self.probs[i]), names)

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
    """(N, C) logits -> (indices (N, k), softmax probs (N, k)), ranked by logit, ties by lower index."""
    n, c = logits.shape
    k = min(k, c)
    probs = softmax(logits)
    if k == 1:
        idx = logits.argmax(axis=1)[:, None]
    else:
        cand = np.argsort(-logits, axis=1, kind="stable")[:, :k] if k * 4 >= c else \
            np.argpartition(-logits, k - 1, axis=1)[:, :k]
        vals = np.take_along_axis(logits, cand, axis=1)
        order = np.lexsort((cand, -vals), axis=-1)
        idx = np.take_along_axis(cand, order, axis=1)
    return idx.astype(np.int64), np.take_along_axis(probs, idx, axis=1)
