"""Read only regular files, with a size bound: a FIFO named ``zz.jpg`` would block forever and a
``zz.png -> /dev/zero`` symlink would read until memory runs out.

The check stats the path (following symlinks) before opening it, then opens it without blocking and
checks the opened descriptor again, so a file swapped for a FIFO in between cannot hang the run."""

from __future__ import annotations

import json
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

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


def size_text(n: int) -> str:
    """A byte bound as people say it: 64 MB, 64 KB, 4096 bytes."""
    for shift, unit in ((20, "MB"), (10, "KB")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


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
            raise FileTooLarge(f"{path} is {st.st_size} bytes, over the {size_text(limit)} bound")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(f"{path} is over the {size_text(limit)} bound")
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


# ---- bounded parsers: JSON and TOML with a depth and size bound, one-line answers ----------------

MAX_DEPTH = 64  # the deepest nesting any document vitedge reads has is under 10
MAX_DOCUMENT_BYTES = 64 << 20  # manifests, reports, metadata, configs: kB to a few MB


class BadDocument(ValueError):
    """A JSON or TOML document vitedge cannot use: not UTF-8, not valid, too deep, NaN, or not the type expected.
    Its message is one line naming ``where``; callers turn it into their own error (exit 2)."""


def _depth(doc: Any, limit: int) -> int:
    """The nesting depth of ``doc`` (0 for a scalar), walked without recursion; stops past ``limit``."""
    deepest, todo = 0, [(doc, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if deepest > limit:
            return deepest
        todo.extend((child, level + 1) for child in children)
    return deepest


def _checked(doc: Any, where: str, what: str, want: type | tuple[type, ...] | None, depth: int) -> Any:
    if _depth(doc, depth) > depth:
        raise BadDocument(f"{where} nests deeper than {depth} levels: not a {what} vitedge wrote")
    if want is not None and not isinstance(doc, want):
        raise BadDocument(f"{where} holds a {type(doc).__name__}, not the {what} expected")
    return doc


def _no_constant(name: str) -> Any:
    raise BadDocument(f"holds {name}, which is not a number JSON allows")


def parse_json(text: str | bytes, where: str, *, what: str = "JSON object", want: type | tuple[type, ...] | None = dict,
               depth: int = MAX_DEPTH, limit: int = MAX_DOCUMENT_BYTES) -> Any:
    """``text`` parsed as JSON, bounded: at most ``limit`` bytes and ``depth`` levels, no NaN or Infinity, of type
    ``want`` (None: any). A one-line BadDocument naming ``where`` otherwise, never RecursionError."""
    if len(text) > limit:
        raise BadDocument(f"{where} is {len(text)} bytes, over the {size_text(limit)} bound for a {what}")
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        doc = json.loads(text, parse_constant=_no_constant)
    except BadDocument as err:
        raise BadDocument(f"{where} {err}") from None
    except RecursionError:
        raise BadDocument(f"{where} nests deeper than {depth} levels: not a {what} vitedge wrote") from None
    except UnicodeDecodeError:
        raise BadDocument(f"{where} is not UTF-8 text: not a {what}") from None
    except ValueError as err:
        raise BadDocument(f"{where} is not valid JSON ({str(err)[:160]})") from None
    return _checked(doc, where, what, want, depth)


def read_json(path: Path, *, what: str = "JSON object", want: type | tuple[type, ...] | None = dict,
              limit: int = MAX_DOCUMENT_BYTES) -> Any:
    """A regular file of at most ``limit`` bytes parsed by :func:`parse_json`. OSError (NotRegularFile, FileTooLarge,
    missing, unreadable) is left to the caller."""
    return parse_json(read_bounded(Path(path), limit), str(path), what=what, want=want, limit=limit)


def parse_toml(text: str, where: str, *, depth: int = MAX_DEPTH, limit: int = MAX_DOCUMENT_BYTES) -> dict[str, Any]:
    """``text`` parsed as TOML, bounded as :func:`parse_json` is; a BadDocument in one line otherwise."""
    if len(text) > limit:
        raise BadDocument(f"{where} is {len(text)} bytes, over the {size_text(limit)} bound for a TOML file")
    try:
        doc = tomllib.loads(text)
    except RecursionError:
        raise BadDocument(f"{where} nests deeper than {depth} levels: not a config vitedge reads") from None
    except tomllib.TOMLDecodeError as err:
        raise BadDocument(f"{where}: not valid TOML ({err})") from None
    return _checked(doc, where, "TOML document", dict, depth)


def read_toml(path: Path, *, limit: int = MAX_DOCUMENT_BYTES) -> dict[str, Any]:
    """A regular UTF-8 file of at most ``limit`` bytes parsed by :func:`parse_toml` (OSError left to the caller)."""
    raw = read_bounded(Path(path), limit)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadDocument(f"{path}: not UTF-8 text, so not TOML") from None
    return parse_toml(text, str(path), limit=limit)
