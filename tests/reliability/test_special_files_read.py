"""Special files are never read as files, and data is only read (issue 46, class 6). What vitedge reads where a small
regular file belongs (a bundle's swap journal, manifest.sig, a config named with --config, matrix.toml) is opened only
as a regular file within a size bound (vitedge/files/safefile.py): a FIFO there used to hang `validate` and
`runtime.load`, and a huge file or a device to be read whole. A data folder vitedge cannot read is said to be
unreadable, not reported as a place it failed to write ("choose another -o"). Each case asserts the exit code, the
one line and that nothing changed; the cases that could hang run in a child process with a timeout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CALIB_DIR, EXAMPLES, REPO
from rel_cli import assert_one_line, cli, debris, snapshot

HANG = 120  # seconds: far above what these runs take; a run blocked on a FIFO never ends


def _child(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG,
                          env=dict(os.environ, PYTHONPATH=str(REPO), **(env or {})))


def _vitedge(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vitedge", *map(str, args)], capture_output=True, text=True, timeout=HANG,
                          env=dict(os.environ, PYTHONPATH=str(REPO), **(env or {})))


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


@pytest.fixture
def copied(built_bundle, tmp_path) -> Path:
    dst = tmp_path / "bundle"
    shutil.copytree(built_bundle, dst)
    return dst


def _journal(bundle: Path) -> Path:
    return bundle.with_name(f".{bundle.name}.vitedge-swap.json")


def _plant(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero link":
        path.symlink_to("/dev/zero")
    elif kind == "sparse 1 GB":
        with open(path, "wb") as f:
            f.truncate(1 << 30)  # a regular file of 1 GB of zeros that takes no disk
    elif kind == "folder":
        path.mkdir()


SAYS = {"fifo": "is a FIFO (named pipe), not a regular file", "dev-zero link": "is a character device, not a regular file",
        "sparse 1 GB": "is 1073741824 bytes, over the", "folder": "is a folder, not a regular file"}


@pytest.mark.parametrize("kind", ["fifo", "dev-zero link", "sparse 1 GB", "folder"])
def test_a_swap_journal_that_is_not_a_small_file_is_ignored_by_validate(copied, kind):
    journal = _journal(copied)
    _plant(journal, kind)
    before = snapshot(copied)
    run = _vitedge("validate", "-q", copied, "--no-latency", "--no-sensitivity", "--report-dir", copied.parent / "r")
    assert run.returncode == 0, run.stderr[-2000:]
    notes = [ln for ln in _lines(run.stderr) if "swap journal" in ln]
    assert len(notes) == 1 and f"ignoring unreadable swap journal {journal}" in notes[0] and SAYS[kind] in notes[0], run.stderr
    assert snapshot(copied) == before and os.path.lexists(journal)  # the bundle and the planted entry as they were


@pytest.mark.parametrize("kind", ["fifo", "sparse 1 GB"])
def test_runtime_load_does_not_block_on_a_journal(copied, kind):
    journal = _journal(copied)
    _plant(journal, kind)
    run = _child(f"from vitedge.runtime import load\nm = load({str(copied)!r})\nprint(m.target)")
    assert run.returncode == 0 and run.stdout.strip() == "onnx", run.stderr[-2000:]
    assert SAYS[kind] in run.stderr


@pytest.mark.parametrize("kind", ["fifo", "dev-zero link", "sparse 1 GB"])
def test_a_signature_that_is_not_a_small_file_is_refused_in_one_line(copied, kind):
    sig = copied / "manifest.sig"
    _plant(sig, kind)
    before = snapshot(copied)
    run = _vitedge("validate", "-q", copied, "--no-latency", env={"VITEDGE_SIGNING_KEY": "k" * 32})
    assert run.returncode == 2 and len(_lines(run.stderr)) == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]
    line = _lines(run.stderr)[0]
    assert f"{sig} {SAYS[kind]}" in line and "not a signature vitedge wrote" in line, line
    assert snapshot(copied) == before


@pytest.mark.parametrize("flag", ["--config", "matrix"])
def test_a_fifo_named_as_a_config_is_refused_without_blocking(tmp_path, flag):
    fifo = tmp_path / ("c.toml" if flag == "--config" else "matrix.toml")
    os.mkfifo(fifo)
    args = ["config", "--config", fifo] if flag == "--config" else ["build-matrix", fifo]
    run = _vitedge(*args)
    assert run.returncode == 2 and len(_lines(run.stderr)) == 1, run.stderr[-2000:]
    assert f"{fifo} is a FIFO (named pipe), not a regular file" in run.stderr


@pytest.mark.parametrize("command", ["build", "validate"])
def test_a_data_folder_vitedge_cannot_read_is_named_as_read_not_written(tmp_path, built_bundle, command):
    proc = Path("/proc")
    if not any(not os.access(p, os.R_OK) for p in (proc / "1" / "cwd", proc / "1" / "root")):
        pytest.skip("this machine lets the test read /proc/1/cwd")
    if command == "build":
        args = ["build", "-q", EXAMPLES / "digits_vit.pt", "-t", "onnx", "--calib", proc, "-o", tmp_path / "b", "--no-latency"]
    else:
        args = ["validate", "-q", built_bundle, "--data", proc, "--no-latency", "--report-dir", tmp_path / "r"]
    before = snapshot(tmp_path)
    line = assert_one_line(cli(*args), 2, f"{proc}: cannot read /proc/", "vitedge only reads data")
    assert "writing" not in line and "-o" not in line
    assert snapshot(tmp_path) == before and not debris(tmp_path) and not (tmp_path / "b").exists()


def test_a_data_folder_with_a_link_into_an_unreadable_place_names_it(tmp_path):
    if os.access("/proc/1/cwd", os.R_OK):
        pytest.skip("this machine lets the test read /proc/1/cwd")
    data = tmp_path / "calib"
    shutil.copytree(CALIB_DIR, data)
    before = snapshot(tmp_path)
    (data / "elsewhere").symlink_to("/proc/1/cwd")
    run = cli("calibrate", "-q", EXAMPLES / "digits_vit.pt", "--calib", data, "-o", tmp_path / "q.onnx")
    assert_one_line(run, 2, f"{data}: cannot read /proc/1/cwd", "vitedge only reads data")
    (data / "elsewhere").unlink()
    assert snapshot(tmp_path) == before and not (tmp_path / "q.onnx").exists()
