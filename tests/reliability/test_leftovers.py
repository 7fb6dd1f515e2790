"""vitedge deletes only what it provably wrote (issue #26 item 2): its temporary names carry the token
`vitedge` and the PID of the run that made them, a later run removes only such names whose PID is dead and
which this user owns, and a "PID" too large to be one is not ours (it used to be an OverflowError, exit 3).

Each case runs a real command beside look-alike entries a user made and asserts the exit code, that stderr
holds no error, and which entries survive."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import EXAMPLES
from rel_cli import cli, snapshot

DIGITS = EXAMPLES / "digits_vit.pt"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _entries(folder: Path, names: list[str]) -> list[Path]:
    made = []
    for i, name in enumerate(names):
        p = folder / name
        if i % 2:
            p.mkdir()
            (p / "inside.txt").write_text("the user's")
        else:
            p.write_text("the user's")
        made.append(p)
    return made


def _user_lookalikes(stem: str, dead: int) -> list[str]:
    """Names a user (or another tool) may use beside an output, which old cleanup rules matched."""
    return [f".{stem}.old-3", f".{stem}.1.2.partial", f".{stem}.{dead}.abc.partial", f".{stem}.old-{dead}",
            f".{stem}.vitedge-{dead}-short.partial", f"{stem}.vitedge-old-{dead}"]


def _huge_pids(stem: str) -> list[str]:
    return [f".{stem}.vitedge-99999999999999999999-abcdefgh.partial", f".{stem}.vitedge-9999999999-abcdefgh.partial",
            f".{stem}.vitedge-old-99999999999999999999", f".{stem}.99999999999999999999.abc.partial",
            f".{stem}.old-99999999999999999999"]


def _no_error(run) -> None:
    assert run.code == 0, run.err[-2000:]
    assert "Traceback" not in run.err and not [ln for ln in run.lines if "error" in ln.lower()], run.err


@pytest.mark.parametrize("names", ["look-alikes", "huge pids"])
def test_export_leaves_every_entry_it_did_not_write(tmp_path, names):
    dead = _dead_pid()
    kept = _entries(tmp_path, _user_lookalikes("m.onnx", dead) if names == "look-alikes" else _huge_pids("m.onnx"))
    before = snapshot(tmp_path)
    run = cli("export", DIGITS, "-o", tmp_path / "m.onnx")
    _no_error(run)
    assert all(p.exists() for p in kept)
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if not k.endswith("/m.onnx")} == before


def test_init_removes_what_a_killed_run_of_vitedge_left_and_nothing_else(tmp_path):
    dead, alive = _dead_pid(), os.getppid()
    ours = _entries(tmp_path, [f".vitedge.toml.vitedge-{dead}-abc_1234.partial", f".vitedge.toml.vitedge-old-{dead}"])
    live = _entries(tmp_path, [f".vitedge.toml.vitedge-{alive}-abc_1234.partial"])
    theirs = _entries(tmp_path, _user_lookalikes("vitedge.toml", dead) + _huge_pids("vitedge.toml"))
    run = cli("init", DIGITS, cwd=tmp_path)
    _no_error(run)
    assert not any(p.exists() for p in ours) and all(p.exists() for p in live + theirs)


def test_an_entry_named_like_ours_but_owned_by_another_user_is_left(tmp_path):
    if not hasattr(os, "getuid") or os.getuid() != 0:
        pytest.skip("giving a file to another user needs root")
    dead = _dead_pid()
    [planted] = _entries(tmp_path, [f".vitedge.toml.vitedge-{dead}-abc_1234.partial"])
    os.chown(planted, 4242, 4242)
    _no_error(cli("init", DIGITS, cwd=tmp_path))
    assert planted.exists()


def test_validate_report_dir_leaves_the_users_entries(bundle, tmp_path):
    dead = _dead_pid()
    reports = tmp_path / "reports"
    reports.mkdir()
    kept = _entries(reports, _user_lookalikes("validation.json", dead) + _huge_pids("summary.md"))
    run = cli("validate", bundle, "--no-latency", "--no-sensitivity", "-q", "--report-dir", reports / "r")
    assert run.code == 0, run.err[-2000:]
    assert all(p.exists() for p in kept) and (reports / "r" / "validation.json").is_file()


def test_build_cleans_only_its_own_work_folders_in_tmpdir(tmp_path, monkeypatch):
    dead = _dead_pid()
    work = tmp_path / "tmp"
    work.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(work))
    ours = _entries(work, [f"vitedge-build-{dead}-abcd_123", f"vitedge-calibrate-{dead}-abcd_123", f"vitedge-export-{dead}-abcd_123"])
    theirs = _entries(work, [f"vitedge-build-{dead}-mine", "vitedge-build-99999999999999999999-abcd_123",
                             f"vitedge-notes-{dead}-abcd_123", f"build-{dead}-abcd_123"])
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")  # a user folder: refused after the cleanup, before any work
    run = cli("build", DIGITS, "-t", "onnx", "--calib", EXAMPLES.parent / "calibration" / "digits" / "calib", "-o", out, "--force",
              "-q", "--no-latency")
    assert run.code == 2 and "did not write" in run.lines[-1], run.err
    assert not any(p.exists() for p in ours) and all(p.exists() for p in theirs)
    assert (out / "mine.txt").read_text() == "keep"


def test_temporary_names_carry_the_token_and_the_pid():
    from vitedge.files.swap import debris_pid, old_name, partial_prefix, work_prefix

    pid = os.getpid()
    assert partial_prefix(Path("a/b.onnx")) == f".b.onnx.vitedge-{pid}-"
    assert old_name(Path("bundle")) == f".bundle.vitedge-old-{pid}"
    assert work_prefix("build") == f"vitedge-build-{pid}-"
    with tempfile.TemporaryDirectory() as d:
        fd, name = tempfile.mkstemp(prefix=partial_prefix(Path(d) / "x"), suffix=".partial", dir=d)
        os.close(fd)
        assert debris_pid(Path(name).name) == pid  # what mkstemp really makes is recognised
    assert debris_pid(".x.vitedge-99999999999999999999-abcdefgh.partial") is None
    assert debris_pid(".x.vitedge-2147483648-abcdefgh.partial") is None  # one past the largest pid_t
    assert debris_pid(".x.vitedge-0-abcdefgh.partial") is None
    assert debris_pid(".x.1.2.partial") is None and debris_pid(".x.old-3") is None
