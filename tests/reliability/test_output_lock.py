"""One writer per output, for every command that writes (issue 26 items 2 and 4, vitedge/files/lock.py).

A live process holds the output's lock (through vitedge.files.lock itself, in a child process): each writer
(init, export, calibrate, export-config, engine, validate --report-dir, build, build-matrix) exits 2 at once
with one line naming the holder's pid, and nothing in the case's folder changes. The lock is taken before
any work, even before the replace rule and before the model is looked at. Two real writers started one
after the other into one output: the second is refused while the first completes its output whole.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CALIB_DIR, EXAMPLES, VAL_DIR
from rel_cli import assert_one_line, cli, debris, holds_lock, snapshot

from vitedge.files.lock import lock_path

DIGITS = EXAMPLES / "digits_vit.pt"
_HOLDER = ("import sys\nfrom pathlib import Path\nfrom vitedge.files.lock import output_locks\n"
           "with output_locks([Path(sys.argv[1])]):\n    print('held', flush=True)\n    sys.stdin.read()\n")


class Holder:
    """A live process holding the lock of ``output`` until closed."""

    def __init__(self, output: Path):
        self.proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(output)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "held"
        self.pid = self.proc.pid

    def close(self) -> None:
        self.proc.communicate(input="", timeout=60)


def _matrix(root: Path) -> Path:
    p = root / "matrix.toml"
    p.write_text("\n".join([f"out = {json.dumps(str(root / 'mx'))}", "[[models]]", f"path = {json.dumps(str(DIGITS))}",
                            f"calib = {json.dumps(str(CALIB_DIR))}", 'targets = ["onnx"]']) + "\n")
    return p


# writer -> (the output it locks, its argv, the flag its message names); `b` is a bundle copy in `t`
WRITERS = {
    "init": lambda t, b: (t / "vitedge.toml", ["init", DIGITS, "-o", t / "vitedge.toml"], "-o"),
    "init-existing-no-force": lambda t, b: (b / "manifest.json", ["init", DIGITS, "-o", b / "manifest.json"], "-o"),
    "export": lambda t, b: (t / "m.onnx", ["export", DIGITS, "-o", t / "m.onnx"], "-o"),
    "export-missing-model": lambda t, b: (t / "m.onnx", ["export", t / "nope.pt", "-o", t / "m.onnx"], "-o"),
    "calibrate": lambda t, b: (t / "m.int8.onnx", ["calibrate", DIGITS, "--calib", CALIB_DIR, "-o", t / "m.int8.onnx", "-q",
                                                   "--cache-dir", t / "cache"], "-o"),
    "calibrate-missing-model": lambda t, b: (t / "m.int8.onnx", ["calibrate", t / "nope.pt", "--calib", CALIB_DIR, "-o",
                                                                 t / "m.int8.onnx"], "-o"),
    "export-config-deepstream": lambda t, b: (t / "ds", ["export-config", "--for", "deepstream", b, "-o", t / "ds"], "-o"),
    "export-config-triton-default": lambda t, b: (t / "bundle-triton", ["export-config", "--for", "triton", b], "-o"),
    "export-config-force-over-user-folder": lambda t, b: (t / "mine", ["export-config", "--for", "triton", b, "-o", t / "mine",
                                                                       "--force"], "-o"),
    "engine": lambda t, b: (b, ["engine", b, "--val", VAL_DIR], "BUNDLE"),
    "validate-report-dir": lambda t, b: (t / "rep", ["validate", b, "--no-latency", "--no-sensitivity", "--report-dir", t / "rep",
                                                     "-q", "--cache-dir", t / "cache"], "--report-dir"),
    "build": lambda t, b: (t / "out", ["build", DIGITS, "-t", "onnx", "--calib", CALIB_DIR, "-o", t / "out", "-q", "--no-latency",
                                       "--cache-dir", t / "cache"], "-o"),
    "build-matrix": lambda t, b: (t / "mx", ["build-matrix", _matrix(t), "--sequential", "-q"], "-o"),
}


@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_live_holder_refuses_every_writer_before_any_work(writer, bundle, tmp_path):
    """`bundle` (the conftest fixture) is a fresh copy at tmp_path/bundle; the holder is a live process of this user."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's own folder\n")
    output, args, flag = WRITERS[writer](tmp_path, bundle)
    existed = os.path.lexists(output)
    holder = Holder(output)
    try:
        before = snapshot(tmp_path)
        run = cli(*args, cwd=tmp_path)
        assert_one_line(run, 2, f"another vitedge run (pid {holder.pid}) is writing {output}", f"choose another {flag}")
        assert snapshot(tmp_path) == before and debris(tmp_path) == []
        assert os.path.lexists(output) == existed
        assert not (tmp_path / "cache").exists()  # no work: nothing calibrated or cached
    finally:
        holder.close()
    assert not lock_path(output).exists()  # the holder removed its lock file as it ended


RACES = {
    "export": lambda t: (t / "m.onnx", ["export", DIGITS, "-o", t / "m.onnx"]),
    "calibrate": lambda t: (t / "m.int8.onnx", ["calibrate", DIGITS, "--calib", CALIB_DIR, "-o", t / "m.int8.onnx", "-q",
                                                "--cache-dir", t / "cache"]),
}


@pytest.mark.parametrize("writer", list(RACES))
def test_two_real_writers_into_one_output_the_second_is_refused(writer, tmp_path):
    output, args = RACES[writer](tmp_path)
    first = subprocess.Popen([sys.executable, "-m", "vitedge", *map(str, args)], cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        if not holds_lock(first, output):
            out, err = first.communicate()
            pytest.skip(f"the first {writer} ended (exit {first.returncode}) before this test saw it hold the lock")
        second = cli(*args, "--force", cwd=tmp_path)
        assert_one_line(second, 2, f"another vitedge run (pid {first.pid}) is writing {output}")
        out, err = first.communicate(timeout=600)
        assert first.returncode == 0, err[-2000:]
    finally:
        if first.poll() is None:
            first.kill()
    import onnx

    onnx.checker.check_model(str(output))  # the first's output, whole
    assert debris(tmp_path) == [] and not lock_path(output).exists()


def test_engine_never_completes_a_bundle_that_holds_its_own_val_data(bundle, tmp_path):
    """engine writes BUNDLE in place: --val inside it would be replaced with the bundle (the one replace rule)."""
    val = bundle / "val"
    val.mkdir()
    (val / "note.txt").write_text("the user's data inside the bundle\n")
    before = snapshot(tmp_path)
    run = cli("engine", bundle, "--val", val, cwd=tmp_path)
    assert_one_line(run, 2, f"BUNDLE {bundle} holds {val}, an input of this run")
    assert snapshot(tmp_path) == before and debris(tmp_path) == [] and not lock_path(bundle).exists()


LONG = {  # an output name that fits the file system (250 bytes) but leaves no room for `.NAME.vitedge-PID-XXXXXXXX.partial`
    "export": lambda t, b, n: ["export", DIGITS, "-o", t / f"{n}.onnx"],
    "calibrate": lambda t, b, n: ["calibrate", DIGITS, "--calib", CALIB_DIR, "-o", t / f"{n}.onnx", "--cache-dir", t / "cache"],
    "init": lambda t, b, n: ["init", DIGITS, "-o", t / f"{n}.toml"],
    "export-config": lambda t, b, n: ["export-config", "--for", "triton", b, "-o", t / f"{n}.trtn"],
    "build": lambda t, b, n: ["build", DIGITS, "-t", "onnx", "--calib", CALIB_DIR, "-o", t / f"{n}.dirx", "--cache-dir", t / "cache"],
    "validate-report-dir": lambda t, b, n: ["validate", b, "--no-latency", "--report-dir", t / f"{n}.repx"],
}


@pytest.mark.parametrize("writer", list(LONG))
def test_an_output_name_without_room_for_vitedge_temporaries_is_refused_up_front(writer, bundle, tmp_path):
    """It was an OSError "File name too long" (exit 3) from the lock or the .partial file beside the output."""
    before = snapshot(tmp_path)
    run = cli(*LONG[writer](tmp_path, bundle, "a" * 245), cwd=tmp_path)
    assert_one_line(run, 2, "its name is 250 bytes", "choose a name of at most 218 bytes")
    assert snapshot(tmp_path) == before and debris(tmp_path) == [] and not (tmp_path / "cache").exists()


def test_an_output_name_at_the_limit_is_written(tmp_path):
    out = tmp_path / ("a" * 213 + ".toml")  # 218 bytes: the longest that leaves room
    run = cli("init", DIGITS, "-o", out, cwd=tmp_path)
    assert run.code == 0, run.err
    assert out.is_file() and debris(tmp_path) == [] and not lock_path(out).exists()


@pytest.mark.parametrize("writer", ["engine", "build", "export-config"])
def test_a_symlink_where_a_folder_output_goes_is_refused_and_left_alone(writer, bundle, tmp_path):
    """A link to a bundle is neither replaced by a copy (engine swapped the link itself for a folder) nor written through."""
    link = tmp_path / "link"
    elsewhere = tmp_path / "elsewhere"  # export-config: a user's folder (a link to the bundle it reads is refused as inside it)
    elsewhere.mkdir()
    (elsewhere / "mine.txt").write_text("the user's\n")
    link.symlink_to(elsewhere if writer == "export-config" else bundle, target_is_directory=True)
    args = {"engine": ["engine", link],
            "build": ["build", DIGITS, "-t", "onnx", "--calib", CALIB_DIR, "-o", link, "--force", "--cache-dir", tmp_path / "cache"],
            "export-config": ["export-config", "--for", "triton", bundle, "-o", link, "--force"]}[writer]
    before = snapshot(tmp_path)
    run = cli(*args, cwd=tmp_path)
    assert_one_line(run, 2, "is a symlink")
    assert link.is_symlink() and snapshot(tmp_path) == before and debris(tmp_path) == [] and not (tmp_path / "cache").exists()


PLANTED = {  # what someone left where the lock of `-o m.onnx` goes
    "folder": ("is a folder, not vitedge's lock file", lambda p: p.mkdir()),
    "fifo": ("is not a regular file, not vitedge's lock file", lambda p: os.mkfifo(p)),
    "symlink": ("is a symlink, not vitedge's lock file", lambda p: p.symlink_to(p.parent / "mine.txt")),
}


@pytest.mark.parametrize("what", list(PLANTED))
def test_something_planted_where_the_lock_goes_is_refused_and_left_alone(what, tmp_path):
    """A folder or FIFO there was exit 3 (IsADirectoryError, EINVAL from flock); a symlink is not followed."""
    (tmp_path / "mine.txt").write_text("the user's\n")
    out = tmp_path / "m.onnx"
    fragment, plant = PLANTED[what]
    plant(lock_path(out))
    before = snapshot(tmp_path)
    run = cli("export", DIGITS, "-o", out, cwd=tmp_path)
    assert_one_line(run, 2, fragment, "remove it, or choose another -o")
    assert snapshot(tmp_path) == before and os.path.lexists(lock_path(out)) and not out.exists() and debris(tmp_path) == []


UNWRITABLE = {  # an output where nothing can be created, even by root: a folder of the proc file system
    "build": lambda t, o: ["build", DIGITS, "-t", "onnx", "--calib", CALIB_DIR, "-o", o, "--cache-dir", t / "cache"],
    "export": lambda t, o: ["export", DIGITS, "-o", o / "m.onnx"],
    "init": lambda t, o: ["init", DIGITS, "-o", o / "vitedge.toml"],
}


@pytest.mark.skipif(not os.path.isfile("/proc/self/stat"), reason="needs Linux's /proc, where no file can be created")
@pytest.mark.parametrize("writer", list(UNWRITABLE))
def test_an_output_that_cannot_be_created_is_refused_in_one_line(writer, tmp_path):
    """Its lock could not be created: an OSError left the lock code as exit 3 ("internal error: FileNotFoundError")."""
    out = Path("/proc") / f"vitedge-test-{os.getpid()}"
    before = snapshot(tmp_path)
    run = cli(*UNWRITABLE[writer](tmp_path, out), cwd=tmp_path)
    assert_one_line(run, 2, "cannot be written", "choose another -o")
    assert snapshot(tmp_path) == before and not (tmp_path / "cache").exists()
