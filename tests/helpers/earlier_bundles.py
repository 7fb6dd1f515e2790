"""Bundles as vitedge wrote them before a schema change, for the tests that keep old bundles readable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def rename_artifacts(bundle: Path, **artifacts: Any) -> Path:
    """Rewrite ``bundle``'s manifest in place with these ``artifacts`` entries and without ``artifacts.single_graph``
    (the two-copy layout written before one-graph bundles), its files hashed again so that it verifies."""
    from vitedge.bundle.manifest import Manifest

    d = json.loads((bundle / "manifest.json").read_text())
    d["artifacts"].update(artifacts)
    d["artifacts"].pop("single_graph")
    manifest = Manifest.from_dict(d)
    manifest.hash_files(bundle)
    manifest.write(bundle)
    return bundle
