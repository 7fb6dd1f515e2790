"""One writer per output: a second vitedge run into the same output is refused before any work.

Each output (a bundle folder, a report folder, an ONNX file) is guarded by an advisory lock,
``fcntl.flock`` on the file ``.NAME.vitedge-lock`` beside it, taken when the command starts and held
until it ends. A second run that wants the same output finds the lock taken and exits 2 at once,
naming the run that holds it, instead of failing with exit 3 after all its work (or, worse, swapping
its bundle over the first one's).

The kernel drops a flock when its process dies, so a killed run never leaves a lock that blocks the
next one; the file itself stays (empty of meaning) and the next run reuses and removes it. A holder
removes the file while still holding it; a run that opened it just before checks, after locking, that
the file it locked is still the one at that path, else tries again.

Where ``fcntl`` is missing (Windows) nothing is locked; vitedge's CI and documented platforms are
POSIX. Parent folders the lock needed are created, and removed again when still empty at release,
so a refused run leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from vitedge.core.errors import UsageError
from vitedge.core.signals import at_emergency_exit, forget

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

LOCK_SUFFIX = ".vitedge-lock"


def lock_path(output: Path) -> Path:
    """The lock file that guards ``output``: ``.NAME.vitedge-lock`` in its parent folder."""
    output = Path(os.path.abspath(output))
    return output.parent / f".{output.name}{LOCK_SUFFIX}"


@contextlib.contextmanager
def output_locks(outputs: Iterable[Path | None], *, flag: str = "-o") -> Iterator[None]:
    """Hold the lock of every output in ``outputs`` (None skipped) for the body; a UsageError (exit 2)
    at once when another run holds one of them."""
    unique = sorted({os.path.abspath(o) for o in outputs if o is not None})
    with contextlib.ExitStack() as stack:
        for output in unique:
            stack.enter_context(_lock_one(Path(output), flag))
        yield


@contextlib.contextmanager
def _lock_one(output: Path, flag: str) -> Iterator[None]:
    if fcntl is None:  # pragma: no cover
        yield
        return
    _check_name_room(output, flag)
    path = lock_path(output)
    created: list[Path] = []
    try:
        created = _make_parents(path.parent)
        fd = _acquire(path, output, flag)
    except NotADirectoryError:
        _remove_empty(created)
        raise UsageError(f"{flag} {output} cannot be written: a part of {output.parent} is a file, not a folder; "
                         f"choose another {flag}") from None
    except OSError as err:  # a read-only file system, a folder we may not write, a pseudo file system (/proc)
        _remove_empty(created)
        raise UsageError(f"{flag} {output} cannot be written: {err.filename or path.parent}: {err.strerror or err}; "
                         f"choose another {flag} or fix its permissions") from None
    except BaseException:
        _remove_empty(created)
        raise
    handle = at_emergency_exit(lambda: os.unlink(path))  # SIGTERM in a native call (vitedge.core.signals): the lock file goes too
    try:
        yield
    finally:
        forget(handle)
        with contextlib.suppress(OSError):
            os.unlink(path)  # still held: a run that opened it will see it is gone and lock afresh
        os.close(fd)
        _remove_empty(created)


# The longest name vitedge puts beside an output NAME: `.NAME.vitedge-PID-XXXXXXXX.partial` (PID up to 10 digits,
# 8 random characters), longer than `.NAME.vitedge-old-PID`, `.NAME.vitedge-swap.json` and `.NAME.vitedge-lock`.
SIBLING_EXTRA = len("..vitedge--.partial") + 10 + 8


def _check_name_room(output: Path, flag: str) -> None:
    """An output whose name leaves no room for vitedge's temporary names beside it (the file system's name limit,
    255 bytes on most) is refused in one line before anything is made (it was an OSError, exit 3, after the work)."""
    folder = Path(os.path.abspath(output)).parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        limit = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        limit = 255
    size = len(os.fsencode(Path(output).name))
    if size + SIBLING_EXTRA > limit:
        raise UsageError(f"{flag} {output}: its name is {size} bytes, and vitedge's temporary files beside it need "
                         f"{SIBLING_EXTRA} more within this file system's limit of {limit}; choose a name of at most "
                         f"{limit - SIBLING_EXTRA} bytes")


def _acquire(path: Path, output: Path, flag: str) -> int:
    for _ in range(20):
        try:  # O_NONBLOCK: a FIFO planted where the lock goes must not block the open
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError as err:
            if err.errno == errno.ELOOP:  # a symlink planted where the lock goes
                raise UsageError(f"{path} is a symlink, not vitedge's lock file for {output}; remove it, or choose another {flag}") from None
            if err.errno == errno.EISDIR:
                raise UsageError(f"{path} is a folder, not vitedge's lock file for {output}; remove it, or choose another {flag}") from None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO, socket or device where the lock goes
            os.close(fd)
            raise UsageError(f"{path} is not a regular file, not vitedge's lock file for {output}; remove it, or choose another {flag}")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise UsageError(f"another vitedge run{holder} is writing {output} (lock {path.name}); wait for it to finish, "
                             f"or choose another {flag}") from None
        except OSError:
            os.close(fd)
            raise
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)  # the holder removed it as we opened it: lock the new one
    raise UsageError(f"could not lock {path} for {output}: it keeps changing; is another program removing it?")


def _read_holder(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if text.isdigit() and len(text) <= 10:
            return f" (pid {int(text)})"
    return ""


def _make_parents(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; the ones created, deepest first."""
    missing = []
    p = folder
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(d)
    return missing


def _remove_empty(folders: list[Path]) -> None:
    for d in folders:
        with contextlib.suppress(OSError):
            os.rmdir(d)
