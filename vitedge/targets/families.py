"""Target families: `jetson` and `nvidia-gpu` name several device profiles at once.

A family file (`targets/families/NAME.toml`, or `families/` in a VITEDGE_TARGETS_PATH folder)
lists its member profiles and the rules that recognise each member's device from facts read on
it (the device-tree model and compatible strings, the L4T release). `vitedge build --target
jetson` builds one portable bundle with a plan per member; `vitedge engine BUNDLE` on the device
picks the member with `select_member`.
"""

from __future__ import annotations

from pathlib import Path

from vitedge.backends.tensorrt.members import (  # noqa: F401 - the family types, re-exported
    FamilyOptions,
    MatchRule,
    ModuleFacts,
    TargetFamily,
    parse_family,
    select_member,
)
from vitedge.core.errors import ProfileError
from vitedge.core.paths import find_target_file, target_files
from vitedge.files.safefile import BadDocument, read_toml

FAMILIES_DIR = "families"


def list_families() -> list[Path]:
    return target_files(FAMILIES_DIR)


def is_family(name: str) -> bool:
    return "/" not in name and not name.endswith(".toml") and find_target_file(name, FAMILIES_DIR) is not None


def load_family(name: str) -> TargetFamily:
    path = find_target_file(name, FAMILIES_DIR) if "/" not in name else None
    if path is None:
        known = ", ".join(p.stem for p in list_families())
        raise ProfileError(f"unknown target family '{name}'; known families: {known}")
    try:
        data = read_toml(path)
    except BadDocument as err:
        raise ProfileError(str(err)) from None
    except OSError as err:
        raise ProfileError(f"{path}: cannot be read as a target family ({err})") from None
    return parse_family(data, path)
