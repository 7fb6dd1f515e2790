"""Replace an output folder without a moment where its path holds nothing, and clean up after runs
that were killed.

* :func:`swap_into_place` exchanges the new folder with the old one in one ``renameat2(RENAME_EXCHANGE)``
  where Linux has it; elsewhere it writes a journal (``.NAME.swap.json``), renames the old folder
  aside, renames the new one in and removes the journal. A run killed between those steps leaves the
  journal, and :func:`recover_swap` (called by the next run writing there, and by every bundle reader)
  completes the swap when the new folder is whole or rolls it back, and says which.
* :func:`clean_debris` removes what killed runs leave: ``.NAME.vitedge-PID-XXXXXXXX.partial``
  temporaries and ``.NAME.vitedge-old-PID`` folders whose process is gone, owned by this user.

Every temporary name vitedge makes carries the token ``vitedge`` and the PID of the run that made it
(:func:`partial_prefix`, :func:`old_name`, :func:`work_prefix`), so a later run can prove an entry is
its own before deleting it: a user's ``.model.old-3`` or ``.data.1.2.partial`` never matches, and a
"PID" too large to be one (``.x.vitedge-99999999999999999999-abcdefgh.partial``) is not ours either.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from vitedge.files.safefile import read_json
from vitedge.core.signals import at_emergency_exit

# Called between the steps of a swap; tests replace it with a hook that kills the process there.
between_steps: Callable[[str], None] = lambda step: None  # noqa: E731

TOKEN = "vitedge"
JOURNAL_BYTES = 64 << 10  # a journal is three short names and a PID
PID_MAX = 2**31 - 1  # pid_t is a 32-bit int everywhere vitedge runs; a larger "PID" is not one
_PID = r"(?P<pid>[1-9][0-9]{0,9})"
_RANDOM = r"[a-z0-9_]{8}"  # what tempfile.mkstemp/mkdtemp put between prefix and suffix
_PARTIAL = re.compile(rf"^\.(?P<name>.+)\.{TOKEN}-{_PID}-{_RANDOM}\.partial$")
_OLD = re.compile(rf"^\.(?P<name>.+)\.{TOKEN}-old-{_PID}$")
# temporary work folders in $TMPDIR (see work_prefix)
WORK_KINDS = ("build", "calibrate", "profile", "export", "budget", "large", "ort-opt")
_WORK = re.compile(rf"^{TOKEN}-(?:{'|'.join(re.escape(k) for k in WORK_KINDS)})-{_PID}-{_RANDOM}$")
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def notice(message: str) -> None:
    print(f"vitedge: {message}", file=sys.stderr)


def partial_prefix(final: Path) -> str:
    """Prefix of a temporary file or folder beside ``final`` (mkstemp/mkdtemp add 8 random characters
    and the suffix ``.partial``)."""
    _clean_own_at_exit(Path(final).parent, (_PARTIAL,))
    return f".{Path(final).name}.{TOKEN}-{os.getpid()}-"


def old_name(final: Path, pid: int | None = None) -> str:
    """Name of the previous ``final`` while a swap sets it aside."""
    return f".{Path(final).name}.{TOKEN}-old-{os.getpid() if pid is None else pid}"


def work_prefix(kind: str) -> str:
    """Prefix of a temporary work folder in $TMPDIR (tempfile adds 8 random characters): names this
    process, so later runs can clean it up after a kill."""
    assert kind in WORK_KINDS, kind
    _clean_own_at_exit(Path(tempfile.gettempdir()), (_WORK,))
    return f"{TOKEN}-{kind}-{os.getpid()}-"


_own_folders: set[tuple[str, tuple[re.Pattern, ...]]] = set()


def _clean_own_at_exit(folder: Path, patterns: tuple[re.Pattern, ...]) -> None:
    """If SIGTERM ends this process from vitedge.core.signals' watchdog: remove the temporaries it made in ``folder``."""
    key = (os.path.abspath(folder), patterns)
    if key not in _own_folders:
        _own_folders.add(key)
        at_emergency_exit(lambda: clean_debris(Path(key[0]), patterns, own=True))


def debris_pid(name: str, patterns: tuple[re.Pattern, ...] = (_PARTIAL, _OLD)) -> int | None:
    """The PID of the vitedge run that made the entry ``name``, or None when the name is not one
    vitedge makes (a user's file) or its "PID" cannot be one."""
    for pattern in patterns:
        match = pattern.match(name)
        if match:
            pid = int(match.group("pid"))  # at most 10 digits: no overflow
            return pid if pid <= PID_MAX else None
    return None


def pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    except (OverflowError, ValueError):
        return True  # not a PID this system has: never treat its entry as a dead run's
    return True


def exchange(a: Path, b: Path) -> bool:
    """Atomically exchange two paths (Linux renameat2). False where the OS or filesystem has no such call."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def journal_path(final: Path) -> Path:
    return final.with_name(f".{final.name}.{TOKEN}-swap.json")


def swap_into_place(new: Path, final: Path) -> None:
    """Put the complete folder ``new`` at ``final`` (which exists); the old one is removed."""
    if exchange(new, final):
        between_steps("exchanged")
        _remove(new)  # now the old result; a kill here leaves debris clean_debris removes
        return
    old = final.with_name(old_name(final))
    journal = journal_path(final)
    journal.write_text(json.dumps({"pid": os.getpid(), "new": new.name, "old": old.name}))
    between_steps("journal written")
    os.replace(final, old)
    between_steps("old moved aside")
    os.replace(new, final)
    between_steps("new moved in")
    _remove(old)
    journal.unlink()


def recover_swap(final: Path, say: Callable[[str], None] = notice) -> None:
    """Finish or undo a swap into ``final`` that a killed run left half-done (its journal remains)."""
    final = Path(final)
    journal = journal_path(final)
    try:
        record = read_json(journal, what="swap journal", limit=JOURNAL_BYTES)  # a FIFO or /dev/zero there: refused, not read
        pid, new, old = int(record["pid"]), final.with_name(record["new"]), final.with_name(record["old"])
        if not (new.name.startswith(f".{final.name}.{TOKEN}-{pid}-") and _PARTIAL.match(new.name) and old.name == old_name(final, pid)
                and 0 < pid <= PID_MAX):
            raise ValueError("names vitedge did not write")
    except (FileNotFoundError, NotADirectoryError):  # no journal (or the parent is not a folder: no bundle either)
        return
    except (ValueError, KeyError, TypeError, OverflowError, OSError) as err:
        why = str(err) if isinstance(err, OSError) and str(err).startswith(str(journal)) else ""
        say(f"ignoring unreadable swap journal {journal}{f' ({why})' if why else ''}; remove it")
        return
    if pid_alive(pid):
        return  # a live run is mid-swap
    try:
        _repair(final, journal, new, old, say)
    except OSError as err:
        say(f"a --force rebuild of {final} was killed while swapping folders and cannot be repaired here ({err.strerror or err}); "
            f"its previous result is {old}, the new one {new}: move one to {final} and remove {journal}")


def _repair(final: Path, journal: Path, new: Path, old: Path, say: Callable[[str], None]) -> None:
    have_final, have_new, have_old = os.path.lexists(final), new.is_dir(), os.path.lexists(old)
    if not have_final and have_new:
        os.replace(new, final)
        say(f"a --force rebuild of {final} was killed while swapping folders; finished the swap: {final} holds the new result")
    elif not have_final and have_old:
        os.replace(old, final)
        say(f"a --force rebuild of {final} was killed while swapping folders; rolled back: {final} holds the previous result")
    if os.path.lexists(final):
        for leftover in (new, old):
            if os.path.lexists(leftover):
                _remove(leftover)
    journal.unlink(missing_ok=True)


def clean_debris(folder: Path, patterns: tuple[re.Pattern, ...] = (_PARTIAL, _OLD), *, own: bool = False) -> list[Path]:
    """Remove temporaries and set-aside folders in ``folder`` left by vitedge runs that are no longer alive:
    only entries whose name matches one of ``patterns`` (a vitedge token and the PID of the run that made
    it, the group ``pid``), whose PID is not running, and which this user owns. With ``own``: this process's
    own entries instead (its emergency exit, see vitedge.core.signals)."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    uid = os.getuid() if hasattr(os, "getuid") else None
    for entry in entries:
        pid = debris_pid(entry.name, patterns)
        if pid is None or (pid != os.getpid() if own else pid_alive(pid)):
            continue
        try:
            if uid is not None and entry.stat(follow_symlinks=False).st_uid != uid:
                continue  # not written by this user: not provably ours
        except OSError:
            continue
        if _journal_names(folder, entry.name):
            continue  # part of a half-done swap: recover_swap decides what happens to it
        _remove(Path(entry.path))
        removed.append(Path(entry.path))
    return removed


def _journal_names(folder: Path, name: str) -> bool:
    for journal in Path(folder).glob(f".*.{TOKEN}-swap.json"):
        with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
            if name in read_json(journal, what="swap journal", limit=JOURNAL_BYTES).values():
                return True
    return False


def _remove(path: Path) -> None:
    if os.path.islink(path) or os.path.isfile(path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    else:
        shutil.rmtree(path, ignore_errors=True)
