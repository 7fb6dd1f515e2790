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

from vitedge.core.errors import UsageError

_CHECKOUT = Path(__file__).resolve().parents[2]

# What the file system takes when it cannot say (Linux: 255 bytes per name, 4096 per path)
NAME_MAX = 255
PATH_MAX = 4096


def _nearest_existing(path: str) -> str:
    folder = os.path.dirname(os.path.abspath(path)) or os.sep
    while True:
        try:
            if os.path.isdir(folder):
                return folder
        except (OSError, ValueError):
            pass
        parent = os.path.dirname(folder)
        if parent == folder:
            return folder
        folder = parent


def _limit(folder: str, name: str, default: int) -> int:
    try:
        return int(os.pathconf(folder, name))
    except (OSError, ValueError, AttributeError, TypeError):
        return default


def path_problem(text: str | os.PathLike) -> str | None:
    """What makes ``text`` a path the OS would refuse, or None: bytes that are not UTF-8 (a name read with
    surrogateescape), a NUL, a name longer than the file system's limit (NAME_MAX, 255 bytes on most) or a whole
    path longer than PATH_MAX. Checked where a path enters (flags, vitedge.toml, matrix.toml, environment
    variables): left to the OS, each was an OSError or UnicodeEncodeError deep in a run (exit 3)."""
    text = os.fspath(text)
    text = os.fsdecode(text) if isinstance(text, bytes) else str(text)
    if "\0" in text:
        return "holds a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "holds bytes that are not UTF-8 (shown as \\udcNN); rename it with UTF-8 characters"
    folder = _nearest_existing(text)
    longest = max((part for part in text.split(os.sep)), key=lambda p: len(os.fsencode(p)), default="")
    name_max = _limit(folder, "PC_NAME_MAX", NAME_MAX)
    if len(os.fsencode(longest)) > name_max:
        return (f"has a name of {len(os.fsencode(longest))} bytes ({longest[:24]}...), longer than this file system's "
                f"limit of {name_max} bytes per name; use a shorter name")
    path_max = _limit(folder, "PC_PATH_MAX", PATH_MAX)
    size = len(os.fsencode(os.path.abspath(text)))
    if size >= path_max:
        return f"is {size} bytes long as an absolute path, over this system's limit of {path_max - 1}; use a shorter path"
    return None


def check_path(text: str | os.PathLike, what: str) -> None:
    """A one-line UsageError naming ``what`` when the OS would refuse the path (see path_problem)."""
    problem = path_problem(text)
    if problem is not None:
        raise UsageError(f"{what} {str(os.fspath(text))[:120]} {problem}")


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
        check_path(folder, f"{TARGETS_PATH_ENV} names")
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
    env = os.environ.get("VITEDGE_CACHE_DIR")
    if env:
        check_path(env, "VITEDGE_CACHE_DIR names")
    return Path(env or Path.home() / ".cache" / "vitedge")
