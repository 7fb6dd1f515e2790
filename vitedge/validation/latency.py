"""Latency: warm up, then time until the median is stable; memory of the process.

FP32 and INT8 are timed *interleaved* (a few iterations of one, then of the other, round
after round) so a neighbour's load on a shared machine slows both alike and the speedup
stays meaningful. The first run after switching models is not timed: the other model's
idle worker threads may still be spinning then (ONNX Runtime's and OpenVINO's thread pools
spin briefly before they sleep), and on 2 cores that alone made an INT8 run after an FP32 run
measure ~1.5x slower than the same run a moment later (benchmarks/results/build_speed_avx512-vnni.md). A model's median is "stable" when the medians of the first and second
half of its samples agree within ``rel_tol``; timing stops when every model is stable
(after at least ``min_iters`` iterations and ``min_seconds`` of timed runs each) or at the
``max_seconds`` cap, and the stats say which. On a busy machine (the timed threads waited for a core past
``core_wait.BUSY_ABOVE`` over the window so far) timing stops as soon as the iteration and time minimums are met:
such figures are marked busy whatever their count (the report, `vitedge compare`), and on a CPU target the speed
gate's batch-1 row is then decided by the one-thread CPU-time look (vitedge.validation.speed_check), so waiting up to
the cap for a median to settle under someone else's load bought nothing but time (5-10 s per batch size of a build
on 2 shared cores).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from vitedge.validation.core_wait import BUSY_ABOVE, CoreWaitMeter
from vitedge.validation.defaults import DEFAULT_LATENCY_SECONDS

METHOD = ("interleaved FP32/INT8 rounds of {chunk} timed iterations (after {settle} untimed run(s) at each switch) "
          "after {warmup} warm-up runs each; "
          "stop when each median is stable (first vs second half within {tol:g}%) after >= {min_iters} "
          "iterations and >= {min_seconds:g} s each, or at {max_seconds:g} s, or, in a busy window (the timed "
          "threads waited over {busy:g} s for a core per second they ran), as soon as those minimums are met")


@dataclass(frozen=True)
class LatencySettings:
    warmup: int = 5
    min_iters: int = 20
    min_seconds: float = DEFAULT_LATENCY_SECONDS  # timed seconds per model and batch size, at least
    max_seconds: float = 10.0  # cap per batch size (both models together)
    rel_tol: float = 0.05
    chunk: int = 5
    settle: int = 1  # untimed runs after switching to another model

    @classmethod
    def for_budget(cls, min_seconds: float) -> "LatencySettings":
        """At least ``min_seconds`` of timed runs per model; capped at 10x that (2 s at least) per batch size."""
        return cls(min_seconds=min_seconds, max_seconds=max(2.0, 10.0 * min_seconds))

    def describe(self) -> str:
        return METHOD.format(chunk=self.chunk, settle=self.settle, warmup=self.warmup, tol=100 * self.rel_tol, min_iters=self.min_iters,
                             min_seconds=self.min_seconds, max_seconds=self.max_seconds, busy=BUSY_ABOVE)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LatencyStats:
    batch: int
    iterations: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    throughput: float  # images per second at this batch, from the median
    stable: bool = True
    samples_ms: tuple[float, ...] = ()
    # seconds the timed threads waited for a core per second they ran, over this batch size's window (all the models
    # interleaved in it share it); None: not known (vitedge.validation.core_wait)
    core_wait: float | None = None

    def to_dict(self, with_samples: bool = False) -> dict:
        d = asdict(self)
        if d["core_wait"] is None:  # not known (or a report written before it was recorded): no key, as then
            d.pop("core_wait")
        if not with_samples:
            d.pop("samples_ms")
        else:
            d["samples_ms"] = list(self.samples_ms)
        return d


def stats_from(samples: list[float], batch: int, stable: bool = True, core_wait: float | None = None) -> LatencyStats:
    arr = np.asarray(samples, dtype=np.float64)
    p50 = float(np.percentile(arr, 50))
    return LatencyStats(
        batch=int(batch),
        iterations=len(samples),
        p50_ms=p50,
        p90_ms=float(np.percentile(arr, 90)),
        p99_ms=float(np.percentile(arr, 99)),
        mean_ms=float(arr.mean()),
        throughput=float(batch * 1000.0 / p50) if p50 > 0 else 0.0,
        stable=stable,
        samples_ms=tuple(float(s) for s in samples),
        core_wait=None if core_wait is None else round(float(core_wait), 3),
    )


def median_is_stable(samples: list[float], rel_tol: float) -> bool:
    if len(samples) < 4:
        return False
    half = len(samples) // 2
    a, b = float(np.median(samples[:half])), float(np.median(samples[half:]))
    mid = float(np.median(samples))
    return mid > 0 and abs(a - b) / mid <= rel_tol


def measure_interleaved(runs: dict[str, Callable[[], Any]], batch: int,
                        settings: LatencySettings = LatencySettings()) -> dict[str, LatencyStats]:
    """Time each zero-argument callable in ``runs`` (same batch size), interleaved."""
    for run in runs.values():
        for _ in range(max(1, settings.warmup)):
            run()
    samples: dict[str, list[float]] = {k: [] for k in runs}
    spent: dict[str, float] = {k: 0.0 for k in runs}
    start = time.perf_counter()

    def floor_met(k: str) -> bool:
        return len(samples[k]) >= settings.min_iters and spent[k] >= settings.min_seconds * 1000.0

    def done(k: str) -> bool:
        return floor_met(k) and median_is_stable(samples[k], settings.rel_tol)

    settle = settings.settle if len(runs) > 1 else 0
    with CoreWaitMeter() as meter:
        while True:
            for k, run in runs.items():
                for _ in range(settle):
                    run()
                for _ in range(settings.chunk):
                    t0 = time.perf_counter()
                    run()
                    dt = (time.perf_counter() - t0) * 1000.0
                    samples[k].append(dt)
                    spent[k] += dt
            if all(done(k) for k in runs) or time.perf_counter() - start >= settings.max_seconds:
                break
            if all(floor_met(k) for k in runs) and _busy(meter):  # more time would not make these figures quiet ones
                break
    waited = None if meter.result is None else meter.result.per_cpu_second
    return {k: stats_from(s, batch, stable=done(k), core_wait=waited) for k, s in samples.items()}


def _busy(meter: CoreWaitMeter) -> bool:
    wait = meter.so_far()
    return wait is not None and wait.busy


def measure_latency(run: Callable[[np.ndarray], Any], batch: np.ndarray, *, warmup: int = 5, min_iters: int = 20,
                    min_seconds: float = DEFAULT_LATENCY_SECONDS, max_seconds: float = 60.0, rel_tol: float = 0.05) -> LatencyStats:
    """Time ``run(batch)`` alone until its median is stable (or the cap)."""
    settings = LatencySettings(warmup=warmup, min_iters=min_iters, min_seconds=min_seconds, max_seconds=max_seconds, rel_tol=rel_tol)
    return measure_interleaved({"model": lambda: run(batch)}, int(batch.shape[0]), settings)["model"]


def without_samples(stats: LatencyStats) -> LatencyStats:
    return replace(stats, samples_ms=())


# --------------------------------------------------------------------------- memory

MEMORY_METHOD = ("peak_rss_bytes: the process's peak resident set size (resource.getrusage ru_maxrss) at the end of "
                 "validation, so it covers loading both models, the data and every run; *_load_rss_bytes: growth of "
                 "the current RSS (/proc/self/statm, or psutil) from before a model was opened to after it ran the "
                 "validation set (its weights, arena and buffers; allocators may keep freed memory, so read it as indicative)")


def current_rss() -> int | None:
    """Resident set size of this process now, in bytes (None when it cannot be read)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:
        return None


def peak_rss() -> int | None:
    """Peak resident set size of this process so far, in bytes."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS reports bytes, Linux KiB
