"""Where vitedge's data folders are: a checkout's top-level `targets/` and `calibration/`,
or the copies packaged inside the wheel (vitedge._data_targets, vitedge._data_calibration).

Target profiles may also come from folders of your own: list them in the environment variable
VITEDGE_TARGETS_PATH (separated by ``os.pathsep``, ``:`` on Linux). They are searched first, in
order, then vitedge's own `targets/`; a profile named in an earlier folder hides one of the same
name in a later one. Families are in each folder's `families/`.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from vitedge.errors import UsageError

_CHECKOUT = Path(__file__).resolve().parents[1]


def _find(folder: str, package: str) -> Path:
    local = _CHECKOUT / folder
    if local.is_dir():
        return local

    return Path(str(resources.files(package)))


def targets_dir() -> Path:
    return _find("targets", "vitedge._data_targets")


TARGETS_PATH_ENV = "VITEDGE_TARGETS_PATH"


def targets_dirs() -> list[Path]:
    """The folders of target profiles, searched in this order: VITEDGE_TARGETS_PATH's, then vitedge's own."""
    extra = [Path(p).expanduser() for p in os.environ.get(TARGETS_PATH_ENV, "").split(os.pathsep) if p]
    for folder in extra:
        if not folder.is_dir():
            raise UsageError(f"{TARGETS_PATH_ENV} names {folder}, which is not a folder; fix or unset {TARGETS_PATH_ENV}")
    return [*extra, targets_dir()]


def target_files(sub: str = "") -> list[Path]:
    """Every ``*.toml`` in ``sub`` of the target folders, one per name (the first folder's), sorted by name."""
    found: dict[str, Path] = {}
    for folder in targets_dirs():
        for path in sorted((folder / sub).glob("*.toml")):
            found.setdefault(path.stem, path)
    return [found[name] for name in sorted(found)]


def find_target_file(name: str, sub: str = "") -> Path | None:
    """``sub/NAME.toml`` in the first target folder holding it, or None."""
    return next((folder / sub / f"{name}.toml" for folder in targets_dirs() if (folder / sub / f"{name}.toml").is_file()), None)


def calibration_dir() -> Path:
    return _find("calibration", "vitedge._data_calibration")


def cache_dir() -> Path:
    return Path(os.environ.get("VITEDGE_CACHE_DIR") or Path.home() / ".cache" / "vitedge")
