"""vitedge.validation.core_wait: the timed threads' wait for a core, read from Linux's per-thread scheduler counters,
on real processes (a busy loop alone; the same loop sharing one CPU with three busy processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from vitedge.validation.core_wait import BUSY_ABOVE, CoreWait, CoreWaitMeter, busy_note, thread_schedstat
from vitedge.validation.defaults import DEFAULT_MAX_LATENCY_REGRESSION
from vitedge.validation.document import LatencySection
from vitedge.validation.latency import LatencySettings, LatencyStats, measure_interleaved
from vitedge.validation.report import _md_latency

needs_counters = pytest.mark.skipif(thread_schedstat() is None,
                                    reason="no per-thread scheduler counters here (/proc/self/task/*/schedstat): not Linux")


def _spin(seconds: float) -> None:
    import time

    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


@needs_counters
def test_a_busy_loop_is_counted_on_a_core():
    with CoreWaitMeter() as m:
        _spin(0.3)
    assert m.result is not None
    assert 0.25 <= m.result.on_cpu_seconds <= m.result.wall_seconds * os.cpu_count() + 0.05
    assert m.result.waited_seconds >= 0


CONTENDED = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from vitedge.validation.core_wait import CoreWaitMeter
    os.sched_setaffinity(0, {CPU})
    hogs = [subprocess.Popen([sys.executable, "-c", "import os; os.sched_setaffinity(0, {CPU}); exec('while 1: pass')"])
            for _ in range(3)]
    try:
        time.sleep(0.5)
        with CoreWaitMeter() as m:
            end = time.thread_time() + 0.4
            while time.thread_time() < end:
                pass
    finally:
        for h in hogs:
            h.kill()
    print(json.dumps([m.result.on_cpu_seconds, m.result.waited_seconds, m.result.per_cpu_second, m.result.busy]))
""")


@needs_counters
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="os.sched_setaffinity is Linux-only")
def test_sharing_one_cpu_with_three_busy_processes_reads_busy():
    """Pinned to one CPU with three busy loops, a thread gets about a quarter of it: it waits about three seconds for
    the core per second it runs, past the busy line whatever else the machine does."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    out = subprocess.run([sys.executable, "-c", CONTENDED.replace("{CPU}", "{%d}" % cpu)], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    ran, waited, per_cpu_second, busy = json.loads(out.strip().splitlines()[-1])
    assert busy and per_cpu_second > 1.5, (ran, waited)  # the core's time it did not use went to the busy loops


BUSY_TIMING = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from vitedge.validation.latency import LatencySettings, measure_interleaved
    os.sched_setaffinity(0, {CPU})
    hogs = [subprocess.Popen([sys.executable, "-c", "import os; os.sched_setaffinity(0, {CPU}); exec('while 1: pass')"])
            for _ in range(3)]

    def spin():
        end = time.thread_time() + 0.002
        while time.thread_time() < end:
            pass

    try:
        time.sleep(0.5)
        # rel_tol 0: medians that must match exactly never settle, so only the cap or a busy window ends the timing
        stats = measure_interleaved({"a": spin, "b": spin}, 1, LatencySettings(warmup=1, min_iters=8, min_seconds=0.02,
                                                                              max_seconds=120.0, rel_tol=0.0))
    finally:
        for h in hogs:
            h.kill()
    print(json.dumps({k: [s.iterations, s.core_wait, s.stable, sum(s.samples_ms)] for k, s in stats.items()}))
""")


@needs_counters
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="os.sched_setaffinity is Linux-only")
def test_interleaved_timing_on_a_busy_cpu_stops_at_its_minimums():
    """Sharing one CPU with three busy loops, medians that cannot settle are timed only until the minimums are met
    (8 iterations, 20 ms of timed runs each), not to the 120 s cap: the window reads busy."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    out = subprocess.run([sys.executable, "-c", BUSY_TIMING.replace("{CPU}", "{%d}" % cpu)], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    for iterations, wait, stable, timed_ms in json.loads(out.strip().splitlines()[-1]).values():
        assert wait > BUSY_ABOVE and not stable
        assert 8 <= iterations <= 20 and timed_ms >= 20.0  # the minimums, plus at most the rounds that met them


def test_a_wait_while_the_process_held_every_core_is_its_own():
    """Waits count against other processes only up to the core time this process left unused."""
    assert CoreWait(2.0, 1.0, 1.0, cores=2).per_cpu_second == 0.0  # its own threads filled both cores
    assert CoreWait(1.9, 1.0, 1.0, cores=2).per_cpu_second == pytest.approx(0.1 / 1.9)
    assert CoreWait(1.5, 1.5, 1.0, cores=2).per_cpu_second == pytest.approx(0.5 / 1.5)  # half a core went elsewhere
    assert CoreWait(0.25, 0.75, 1.0, cores=1).per_cpu_second == pytest.approx(3.0)  # a quarter of one core: others'
    assert CoreWait(2.0, 1.0, 1.0).per_cpu_second == pytest.approx(0.5)  # cores unknown: every wait counts
    assert not CoreWait(2.0, 1.0, 1.0, cores=2).busy and CoreWait(1.5, 1.5, 1.0, cores=2).busy


def test_the_busy_line_is_what_can_stretch_a_figure_past_compares_default_limit():
    assert BUSY_ABOVE == DEFAULT_MAX_LATENCY_REGRESSION == 0.1
    assert not CoreWait(1.0, 0.1, 1.1).busy and CoreWait(1.0, 0.11, 1.11).busy
    assert CoreWait(0.0, 5.0, 5.0).per_cpu_second == 0.0  # nothing ran: nothing to say
    assert busy_note(None) == "" and busy_note(BUSY_ABOVE) == ""
    assert "waited 3.20 s for a core per second they ran" in busy_note(3.2)


@needs_counters
def test_interleaved_timing_records_the_wait_of_its_window():
    stats = measure_interleaved({"a": lambda: _spin(0.001), "b": lambda: _spin(0.001)}, 1,
                                LatencySettings(warmup=1, min_iters=4, min_seconds=0.0, max_seconds=0.2))
    assert stats["a"].core_wait is not None and stats["a"].core_wait == stats["b"].core_wait >= 0
    assert "core_wait" in stats["a"].to_dict()


def _section(wait_b1: float | None) -> LatencySection:
    def row(p50: float, b: int, wait: float | None) -> LatencyStats:
        return LatencyStats(b, 40, p50, p50, p50, p50, b * 1000.0 / p50, True, (), wait)
    return LatencySection(measured=True, method="interleaved", fp32={"1": row(2.0, 1, wait_b1), "8": row(9.0, 8, 0.03)},
                          int8={"1": row(1.0, 1, wait_b1), "8": row(6.0, 8, 0.03)}, speedup={"1": 2.0, "8": 1.5})


def test_the_report_says_a_busy_window_and_only_then():
    busy = "\n".join(_md_latency(_section(2.4), "#"))
    assert "**A busy machine:**" in busy and "2.40 s at batch 1" in busy and "batch 8" not in busy.split("**A busy")[1]
    for quiet in (0.05, None):
        assert "busy machine" not in "\n".join(_md_latency(_section(quiet), "#"))
