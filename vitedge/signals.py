"""SIGTERM (sent by `timeout`, CI cancellation, `docker stop`) handled like Ctrl-C: the exception
unwinds the stack so every temporary folder and partial file is removed, then the CLI prints one
line and exits 143 (130 for Ctrl-C)."""

from __future__ import annotations

import signal
import threading

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when SIGTERM arrives."""


def _raise_terminated(signum, frame):
    raise Terminated()


def install() -> None:
    """Raise Terminated on SIGTERM, unless the program embedding vitedge set its own handler."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, _raise_terminated):
        signal.signal(signal.SIGTERM, _raise_terminated)


def was_terminated(err: BaseException | None) -> bool:
    """True when ``err`` is, or was caused by, SIGTERM (click wraps KeyboardInterrupt in Abort)."""
    seen = 0
    while err is not None and seen < 5:
        if isinstance(err, Terminated):
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


def exit_for(err: BaseException | None) -> tuple[str, int]:
    """The one-line message and exit code for an interrupt."""
    if was_terminated(err):
        return "terminated (SIGTERM); nothing partial was left behind", EXIT_TERMINATED
    return "interrupted; nothing partial was left behind", EXIT_INTERRUPTED
