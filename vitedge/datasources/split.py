"""A data folder laid out as a split: ``PARENT/calib/`` + ``PARENT/val/`` (or ``train/`` + ``val/``).

Passed as ``--calib PARENT``, such a folder is the calibration part plus the validation
part, not a labelled set with two classes called "calib" and "val". A folder is a split
only when its non-hidden entries are exactly those two subfolders and the model does not
have classes of those names.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# (calibration part, validation part), in the order they are tried
LAYOUTS: tuple[tuple[str, str], ...] = (("calib", "val"), ("train", "val"))


@dataclass(frozen=True)
class DataSplit:
    parent: Path
    calib: Path
    val: Path

    def one_line(self) -> str:
        return f"{self.parent} is a split: calibration {self.calib.name}/, validation {self.val.name}/"


def find_split(path: str | os.PathLike[str], class_names: Sequence[str] | None = None) -> DataSplit | None:
    """The split ``path`` holds, or None when it is anything else (a file, a class-folder set, ...)."""
    parent = Path(path).expanduser()
    if not parent.is_dir():
        return None
    try:
        entries = {e.name: e for e in os.scandir(parent) if not e.name.startswith(".")}
    except OSError:
        return None
    for calib, val in LAYOUTS:
        if set(entries) != {calib, val} or not all(entries[n].is_dir() for n in (calib, val)):
            continue
        if class_names is not None and {calib, val} <= set(class_names):
            return None  # the model's own classes happen to have these names
        return DataSplit(parent, parent / calib, parent / val)
    return None


def calibration_part(path: Path, class_names: Sequence[str] | None = None) -> tuple[Path, DataSplit | None]:
    """``--calib`` as given, or the calibration part of the split it names."""
    split = find_split(path, class_names)
    return (split.calib if split else path), split


def validation_part(path: Path, class_names: Sequence[str] | None = None) -> tuple[Path, DataSplit | None]:
    """``--val`` / ``--data`` as given, or the validation part of the split it names."""
    split = find_split(path, class_names)
    return (split.val if split else path), split


def resolve_data(calib: Path, val: Path | None, class_names: Sequence[str] | None = None) -> tuple[Path, Path | None, list[str]]:
    """`build`'s --calib and --val: a split --calib gives its calibration part, and its validation
    part when there is no --val; a split --val gives its validation part. Notes say what was recognised."""
    calib_path, split = calibration_part(Path(calib), class_names)
    notes = [split.one_line()] if split else []
    if val is None:
        return calib_path, (split.val if split else None), notes
    val_path, val_split = validation_part(Path(val), class_names)
    if val_split and val_split != split:
        notes.append(val_split.one_line())
    return calib_path, val_path, notes
