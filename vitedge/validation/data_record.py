"""What a build validated on, recorded in manifest.json (``validation_data``), and re-opened
by `vitedge validate BUNDLE` when no --data is given.

The record holds the absolute path, the role ("validation": held-out --val data;
"calibration": the calibration images, when the build had no --val), the seeded subset
that was used and the content hash of exactly those items. Re-opening reads the same
subset again and refuses data that moved or changed, naming --data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitedge.datasources.sources import open_source
from vitedge.core.errors import CalibrationError, UsageError

ROLES = ("validation", "calibration")


@dataclass(frozen=True)
class DataRecord:
    role: str  # one of ROLES
    path: str  # absolute
    kind: str
    items: int
    data_hash: str
    subset_size: int | None = None
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "path": self.path, "kind": self.kind, "items": self.items, "data_hash": self.data_hash,
                "subset_size": self.subset_size, "seed": self.seed}

    @classmethod
    def of(cls, source, role: str) -> "DataRecord":
        s = source.summary
        return cls(role=role, path=str(Path(s.path).expanduser().resolve()), kind=s.kind, items=s.used, data_hash=s.data_hash,
                   subset_size=s.subset_size, seed=s.seed)

    @classmethod
    def from_manifest(cls, manifest) -> "DataRecord | None":
        d = getattr(manifest, "validation_data", None)
        if isinstance(d, dict) and d.get("role") in ROLES and d.get("path") and d.get("data_hash"):
            return cls(role=d["role"], path=d["path"], kind=d.get("kind", "images"), items=int(d.get("items") or 0),
                       data_hash=d["data_hash"], subset_size=d.get("subset_size"), seed=int(d.get("seed") or 0))
        # bundles from before the record: the path of the build's validation report, if absolute
        v = (getattr(manifest, "validation", None) or {}).get("data") or {}
        if v.get("path") and v.get("data_hash") and Path(v["path"]).is_absolute():
            return cls(role="validation", path=v["path"], kind=v.get("kind", "images"), items=int(v.get("items") or 0),
                       data_hash=v["data_hash"])
        return None

    def describe(self) -> str:
        if self.role == "calibration":
            return (f"the calibration images the build validated on ({self.path}, {self.items} items): not held-out data, "
                    "so top-1 here is not a real accuracy figure; pass --data LABELLED_SET for one")
        return f"the validation set the build validated on ({self.path}, {self.items} items)"


def open_recorded(record: DataRecord, spec, *, progress: bool):
    """Open exactly the items the build validated on; a one-line UsageError naming --data if they moved or changed."""

    what = "calibration images" if record.role == "calibration" else "validation set"
    if not Path(record.path).exists():
        raise UsageError(f"the {what} this bundle was validated on, {record.path}, is gone (moved or deleted); "
                         "pass --data LABELLED_SET to validate on data that is here")
    try:
        source = open_source(record.path, spec.preprocess, limit=record.subset_size, seed=record.seed,
                             class_names=spec.class_names, progress=progress)
    except CalibrationError as err:
        raise UsageError(f"the {what} this bundle was validated on can no longer be read ({err}); pass --data LABELLED_SET") from None
    if source.summary.data_hash != record.data_hash:
        raise UsageError(f"the {what} this bundle was validated on, {record.path}, changed since the build (its content hash "
                         "differs from the one in manifest.json); pass --data LABELLED_SET to validate on it as it is now")
    return source
