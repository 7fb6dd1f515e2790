"""A census of the inference passes over a data set this process ran (issue 28 item 4).

A pass is one model run over every item of a source (or until the accuracy budget stopped it
early): the accuracy budget's FP32 references and candidates, validation's FP32 and INT8 sides and
its FP32 preprocessing probe (one pass per mean shift) record one each time they run, and none when
their outputs come from the reference cache or another runtime's shared FP32 outputs. A
cold build should run each (graph, runtime, data) pass once; ``passes()`` is what a test or a
benchmark reads to check that. The spot check of a cached INT8 entry (two batches) is not a pass.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class InferencePass:
    stage: str  # "budget" | "validation" | "probe" (validation's FP32 preprocessing probe)
    side: str  # "fp32" | "int8"; a probe pass: "fp32-0.25" / "fp32+0.25" (the mean shift)
    runtime: str  # the backend's name
    graph_sha256: str | None  # the file that ran (reference_cache.graph_sha256), None for an in-memory graph
    data_hash: str
    items: int  # items run (fewer than the source's when the budget stopped early)
    batch: int


_LOCK = threading.Lock()
_PASSES: list[InferencePass] = []


def record(p: InferencePass) -> None:
    with _LOCK:
        _PASSES.append(p)


def passes() -> list[InferencePass]:
    """The passes recorded since the last ``reset``, in order."""
    with _LOCK:
        return list(_PASSES)


def reset() -> None:
    with _LOCK:
        _PASSES.clear()
