"""Interleaved timing (vitedge.validation.latency), on a fake clock: the run after a switch
between models is not timed (settle), rounds are whole chunks, and timing stops once
every median is stable, or, in a busy window, once the minimums are met. The window's core wait
is a fixed reading here (the real counters: tests/validation/test_core_wait.py)."""

from __future__ import annotations

import types

import pytest

from vitedge.validation import latency
from vitedge.validation.core_wait import CoreWait
from vitedge.validation.latency import (
    LatencySettings,
    measure_interleaved,
    measure_latency,
)

SWITCH_S = 0.1  # what a run costs right after the other model ran (its threads still spinning)
RUN_S = 0.001  # what it costs otherwise


class FakeClock:
    """perf_counter for latency.py; each model's run advances it, by more after a switch."""

    def __init__(self):
        self.now = 0.0
        self.last = None
        self.calls: dict[str, int] = {}

    def perf_counter(self) -> float:
        return self.now

    def run(self, name: str):
        def run():
            self.now += SWITCH_S if self.last not in (None, name) else RUN_S
            self.last = name
            self.calls[name] = self.calls.get(name, 0) + 1

        return run


class FixedWaitMeter:
    """CoreWaitMeter with a fixed reading: ``waited`` seconds for a core per second on one."""

    waited = 0.0
    reads = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.result = self.so_far()

    def so_far(self) -> CoreWait:
        FixedWaitMeter.reads += 1
        return CoreWait(on_cpu_seconds=1.0, waited_seconds=FixedWaitMeter.waited, wall_seconds=1.0)


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(latency, "time", types.SimpleNamespace(perf_counter=c.perf_counter))
    monkeypatch.setattr(latency, "CoreWaitMeter", FixedWaitMeter)
    monkeypatch.setattr(FixedWaitMeter, "waited", 0.0)  # a quiet machine unless a test says otherwise
    monkeypatch.setattr(FixedWaitMeter, "reads", 0)
    return c


# 12 samples of >= 1 ms each, stable: three rounds of 4 when nothing disturbs the medians
SETTINGS = LatencySettings(warmup=2, min_iters=12, min_seconds=0.005, max_seconds=1000.0, rel_tol=0.05, chunk=4)
ROUNDS = 3


def _rounds(clock, name, settings, settle):
    timed_and_settling = clock.calls[name] - settings.warmup
    assert timed_and_settling % (settle + settings.chunk) == 0
    return timed_and_settling // (settle + settings.chunk)


def test_first_run_after_a_switch_is_not_timed(clock):
    assert SETTINGS.settle == 1  # the default
    stats = measure_interleaved({"fp32": clock.run("fp32"), "int8": clock.run("int8")}, 1, SETTINGS)
    for name, s in stats.items():
        assert s.samples_ms == pytest.approx([1.0] * len(s.samples_ms))
        assert s.stable and s.p50_ms == pytest.approx(1.0) and s.p99_ms == pytest.approx(1.0)
        assert _rounds(clock, name, SETTINGS, settle=1) == ROUNDS
        assert s.iterations == len(s.samples_ms) == SETTINGS.chunk * ROUNDS
    assert "1 untimed run(s) at each switch" in SETTINGS.describe()


def test_without_settle_the_switch_is_timed(clock):
    settings = LatencySettings(**{**SETTINGS.to_dict(), "settle": 0})
    stats = measure_interleaved({"fp32": clock.run("fp32"), "int8": clock.run("int8")}, 1, settings)
    for name, s in stats.items():
        rounds = _rounds(clock, name, settings, settle=0)
        assert rounds == ROUNDS and s.iterations == len(s.samples_ms) == settings.chunk * rounds
        # each round's first sample ran right after the other model: 100 ms; the rest 1 ms
        expected = ([SWITCH_S * 1000] + [1.0] * (settings.chunk - 1)) * rounds
        assert s.samples_ms == pytest.approx(expected)
        assert max(s.samples_ms) == pytest.approx(100.0) and s.p50_ms == pytest.approx(1.0)


def test_settle_is_skipped_when_one_model_is_timed(clock):
    stats = measure_interleaved({"int8": clock.run("int8")}, 8, SETTINGS)["int8"]
    assert _rounds(clock, "int8", SETTINGS, settle=0) == ROUNDS  # no untimed runs between rounds
    assert stats.iterations == SETTINGS.chunk * ROUNDS and stats.samples_ms == pytest.approx([1.0] * stats.iterations)
    assert stats.batch == 8 and stats.throughput == pytest.approx(8000.0)


def test_measure_latency_alone(clock):
    run = clock.run("model")
    stats = measure_latency(lambda batch: run(), types.SimpleNamespace(shape=(2, 3, 32, 32)), warmup=3, min_iters=10,
                            min_seconds=0.001, max_seconds=1000.0)
    assert clock.calls["model"] == 3 + stats.iterations and stats.iterations % 5 == 0 and stats.iterations >= 10
    assert stats.stable and stats.p50_ms == pytest.approx(1.0)


def test_cap_stops_an_unstable_measurement(clock):
    """Medians that never settle: timing ends at max_seconds (fake) and says it was not stable."""
    state = {"n": 0}

    def drifting():
        state["n"] += 1
        clock.now += 0.001 * state["n"]  # every run slower than the last

    settings = LatencySettings(warmup=1, min_iters=4, min_seconds=0.0, max_seconds=2.0, rel_tol=0.01, chunk=4)
    stats = measure_interleaved({"drift": drifting}, 1, settings)["drift"]
    assert not stats.stable and stats.iterations % 4 == 0
    timed = clock.now - 0.001  # all but the warm-up run
    assert sum(stats.samples_ms) / 1000.0 == pytest.approx(timed) and timed >= settings.max_seconds  # ran until the cap


def _drifting(clock):
    state = {"n": 0}

    def run():
        state["n"] += 1
        clock.now += 0.001 * state["n"]  # every run slower than the last: the medians never settle

    return run


@pytest.mark.parametrize("waited", [0.0, 0.1])
def test_a_quiet_window_times_on_to_the_cap(clock, waited):
    """At or under the busy line (0.1 s waited per second run) an unsettled median is timed on until the cap."""
    FixedWaitMeter.waited = waited
    settings = LatencySettings(warmup=1, min_iters=8, min_seconds=0.0, max_seconds=2.0, rel_tol=0.01, chunk=4)
    stats = measure_interleaved({"drift": _drifting(clock)}, 1, settings)["drift"]
    assert not stats.stable and sum(stats.samples_ms) / 1000.0 >= settings.max_seconds
    assert stats.core_wait == pytest.approx(waited)


def test_a_busy_window_stops_once_the_minimums_are_met(clock):
    """Past the busy line, timing ends at the first round that meets min_iters and min_seconds for every model:
    the figures are marked busy (core_wait) and not stable, and no round is timed after that."""
    FixedWaitMeter.waited = 0.8
    settings = LatencySettings(warmup=1, min_iters=8, min_seconds=0.0115, max_seconds=2.0, rel_tol=0.01, chunk=4)
    stats = measure_interleaved({"fp32": _drifting(clock), "int8": clock.run("int8")}, 1, settings)
    for s in stats.values():
        assert s.core_wait == pytest.approx(0.8) and s.iterations >= settings.min_iters
    # int8's runs take 1 ms: 8 iterations by round 2, 11.5 ms of timed runs in round 3 (the drifting one's, sooner)
    assert stats["fp32"].iterations == stats["int8"].iterations == 12 and not stats["fp32"].stable
    assert sum(stats["fp32"].samples_ms) < settings.max_seconds * 1000.0
    assert "in a busy window" in settings.describe() and "0.1 s for a core" in settings.describe()


def test_a_window_is_read_only_once_the_minimums_are_met(clock):
    """The counters are read between rounds only when stopping could follow (and once at the end)."""
    settings = LatencySettings(warmup=1, min_iters=12, min_seconds=0.0, max_seconds=1000.0, rel_tol=0.05, chunk=4)
    measure_interleaved({"fp32": clock.run("fp32"), "int8": clock.run("int8")}, 1, settings)  # stable at round 3
    assert FixedWaitMeter.reads == 1  # the end's only: round 3 met the minimums and the medians together
