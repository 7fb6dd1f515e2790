"""Latency: warm up, then run until the median is stable (enough iterations and time)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class LatencyStats:
    batch: int
    iterations: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    throughput: float  # images per second at this batch, from the median
    samples_ms: tuple[float, ...] = ()

    def to_dict(self, with_samples: bool = False) -> dict:
        d = asdict(self)
        if not with_samples:
            d.pop("samples_ms")
        else:
            d["samples_ms"] = list(self.samples_ms)
        return d


def measure_latency(run, batch: np.ndarray, *, warmup: int = 5, min_iters: int = 20, min_seconds: float = 1.0,
                    max_iters: int = 2000, max_seconds: float = 60.0) -> LatencyStats:
    """Time `run(batch)`; stop after at least `min_iters` and `min_seconds`, or at a cap."""
    for _ in range(warmup):
        run(batch)
    samples: list[float] = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        run(batch)
        samples.append((time.perf_counter() - t0) * 1000.0)
        elapsed = time.perf_counter() - start
        if (len(samples) >= min_iters and elapsed >= min_seconds) or len(samples) >= max_iters or elapsed >= max_seconds:
            break
    arr = np.asarray(samples)
    p50 = float(np.percentile(arr, 50))
    return LatencyStats(
        batch=int(batch.shape[0]),
        iterations=len(samples),
        p50_ms=p50,
        p90_ms=float(np.percentile(arr, 90)),
        p99_ms=float(np.percentile(arr, 99)),
        mean_ms=float(arr.mean()),
        throughput=float(batch.shape[0] * 1000.0 / p50) if p50 > 0 else 0.0,
        samples_ms=tuple(float(s) for s in samples),
    )
