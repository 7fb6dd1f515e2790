"""What a worker checks before it runs: the files it sees are the files the driver saw.

Bundles and data live on shared storage and are addressed by path. The driver records the
sha256 of the bundle's manifest.json (which holds the hash of every other bundle file) and
the content hash of the exact data items (``SourceSummary.data_hash``); a worker re-reads
both where it runs and refuses, with one line naming its host, when either differs.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from vitedge.datasources.sources import open_source
from vitedge.core.errors import BundleError, CalibrationError, DataError
from vitedge.files.atomic import sha256_file
from vitedge.bundle.manifest import verify_bundle

MANIFEST = "manifest.json"


def host() -> str:
    return socket.gethostname()


@dataclass(frozen=True)
class BundleAddress:
    path: str  # absolute, as the driver sees it (the same path on every node)
    manifest_sha256: str

    @classmethod
    def of(cls, bundle: Path) -> "BundleAddress":
        bundle = Path(bundle).expanduser().resolve()
        return cls(str(bundle), sha256_file(bundle / MANIFEST))


@dataclass(frozen=True)
class DataAddress:
    path: str  # absolute
    limit: int | None  # the seeded subset (--data-size or the recorded subset), None = all
    seed: int
    data_hash: str  # of exactly the items used, as the driver read them
    items: int

    @classmethod
    def of(cls, source, limit: int | None, seed: int) -> "DataAddress":
        s = source.summary
        return cls(str(Path(s.path).expanduser().resolve()), limit, int(seed), s.data_hash, len(source))


def open_bundle(address: BundleAddress):
    """The bundle's manifest after checking every file against it; a BundleError when this worker sees other files."""

    bundle = Path(address.path)
    if not (bundle / MANIFEST).is_file():
        raise BundleError(f"worker on {host()}: no bundle at {bundle}; put bundles on storage every node mounts at the same path")
    seen = sha256_file(bundle / MANIFEST)
    if seen != address.manifest_sha256:
        raise BundleError(f"worker on {host()} refuses to run: {bundle}/{MANIFEST} has sha256 {seen[:12]}... but the driver's "
                          f"has {address.manifest_sha256[:12]}... (another copy of the bundle at that path)")
    return verify_bundle(bundle)


def open_data(address: DataAddress, spec):
    """The same items the driver validated on; a DataError when this worker reads other content."""

    try:
        source = open_source(address.path, spec.preprocess, limit=address.limit, seed=address.seed, class_names=spec.class_names)
    except CalibrationError as err:
        raise DataError(f"worker on {host()} cannot read the data: {err}") from None
    if source.summary.data_hash != address.data_hash or len(source) != address.items:
        raise DataError(f"worker on {host()} refuses to run: the data at {address.path} differs from what the driver read "
                        f"(content hash {source.summary.data_hash[:12]}... vs {address.data_hash[:12]}...); "
                        "every node must see the same files at the same path")
    return source
