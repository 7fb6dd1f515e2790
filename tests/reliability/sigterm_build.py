"""One `vitedge build --force` over an earlier bundle, sent SIGTERM as soon as its log shows a stage starting, and the
checks every stage must pass (tests/reliability/test_sigterm.py, test_sigterm_late.py; issue 26 item 4)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CALIB_DIR, EXAMPLES, VAL_DIR
from rel_cli import debris

from vitedge.files.lock import lock_path

DIGITS = EXAMPLES / "digits_vit.pt"
LINE = "vitedge: terminated (SIGTERM); nothing partial was left behind"


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _leftovers(tmp: Path, pid: int) -> list[str]:
    return [n for n in os.listdir(tmp) if f"-{pid}-" in n]


def _signal_at(stage: str, args: list, cwd: Path, tmp: Path) -> tuple[subprocess.Popen, list[str], str]:
    p = subprocess.Popen([sys.executable, "-m", "vitedge", *map(str, args)], cwd=cwd, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env=dict(os.environ, TMPDIR=str(tmp), COLUMNS="200"))
    seen = []
    for line in p.stdout:
        seen.append(line)
        if line.strip().startswith(stage.strip()) and line.rstrip().endswith("..."):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            break
    return p, seen, p.communicate(timeout=900)[0]


def sigterm_at_stage(stage: str, earlier: Path, tmp_path: Path, cache: Path) -> None:
    """Build into a copy of ``earlier`` with ``--cache-dir cache``, SIGTERM it when ``stage`` starts; then: exit 143, exactly
    one line, no debris beside the output or in the cache, no work folder in its $TMPDIR, no lock, the earlier bundle
    byte for byte. Skipped, saying why, when the build had already ended."""
    out, tmp = tmp_path / "b", tmp_path / "tmp"
    shutil.copytree(earlier, out)
    tmp.mkdir()
    before = tree(out)
    args = ["build", DIGITS, "-t", "onnx", "--calib", CALIB_DIR, "--val", VAL_DIR, "-o", out, "--force", "--no-latency",
            "--cache-dir", cache]
    p, seen, rest = _signal_at(stage, args, tmp_path, tmp)
    if not any(ln.strip().startswith(stage.strip()) for ln in seen):
        pytest.fail(f"the stage '{stage}' never started:\n" + "".join(seen[-20:]) + rest[-2000:])
    if p.returncode in (0, -signal.SIGTERM) and tree(out) != before:
        pytest.skip(f"the build completed before the signal sent at '{stage}' was handled (exit {p.returncode})")
    lines = [ln for ln in (seen + rest.splitlines()) if ln.startswith("vitedge: ")]
    assert p.returncode == 143, "".join(seen[-5:]) + rest[-2000:]
    assert lines == [LINE], lines
    assert debris(tmp_path) == [] and _leftovers(tmp, p.pid) == [], (debris(tmp_path), os.listdir(tmp))
    assert not lock_path(out).exists()
    assert tree(out) == before  # the earlier bundle, byte for byte
