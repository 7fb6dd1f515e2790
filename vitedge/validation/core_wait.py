"""How long this process's threads waited for a core while they were timed: the load of other processes, as the
timing itself felt it.

Wall-clock latency counts whatever else the machine runs. Interleaving FP32 and INT8 spreads a steady load over both,
but on a busy machine the two graphs need not feel it alike (with idle intra-op threads asleep, as in the timed
sessions, each parallel section waits for its worker threads to get a core back; a graph with more of them pays more
often). On 2 cores running two corpus benchmarks at once (load average 4.3-5.6), the builds of two small corpus ViTs
timed their FP32 reference at 9.8 ms a call at batch 1, where one thread's CPU time on the same graphs was 1.6-1.9 ms:
their speedups read 4.6x and 5.0x where CPU time said 1.1x and 1.2x (benchmarks/results/corpus_issue47e_avx2.json).

Linux's scheduler counts, per thread, the time it ran and the time it sat runnable waiting for a core
(``/proc/<pid>/task/<tid>/schedstat``: the first two fields, in nanoseconds). Their sums over the timing window give
**waited seconds per second on a core**: a thread that is ready to run waits for a core only while other threads
hold them all, and each second it waits stretches the wall-clock figure it is timing. Past 0.1 (a tenth of a
second per second run: enough to stretch a figure by the 10 % that `vitedge compare` allows a latency to grow by
default) the figures were taken on a machine busy with other work, and they say so. Measured on a 2-core AVX2
machine timing a small corpus ViT's two graphs at batch 1 and 8: 0.005 with nothing else running, 0.02 beside three
busy processes at nice 19, 0.7-0.9 beside one busy process, 1.4-3.3 beside three; two corpus benchmarks running at
once: 0.4-1.6 in their builds, where at 0.99 the FP32 reference's batch-8 median was 15.2 ms against 4.6 ms
alone. Where the counters cannot be read (not Linux, or a kernel without them) nothing is said.

A wait is counted against other processes only up to the core time this process left unused in the window (its
affinity's cores times the wall time, less the time its threads ran): while its own threads hold every core, a thread
that waits waits for its own process. ONNX Runtime's default session on 2 cores (the calling thread and a pool thread
that spins after each run, beside the other graph's) read 0.5 with nothing else running when every wait was counted,
so every onnx build on such a machine was called busy; with the cap it reads 0.003, and 0.33 beside one busy process
(one inference thread: 0.000 and 0.004, it never competed with itself).
"""

from __future__ import annotations

import glob
import os
import time
from dataclasses import dataclass

from vitedge.validation.defaults import DEFAULT_MAX_LATENCY_REGRESSION

# waited seconds per second on a core past which a figure may be stretched by more than vitedge compare's default limit
BUSY_ABOVE = DEFAULT_MAX_LATENCY_REGRESSION


@dataclass(frozen=True)
class CoreWait:
    """Over one timing window: this process's threads' time on a core, their time runnable but waiting for one."""

    on_cpu_seconds: float
    waited_seconds: float
    wall_seconds: float
    cores: int | None = None  # the cores this process may run on; None: not known (every wait is counted)

    @property
    def others_waited_seconds(self) -> float:
        """The waits other processes can have caused: no more than the core time this process left unused. While
        its own threads held every core (an idle thread pool spinning beside the timed call: ONNX Runtime's default
        two threads on two cores read 0.5 here with nothing else running), a wait is its own."""
        if self.cores is None:
            return self.waited_seconds
        return min(self.waited_seconds, max(0.0, self.cores * self.wall_seconds - self.on_cpu_seconds))

    @property
    def per_cpu_second(self) -> float:
        """Seconds waited for a core because of other processes, per second run (0 when nothing ran)."""
        return self.others_waited_seconds / self.on_cpu_seconds if self.on_cpu_seconds > 0 else 0.0

    @property
    def busy(self) -> bool:
        return self.per_cpu_second > BUSY_ABOVE


def thread_schedstat() -> tuple[int, int] | None:
    """(ns on a core, ns waiting for one), summed over this process's threads now; None when not readable."""
    ran = waited = 0
    found = False
    for path in glob.glob("/proc/self/task/*/schedstat"):
        try:
            with open(path) as f:
                fields = f.read().split()
            ran, waited = ran + int(fields[0]), waited + int(fields[1])
            found = True
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile, or an unexpected format
            continue
    return (ran, waited) if found else None


class CoreWaitMeter:
    """``with CoreWaitMeter() as m: ...`` then ``m.result``: a CoreWait over the block, or None (counters unreadable).
    Threads that end inside the block take their share with them (an undercount, never an overcount)."""

    def __init__(self) -> None:
        self.result: CoreWait | None = None
        self._start: tuple[int, int] | None = None
        self._t0 = 0.0

    def __enter__(self) -> "CoreWaitMeter":
        self._start = thread_schedstat()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.result = self.so_far()

    def so_far(self) -> CoreWait | None:
        """The wait from the block's start until now (None: counters unreadable)."""
        end, wall = thread_schedstat(), time.perf_counter() - self._t0
        if self._start is None or end is None:
            return None
        ran, waited = end[0] - self._start[0], end[1] - self._start[1]
        if ran < 0 or waited < 0:
            return None
        return CoreWait(on_cpu_seconds=ran / 1e9, waited_seconds=waited / 1e9, wall_seconds=wall, cores=usable_cores())


def usable_cores() -> int | None:
    """The cores this process may run on (its affinity), or the machine's; None when not known."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def busy_note(per_cpu_second: float | None) -> str:
    """The words for a busy timing window, or "" (not busy, or not known)."""
    if per_cpu_second is None or per_cpu_second <= BUSY_ABOVE:
        return ""
    return (f"the timed threads waited {per_cpu_second:.2f} s for a core per second they ran (other processes held the "
            "cores): wall-clock figures include that load")
