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


# Set by the handlers below. An interrupt raised while Python runs a destructor (``__del__`` of a
# runtime session, say) is swallowed by Python ("Exception ignored in ..."); the flag keeps it, and
# ``raise_if_interrupted`` turns it back into the exception before anything is published.
_pending: list[type[KeyboardInterrupt]] = []


def _raise_terminated(signum, frame):
    _pending.append(Terminated)
    raise Terminated()


def _raise_interrupted(signum, frame):
    _pending.append(KeyboardInterrupt)
    raise KeyboardInterrupt()


def install() -> None:
    """Raise Terminated on SIGTERM and KeyboardInterrupt on SIGINT (remembered, see above), unless
    the program embedding vitedge set its own handlers."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, _raise_terminated):
        signal.signal(signal.SIGTERM, _raise_terminated)
    if signal.getsignal(signal.SIGINT) in (signal.default_int_handler, _raise_interrupted):
        signal.signal(signal.SIGINT, _raise_interrupted)


def pending() -> type[KeyboardInterrupt] | None:
    """The interrupt that arrived during this command (even if something turned it into another error), or None."""
    return _pending[-1] if _pending else None


def reset() -> None:
    """Forget earlier interrupts: a new command starts (the CLI, run several times in one process by tests)."""
    _pending.clear()


def raise_if_interrupted() -> None:
    """Raise the interrupt that arrived earlier, even if something swallowed it on the way."""
    if _pending:
        raise _pending[-1]()


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
