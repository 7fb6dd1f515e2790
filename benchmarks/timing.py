"""Interleaved latency rounds shared by the benchmarks.

In each round every callable runs once untimed (the "settle" run: the previous graph's
idle worker threads may still be spinning, which on 2 cores slows the next run) and then
``timed`` times timed; a round's figure is the median of its timed runs. The settle runs'
times are returned too, so the effect they absorb stays visible.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

TIMED_PER_ROUND = 3


def machine_line() -> str:
    """The CPU a figure was measured on, for a results header: model, ISA, cores."""
    from vitedge.core.cpu import read_cpu

    cpu = read_cpu()
    return f"{cpu.model or platform.processor()} (ISA {cpu.isa}), {os.cpu_count()} cores"


def interleaved_rounds(runs: dict[Hashable, Callable[[], Any]], rounds: int, *, timed: int = TIMED_PER_ROUND,
                       on_round: Callable[[int], None] | None = None) -> tuple[dict[Hashable, list[float]], dict[Hashable, list[float]]]:
    """(per key: each round's median timed ms, per key: each round's settle-run ms)."""
    times: dict[Hashable, list[float]] = {k: [] for k in runs}
    settle: dict[Hashable, list[float]] = {k: [] for k in runs}
    for r in range(rounds):
        for k, f in runs.items():
            t0 = time.perf_counter()
            f()
            settle[k].append((time.perf_counter() - t0) * 1000)
            samples = []
            for _ in range(timed):
                t0 = time.perf_counter()
                f()
                samples.append((time.perf_counter() - t0) * 1000)
            times[k].append(float(np.median(samples)))
        if on_round:
            on_round(r)
    return times, settle
