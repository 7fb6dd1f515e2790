"""Where vitedge's data folders are: a checkout's top-level `targets/` and `calibration/`,
or the copies packaged inside the wheel (vitedge._data_targets, vitedge._data_calibration)."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[1]


def _find(folder: str, package: str) -> Path:
    local = _CHECKOUT / folder
    if local.is_dir():
        return local

    return Path(str(resources.files(package)))


def targets_dir() -> Path:
    return _find("targets", "vitedge._data_targets")


def calibration_dir() -> Path:
    return _find("calibration", "vitedge._data_calibration")


def cache_dir() -> Path:
    return Path(os.environ.get("VITEDGE_CACHE_DIR") or Path.home() / ".cache" / "vitedge")
