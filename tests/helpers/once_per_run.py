"""Something expensive made once per test run, however many xdist workers ask for it."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path


def once_per_run(tmp_path_factory, name: str, make: Callable[[Path], None]) -> Path:
    """The folder ``<run's base temp>/<name>``, filled by ``make(folder)`` by the first process of this run that
    asks (the others wait on a lock for it: every xdist worker's base temp sits in the same run folder)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    root = base / name
    root.mkdir(exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / ".done").exists():
            make(root)
            (root / ".done").write_text("ok")
    return root
