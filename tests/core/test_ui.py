"""Stage timings: nested stages are counted once, so the summary adds up to the wall time."""

from __future__ import annotations

import types

import vitedge.core.ui as ui
from vitedge.core.ui import StageLog


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


HOSTILE_NAMES = ["[/]", "[bold red]ONE", "\x1b]52;c;cGFzc3dk\x07two", "three", "4", "5", "6", "7", "8", "9"]


def test_strings_from_files_are_printed_literally(tmp_path, capsys):
    """Class names from a model file (and paths) went to rich as markup: '[/]' was exit 3 'MarkupError', '[red]'
    vanished, and an escape sequence (here OSC 52, a clipboard write) reached the terminal as it was."""
    import torch
    from conftest import EXAMPLES
    from helpers.cli import run_vitedge

    checkpoint = torch.load(EXAMPLES / "digits_vit.pt", weights_only=True)
    checkpoint["vitedge"]["class_names"] = HOSTILE_NAMES
    torch.save(checkpoint, tmp_path / "hostile.pt")
    code, text = run_vitedge(["inspect", str(tmp_path / "hostile.pt")])
    assert code == 0, text
    assert "[/], [bold red]ONE, \\x1b]52;c;cGFzc3dk\\x07two" in text.replace("\n", "")
    assert "\x1b" not in text and "\x07" not in text
    log = StageLog()
    with log.stage("data", "calibration set cal[/]x"):
        log.info("read [red]x[/red] \x1b[2J")
    err = capsys.readouterr().err
    assert "calibration set cal[/]x" in err and "read [red]x[/red] \\x1b[2J" in err and "\x1b" not in err
