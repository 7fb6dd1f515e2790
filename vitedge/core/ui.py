"""Progress lines for long commands: each stage with its wall time, on stderr."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape

from vitedge.core.errors import one_line, shown_controls
from vitedge.core.signals import raise_if_interrupted


@dataclass
class StageLog:
    """``timings`` holds each stage's own time: a stage run inside another (validate inside
    build) is counted once, under its own name, so the figures add up to the wall time. The
    "done in" line prints a stage's whole time, nested stages included."""

    quiet: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # how often each stage ran
    _nested: list[float] = field(default_factory=list, repr=False)  # per open stage: seconds spent in stages inside it

    def _console(self):
        """Lines print with ``soft_wrap``: rich wraps at 80 columns when stderr is not a terminal (a CI log, a pipe),
        which split a gate's line in two (``95% interval`` / ``[0.00, 0.00] points``) and hid it from grep; a
        terminal wraps long lines itself."""
        return Console(stderr=True, highlight=False)

    def info(self, message: str) -> None:
        if not self.quiet:
            self._console().print(f"  {literal(message)}", soft_wrap=True)

    @contextlib.contextmanager
    def stage(self, name: str, what: str) -> Iterator[None]:
        # A Ctrl-C that a runtime swallowed on the way (a bare except in a converter, a destructor)
        # stops the work at the next stage boundary instead of when the bundle is published.
        raise_if_interrupted()
        if not self.quiet:
            # one line: a path with a line break stays on the stage's line, and a long one is not wrapped by rich
            self._console().print(f"[bold]{name:>10}[/bold] {escape(one_line(what))} ...", soft_wrap=True)
        self.counts[name] = self.counts.get(name, 0) + 1
        start = time.perf_counter()
        self._nested.append(0.0)
        try:
            yield
        finally:
            seconds = time.perf_counter() - start
            inner = self._nested.pop()
            self.timings[name] = self.timings.get(name, 0.0) + seconds - inner
            if self._nested:
                self._nested[-1] += seconds
        raise_if_interrupted()
        if not self.quiet:
            inside = f" ({seconds - inner:.1f} s outside nested stages)" if inner > 0 else ""
            self._console().print(f"{'':>10} {name} done in {seconds:.1f} s{inside}")


def literal(text: object) -> str:
    """``text`` as rich prints it literally: paths, class names and other strings that came from files or flags may
    hold ``[...]``, which rich would read as markup (``[/]`` raised MarkupError, exit 3; ``[red]`` vanished), and
    control characters, which would reach the terminal as escape sequences (a model's class names could recolour,
    retitle or write to the clipboard of the terminal that inspects it): these are shown as ``\\xNN``."""
    return escape(shown_controls(str(text), keep_layout=True))


def eprint(message: str) -> None:
    print(message, file=sys.stderr)
