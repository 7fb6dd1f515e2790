"""Read only regular files, with a size bound: a FIFO named ``zz.jpg`` would block forever and a
``zz.png -> /dev/zero`` symlink would read until memory runs out.

The check stats the path (following symlinks) before opening it, then opens it without blocking and
checks the opened descriptor again, so a file swapped for a FIFO in between cannot hang the run."""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_IMAGE_BYTES = 128 << 20  # one calibration image; far above any real photo


class NotRegularFile(OSError):
    """A FIFO, socket, device or folder where a file was expected."""


class FileTooLarge(OSError):
    """A file over the size bound."""


def kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def check_regular(path: Path) -> os.stat_result:
    """``os.stat`` of ``path`` (symlinks followed); NotRegularFile unless it is a regular file."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(f"{path} is {kind_of(st.st_mode)}, not a regular file")
    return st


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes."""
    check_regular(path)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{path} is {kind_of(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise FileTooLarge(f"{path} is {st.st_size} bytes, over the {limit >> 20} MB bound")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(f"{path} is over the {limit >> 20} MB bound")
    return data


# ---- who could have written a file: the file, every link and every folder on the way ----------

MAX_LINK_HOPS = 40  # as the kernel's own bound on links followed in one lookup


def _uid() -> int | None:
    return os.getuid() if hasattr(os, "getuid") else None


def _writers(mode: int) -> str:
    return " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002)) if mode & bit)


def _folder_reason(folder: Path, st: os.stat_result, uid: int | None) -> str | None:
    """A folder on the way is safe when the user or root owns it and no one else can replace what is in it
    (not writable by group or others, unless sticky: then only an entry's owner can rename it)."""
    if uid is not None and st.st_uid not in (uid, 0):
        return f"the folder {folder} on its way is owned by uid {st.st_uid}, not by you (uid {uid}) or root"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return f"{_writers(st.st_mode)} can write the folder {folder} on its way (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _file_reason(path: Path, st: os.stat_result, uid: int | None) -> str | None:
    if not stat.S_ISREG(st.st_mode):
        return f"it is {kind_of(st.st_mode)}, not a regular file"
    if uid is not None and st.st_uid != uid:
        return f"it is owned by uid {st.st_uid}, not by you (uid {uid})"
    if st.st_mode & 0o022:
        return f"{_writers(st.st_mode)} can write it (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def ownership_reason(path: Path) -> str | None:
    """Why someone other than the user (or root) could have chosen what ``path`` holds; None when no one could.

    Judged with ``lstat`` along the way, never through a link: the file itself must be the user's and writable by
    no one else; every link followed to reach it must be owned by the user or root (a link planted by another user
    decides what is read whatever its target is); and every folder on the way, from ``/`` down, links' targets'
    folders included, must be owned by the user or root and not writable by others (sticky folders such as /tmp
    excepted). Where there are no user ids (Windows) only the mode bits are judged."""
    uid = _uid()
    first = Path(os.path.abspath(path))
    todo = list(first.parts)
    current = Path(todo.pop(0))
    hops = 0
    reason = _folder_reason(current, os.lstat(current), uid)
    while todo and reason is None:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            current = current.parent
            continue
        entry = current / part
        st = os.lstat(entry)
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if uid is not None and st.st_uid not in (uid, 0):
                return f"{'it' if entry == first else entry} is a link owned by uid {st.st_uid}, not by you (uid {uid}) or root"
            if hops > MAX_LINK_HOPS:
                return f"it is reached through more than {MAX_LINK_HOPS} links"
            target = Path(os.readlink(entry))
            todo = list(target.parts) + todo
            if target.is_absolute():
                current = Path(todo.pop(0))
            continue
        reason = _folder_reason(entry, st, uid) if todo else _file_reason(entry, st, uid)
        current = entry
    return reason
