"""SIGTERM (sent by `timeout`, CI cancellation, `docker stop`) handled like Ctrl-C: the exception
unwinds the stack so every temporary folder and partial file is removed, then the CLI prints one
line and exits 143 (130 for Ctrl-C).

A Python signal handler runs only when the main thread is back in the interpreter: during one long
native call (an ONNX Runtime session being created, OpenVINO compiling, a TensorRT build, one
calibration batch on a large model) SIGTERM would wait for the call to return, which can be minutes,
longer than `docker stop` or a CI runner waits before SIGKILL (which leaves debris behind). So a
watchdog thread learns of every SIGTERM at once (``signal.set_wakeup_fd``) and, when the main thread
has not run the handler within ``GRACE_SECONDS``, it does what unwinding would have done for
vitedge's own temporaries: it runs the cleanups registered with :func:`at_emergency_exit` (this
process's ``.partial`` temporaries beside its outputs and work folders in $TMPDIR, see vitedge.files.swap;
the output locks it holds, see vitedge.files.lock), prints the same one line and ends the process with
``os._exit(143)``. Outputs are published only by renames in Python code, which always runs the handler
first, so a previous bundle is never touched by this path; a swap half-done is finished or rolled
back by the next run (vitedge.files.swap). The watchdog needs the GIL: a native call that holds it
throughout (none of the ones above does here; OpenVINO's converter calls back into Python) still
delays the exit until it releases it."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when SIGTERM arrives."""


# Set by the handlers below. An interrupt raised while Python runs a destructor (``__del__`` of a
# runtime session, say) is swallowed by Python ("Exception ignored in ..."); the flag keeps it, and
# ``raise_if_interrupted`` turns it back into the exception before anything is published.
_pending: list[type[KeyboardInterrupt]] = []


GRACE_SECONDS = 3.0  # the main thread gets this long to run the handler before the watchdog acts
_handled = [0]  # SIGTERMs whose handler ran in the main thread
_cleanups: dict[int, Callable[[], object]] = {}
_watchdog: list[threading.Thread] = []


def _raise_terminated(signum, frame):
    _handled[0] += 1
    _pending.append(Terminated)
    raise Terminated()


def at_emergency_exit(cleanup: Callable[[], object]) -> int:
    """Register ``cleanup`` to run if the watchdog ends the process (see the module docstring); returns a
    handle for :func:`forget`. Cleanups must be quick, touch only what this process made, and not raise."""
    handle = id(cleanup)
    _cleanups[handle] = cleanup
    return handle


def forget(handle: int) -> None:
    _cleanups.pop(handle, None)


def _emergency_exit() -> None:
    for cleanup in list(_cleanups.values()):
        with contextlib.suppress(Exception):
            cleanup()
    with contextlib.suppress(OSError):
        os.write(2, f"vitedge: {exit_for(Terminated())[0]}\n".encode())
    os._exit(EXIT_TERMINATED)


def _watch(read_fd: int) -> None:
    """The watchdog: wait for SIGTERM bytes on the wakeup pipe; after each, give the main thread
    GRACE_SECONDS to run the handler, else end the process as described above."""
    seen = 0
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        if not data:
            return
        terms = data.count(signal.SIGTERM)
        if not terms or signal.getsignal(signal.SIGTERM) is not _raise_terminated:
            continue  # another signal, or vitedge's handler is no longer the one installed
        seen = max(seen, _handled[0]) + terms
        deadline = time.monotonic() + GRACE_SECONDS
        while _handled[0] < seen and time.monotonic() < deadline:
            time.sleep(0.05)
        if _handled[0] < seen and threading.main_thread().is_alive():
            _emergency_exit()


def _start_watchdog() -> None:
    """Once per process, from the main thread: the wakeup pipe and the thread reading it. Left out when
    another component already uses the wakeup fd (an event loop): then only the handler acts."""
    if _watchdog or sys.platform.startswith("win"):
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except (ValueError, OSError):
        os.close(read_fd), os.close(write_fd)
        return
    if previous != -1:
        signal.set_wakeup_fd(previous)
        os.close(read_fd), os.close(write_fd)
        return
    thread = threading.Thread(target=_watch, args=(read_fd,), name="vitedge-sigterm-watchdog", daemon=True)
    thread.start()
    _watchdog.append(thread)
    # A forked child (a multiprocessing worker) would write its own SIGTERM (Pool.terminate) into this process's
    # pipe, and the watchdog here would end this process: the child stops using the pipe at once.
    os.register_at_fork(after_in_child=_forget_wakeup_in_child)


def _forget_wakeup_in_child() -> None:
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)


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
    if signal.getsignal(signal.SIGTERM) is _raise_terminated:
        _start_watchdog()


def uninstall() -> None:
    """Put back the default SIGTERM and SIGINT behaviour where vitedge's handlers are installed: the command is
    over. A signal during the interpreter's exit (atexit handlers: torch's compile-time report imports tabulate)
    then ends the process as a signal does, instead of raising Terminated inside that handler, which printed a
    traceback and exited 1."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is _raise_terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if signal.getsignal(signal.SIGINT) is _raise_interrupted:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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
