"""Progress lines for long commands: each stage with its wall time, on stderr."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class StageLog:
    quiet: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # how often each stage ran

    def _console(self):
        from rich.console import Console

        return Console(stderr=True, highlight=False)

    def info(self, message: str) -> None:
        if not self.quiet:
            self._console().print(f"  {message}")

    @contextlib.contextmanager
    def stage(self, name: str, what: str) -> Iterator[None]:
        if not self.quiet:
            self._console().print(f"[bold]{name:>10}[/bold] {what} ...")
        self.counts[name] = self.counts.get(name, 0) + 1
        start = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - start
            self.timings[name] = self.timings.get(name, 0.0) + seconds
        if not self.quiet:
            self._console().print(f"{'':>10} {name} done in {seconds:.1f} s")


def eprint(message: str) -> None:
    print(message, file=sys.stderr)
