"""Processes a test run leaves behind.

A test session must end with no process of its own alive: an xdist worker, a Ray raylet or
GCS server, a `vitedge` CLI child, a runtime helper. One that survives keeps the run's stdout
pipe open, so a CI job that reads the output through a pipe waits on it until its time limit
(seen once in three runs under `pytest ... | tail -1`). `tests/conftest.py` calls `reap` when
each process of the run (every xdist worker, then the controller) finishes, and fails the run
naming what it had to kill."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

# Helpers that live exactly as long as their parent and exit when its pipe to them closes: not leftovers.
INTERPRETER_LIFETIME_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


@dataclass(frozen=True)
class Leftover:
    pid: int
    command: str

    def __str__(self) -> str:
        return f"pid {self.pid}: {self.command[:160]}"


def _descendants(pid: int) -> dict[int, str]:
    """Every process below `pid` (children, their children...) with its command line, from /proc."""
    parents: dict[int, int] = {}
    commands: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] == "Z":  # a zombie holds no pipe; its parent reaps it
            continue
        parents[int(entry)] = int(fields[1])
        commands[int(entry)] = cmdline
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                found[child] = commands[child]
                frontier.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"


GRACE_ENV = "VITEDGE_TEST_REAP_GRACE"  # seconds; tests/package/test_toolchain.py shortens it for its planted leftovers


def reap(grace_seconds: float | None = None) -> list[Leftover]:
    """Wait up to `grace_seconds` for this process's descendants to exit by themselves, then SIGKILL the
    rest (SIGTERM is not enough: a process hung in C code, as a Ray driver can be, never runs its handler).
    Returns what had to be killed; interpreter-lifetime helpers are neither waited for nor killed."""
    if not os.path.isdir("/proc"):  # not Linux: nothing to list this way
        return []
    if grace_seconds is None:
        grace_seconds = float(os.environ.get(GRACE_ENV, "15"))
    deadline = time.monotonic() + grace_seconds
    while True:
        rest = {pid: cmd for pid, cmd in _descendants(os.getpid()).items()
                if not any(helper in cmd for helper in INTERPRETER_LIFETIME_HELPERS)}
        if not rest or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    leftovers = [Leftover(pid, cmd) for pid, cmd in sorted(rest.items())]
    for item in leftovers:
        try:
            os.kill(item.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for item in leftovers:  # reap what we can so nothing lingers as a zombie
        end = time.monotonic() + 5
        while _alive(item.pid) and time.monotonic() < end:
            try:
                os.waitpid(item.pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.05)
    return leftovers
