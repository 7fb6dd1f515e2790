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
