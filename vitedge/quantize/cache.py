"""On-disk cache of calibration statistics.

An entry is keyed by everything that changes the statistics: the FP32 graph's sha256,
the calibration set's data_hash, the preprocessing, the method and its parameters, the
SmoothQuant setting and the quantizer version. A second run with the same key reads
the entry and runs no forward pass; any change of key calibrates again. Entries are
single ``.npz`` files written atomically; one that cannot be read is ignored (and
rewritten by the calibration that follows), never an error.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from vitedge.files.atomic import atomic_write_path
from vitedge.core.paths import check_path

ENV_VAR = "VITEDGE_CACHE_DIR"
_FORMAT = "vitedge-calibration-cache-1"


def default_cache_dir() -> Path:
    env = os.environ.get(ENV_VAR)
    if env:
        check_path(env, f"{ENV_VAR} names")
        return Path(env).expanduser()
    return Path("~/.cache/vitedge").expanduser()


def cache_key(parts: dict[str, Any]) -> str:
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class CalibrationCache:
    """``kind`` is the entries' folder under the root: ``calibration`` (statistics) or
    ``refinement`` (GPTQ weights, corrected biases: vitedge.quantize.refine)."""

    def __init__(self, root: str | os.PathLike[str] | None = None, kind: str = "calibration"):
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()
        self.kind = kind

    def path_for(self, key: str) -> Path:
        return self.root / self.kind / f"{key}.npz"

    def load(self, key: str) -> dict[str, Any] | None:
        """The stored entry, or None when absent, unreadable or not for this key."""
        path = self.path_for(key)
        if not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(str(data["meta"]))
                if meta.get("format") != _FORMAT or meta.get("key") != key:
                    return None
                arrays = {k: np.array(data[k]) for k in data.files if k != "meta"}
        except Exception:  # corrupt, truncated, foreign: recalibrate and overwrite
            return None
        return {"meta": meta, "arrays": arrays}

    def save(self, key: str, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Path:
        path = self.path_for(key)
        payload = dict(meta, format=_FORMAT, key=key)
        with atomic_write_path(path) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, meta=np.array(json.dumps(payload, sort_keys=True)), **arrays)
        return path
