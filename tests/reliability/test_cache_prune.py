"""The validation cache deletes only entries it wrote (issue 26 item 2).

`ReferenceCache.prune` runs after every save and removes the least recently used entries past the size
limit. It used to remove any *.npz in the folder: a user's file put there (or a symlink's target name) went
with the rest. Now an entry is counted and removed only when its name is a cache key and its HMAC verifies
with this cache's key; everything else in the folder is left as it is, whatever its name or age.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from vitedge.validation.accuracy import Outputs
from vitedge.validation.reference_cache import ReferenceCache, ReferenceCacheSettings


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _age(p: Path, seconds: float) -> None:
    st = p.lstat()
    os.utime(p, (st.st_atime - seconds, st.st_mtime - seconds), follow_symlinks=False)


def _own_entries(cache: ReferenceCache, n: int) -> list[Path]:
    paths = [cache.save(f"{i:064x}", {"i": i}, Outputs(np.full((200, 10), i, np.float32), None)) for i in range(n)]
    for i, p in enumerate(paths):
        _age(p, 100 * (n - i))  # entry 0 the oldest of ours
    return paths


def _foreign(kind: str, folder: Path, outside: Path) -> Path:
    """A file in the cache folder that vitedge did not write, older than every entry (first in line to go)."""
    name = f"{'e' * 64}.npz"
    if kind == "user-npz":  # any name the user chose
        p = folder / "my-features.npz"
        np.savez(p, x=np.arange(50000, dtype=np.float32))
    elif kind == "key-named-npz":  # named like an entry, but no HMAC
        p = folder / name
        np.savez(p, meta=np.array('{"format": "vitedge-reference-cache-2", "key": "' + "e" * 64 + '"}'),
                 values=np.zeros((200, 10), np.float32))
    elif kind == "forged-mac":  # an entry's layout with a MAC made under another key
        p = folder / name
        other = ReferenceCache(ReferenceCacheSettings(root=outside / "other-cache"))
        src = other.save("e" * 64, {"i": 9}, Outputs(np.zeros((200, 10), np.float32), None))
        p.write_bytes(src.read_bytes())
    elif kind == "symlink":  # a link named like an entry, to the user's data elsewhere
        target = outside / "data.npz"
        np.savez(target, x=np.arange(50000, dtype=np.float32))
        p = folder / name
        p.symlink_to(target)
    elif kind == "not-npz":  # named like an entry, holds text
        p = folder / name
        p.write_text("the user's notes\n" * 5000)
    else:  # pragma: no cover
        raise AssertionError(kind)
    _age(p, 10_000)
    return p


KINDS = ["user-npz", "key-named-npz", "forged-mac", "symlink", "not-npz"]


@pytest.mark.parametrize("kind", KINDS)
def test_prune_never_deletes_a_file_vitedge_did_not_write(kind, tmp_path):
    cache = ReferenceCache(ReferenceCacheSettings(root=tmp_path / "cache"))
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    ours = _own_entries(cache, 3)
    foreign = _foreign(kind, cache.folder, outside)
    before = {p: _sha(p) for p in [foreign, *outside.rglob("*.npz")] if p.exists()}
    size = ours[0].stat().st_size
    cache.prune(keep=ours[2], limit=2 * size)  # over the limit by one of ours
    for p, digest in before.items():
        assert os.path.lexists(p) and _sha(p) == digest, p  # left as it was
    assert [p.exists() for p in ours] == [False, True, True]  # only our oldest went: the foreign file is not counted


def test_prune_counts_only_its_own_entries(tmp_path):
    """A large user file in the folder does not push vitedge's own entries out: they are under the limit by themselves."""
    cache = ReferenceCache(ReferenceCacheSettings(root=tmp_path / "cache"))
    ours = _own_entries(cache, 2)
    big = cache.folder / "big.npz"
    np.savez(big, x=np.zeros(2_000_000, np.float32))
    cache.prune(limit=3 * ours[0].stat().st_size)
    assert all(p.exists() for p in ours) and big.exists()


def test_prune_with_a_key_that_cannot_be_read_deletes_nothing(tmp_path):
    """The cache's key replaced by one not private to this user: nothing can be proven ours, so nothing goes."""
    cache = ReferenceCache(ReferenceCacheSettings(root=tmp_path / "cache"))
    ours = _own_entries(cache, 3)
    os.chmod(cache.folder / ".key", 0o644)
    fresh = ReferenceCache(ReferenceCacheSettings(root=tmp_path / "cache"))
    fresh.prune(limit=1)
    assert all(p.exists() for p in ours)
