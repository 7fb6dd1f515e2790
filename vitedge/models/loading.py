"""Small helpers every model builder shares: an optional library or a one-line install hint,
weights that must fit the module exactly, and counting numbered blocks in a state dict."""

from __future__ import annotations

import importlib
import re
from typing import Any

from vitedge.core import telemetry
from vitedge.core.errors import MissingDependencyError, ModelLoadError


def require_library(module: str, what: str, extra: str):
    telemetry.silence()  # timm and transformers read Hugging Face Hub's switch when imported
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(what, f"pip install 'vitedge[{extra}]'") from None


def load_strict(module, sd: dict[str, Any], where: str):
    try:
        missing, unexpected = module.load_state_dict(sd, strict=False)
    except RuntimeError as err:  # shape mismatches
        detail = next((ln.strip() for ln in str(err).splitlines() if "size mismatch" in ln), str(err).splitlines()[0])
        raise ModelLoadError(f"{where}: the weights do not fit the model built for them: {detail[:200]}") from err
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {missing[0]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {unexpected[0]})")
        raise ModelLoadError(f"{where}: the weights do not fit the model built for them: {'; '.join(parts)}")
    return module.eval()


def count_indices(sd: dict[str, Any], pattern: str) -> int:
    rx = re.compile(pattern)
    idx = {int(m.group(1)) for k in sd if (m := rx.match(k))}
    return (max(idx) + 1) if idx else 0
