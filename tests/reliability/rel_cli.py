"""Running the vitedge CLI as a user does, and checking what a failed run left behind.

`cli` runs `vitedge.cli.entry.main(argv)` in this process (stdout/stderr captured, exit code from
SystemExit) so torch is imported once per session; `cli_proc` runs `python -m vitedge` in a
child process for the cases that need one (sys.exit at import, resource limits).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from helpers.cli import vitedge_in_process

DEBRIS = (".partial", ".old-", "vitedge-build-")


@dataclass
class Run:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return [ln for ln in self.err.splitlines() if ln.strip()]


def cli(*args, cwd: Path | None = None) -> Run:
    r = vitedge_in_process(*args, cwd=cwd)
    return Run(r.returncode, r.stdout, r.stderr)


def export_fp32(model: Path, path: Path) -> Path:
    """``path``: the FP32 graph `vitedge export` writes of ``model`` (the tests' shared starting point for ONNX inputs)."""
    run = cli("export", model, "-o", path)
    assert run.code == 0, run.err
    return path


def cli_proc(*args, cwd: Path | None = None, preexec_fn=None, env: dict | None = None) -> Run:
    r = subprocess.run([sys.executable, "-m", "vitedge", *map(str, args)], capture_output=True, text=True, cwd=cwd,
                       timeout=300, preexec_fn=preexec_fn, env=None if env is None else dict(os.environ, **env))
    return Run(r.returncode, r.stdout, r.stderr)


def assert_one_line(run: Run, code: int, *fragments: str) -> str:
    """Exit ``code``, exactly one non-empty stderr line, no traceback, each fragment in it."""
    assert run.code == code, (run.code, run.err[-2000:], run.out[-500:])
    assert "Traceback" not in run.err, run.err[-2000:]
    assert len(run.lines) == 1, run.err[-2000:]
    line = run.lines[0]
    assert line.startswith("vitedge: "), line
    for f in fragments:
        assert f.lower() in line.lower(), (f, line)
    return line


def debris(*roots: Path) -> list[str]:
    """Half-written leftovers vitedge could have left under ``roots``."""
    found = []
    for root in roots:
        if not Path(root).exists():
            continue
        for p in Path(root).rglob("*"):
            if any(mark in p.name for mark in DEBRIS):
                found.append(str(p))
    return found


def snapshot(*roots: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under ``roots`` (to prove nothing was changed or lost)."""
    out = {}
    for root in roots:
        root = Path(root)
        for p in sorted(root.rglob("*")):
            if p.is_file():
                out[f"{root.name}/{p.relative_to(root)}"] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def holds_lock(proc: subprocess.Popen, output: Path) -> bool:
    """True once ``proc`` holds the lock of ``output`` (its pid is written in the lock file after flock), False when it
    ended first."""
    from vitedge.files.lock import lock_path

    while proc.poll() is None:
        try:
            if lock_path(output).read_text().strip() == str(proc.pid):
                return True
        except OSError:
            pass
        time.sleep(0.01)
    return False
