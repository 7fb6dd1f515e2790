"""Stage timings: nested stages are counted once, so the summary adds up to the wall time."""

from __future__ import annotations

import types

import vitedge.ui as ui
from vitedge.ui import StageLog


def test_nested_stage_time_is_not_counted_twice(monkeypatch):
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(ui, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    log = StageLog(quiet=True)
    with log.stage("calibrate", "x"):
        clock.now += 3.0
    for _ in range(2):  # two targets: build 1 s of its own around validate 4 s
        with log.stage("build", "target"):
            clock.now += 0.5
            with log.stage("validate", "target"):
                clock.now += 4.0
            clock.now += 0.5
    assert log.timings == {"calibrate": 3.0, "build": 2.0, "validate": 8.0}
    assert sum(log.timings.values()) == clock.now == 13.0
    assert log.counts == {"calibrate": 1, "build": 2, "validate": 2}


def test_a_failing_stage_still_records_its_time(monkeypatch):
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(ui, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    log = StageLog(quiet=True)
    try:
        with log.stage("build", "target"):
            with log.stage("validate", "target"):
                clock.now += 2.0
                raise RuntimeError("gate")
    except RuntimeError:
        pass
    assert log.timings == {"build": 0.0, "validate": 2.0}
