"""Split N items into contiguous shards whose boundaries fall on the evaluation batch.

Single-process validation runs the data in batches of ``eval_batch(profile batch sizes)`` (at most
``EVAL_BATCH``) from the first item; ``align`` is that batch.
shards that start on a multiple of that batch put every input into the same batch as a
single-process run, so each per-sample output is computed by the same kernels on the same
batch shape and the merged outputs are the single-process outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

from vitedge.core.errors import UsageError
from vitedge.validation.accuracy import EVAL_BATCH


@dataclass(frozen=True)
class Shard:
    index: int
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start

    def describe(self) -> str:
        return f"shard {self.index} (items {self.start}..{self.stop - 1})"


def shard_ranges(items: int, shards: int, align: int = EVAL_BATCH) -> list[Shard]:
    """At most ``shards`` contiguous, non-empty, ``align``-aligned shards covering ``range(items)``."""
    if shards < 1:
        raise UsageError(f"the number of shards must be at least 1, got {shards}")
    if items < 1:
        raise UsageError("there is nothing to shard: the data set is empty")
    blocks = -(-items // align)
    count = min(shards, blocks)
    per, extra = divmod(blocks, count)
    out, block = [], 0
    for i in range(count):
        n = per + (1 if i < extra else 0)
        start, stop = block * align, min(items, (block + n) * align)
        out.append(Shard(i, start, stop))
        block += n
    return out
