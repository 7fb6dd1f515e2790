"""Atomic writes and hashing. Nothing vitedge writes is ever seen half-written."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from vitedge.core.signals import raise_if_interrupted
from vitedge.files.swap import _remove, clean_debris, partial_prefix, recover_swap, swap_into_place


@contextlib.contextmanager
def atomic_write_path(final: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``final``; rename it into place only on success."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    clean_debris(final.parent)
    fd, tmp_name = tempfile.mkstemp(prefix=partial_prefix(final), suffix=".partial", dir=final.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes 0600; a file of ours reads like any other
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


@contextlib.contextmanager
def atomic_output_dir(final: Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary folder beside ``final``; it becomes ``final`` only on success.

    An existing ``final`` is replaced only with ``force``, by one exchange rename where the OS has
    one (Linux renameat2), else by two renames under a journal that the next run completes or
    rolls back (see vitedge.files.swap). ``final`` never stops holding a complete result."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    recover_swap(final)
    clean_debris(final.parent)
    tmp = Path(tempfile.mkdtemp(prefix=partial_prefix(final), suffix=".partial", dir=final.parent))
    os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes 0700: a service account must read a bundle another user built
    try:
        yield tmp
        raise_if_interrupted()  # an interrupt swallowed on the way must not publish the result
        if os.path.lexists(final):
            if not force:
                raise FileExistsError(final)
            swap_into_place(tmp, final)
        else:
            os.replace(tmp, final)
    except BaseException:
        _remove(tmp)
        raise


def current_umask() -> int:
    """The process umask (read by setting and restoring it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
