"""The import paths of modules that moved into packages, kept working.

`vitedge.onnxutil`, `vitedge.cli_options`, `vitedge.calibration.sources` and the other names that
docs, notebooks and user code wrote before the package was grouped into folders still import: a
finder first on `sys.meta_path` answers an old dotted name with the module it names now. It is the
same module object (`vitedge.fsutil is vitedge.files.atomic`), so attributes set through either
name, by `monkeypatch.setattr("vitedge.fsutil.x", ...)` say, are seen by the code. The finder
answers only the names below (and modules inside an old package path); every other import goes on
to Python's own finders. New code imports the new paths.

One old name is not a single module any more: `vitedge.onnxutil` is `vitedge.onnxkit.graph`, which
re-exports the names of the ONNX toolkit's modules (`onnxkit/files`, `metadata`, `session`,
`structure`). Importing through it works; an attribute patched through it is not seen by code that
imports the module holding the name: patch that module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

# old dotted name -> the module or package it moved to
MOVED: dict[str, str] = {
    "vitedge.errors": "vitedge.core.errors",
    "vitedge.limits": "vitedge.core.limits",
    "vitedge.telemetry": "vitedge.core.telemetry",
    "vitedge.cpu": "vitedge.core.cpu",
    "vitedge.memory": "vitedge.core.memory",
    "vitedge.paths": "vitedge.core.paths",
    "vitedge.signals": "vitedge.core.signals",
    "vitedge.ui": "vitedge.core.ui",
    "vitedge.safefile": "vitedge.files.safefile",
    "vitedge.fsutil": "vitedge.files.atomic",
    "vitedge.swap": "vitedge.files.swap",
    "vitedge.outputs": "vitedge.files.outputs",
    "vitedge.outlock": "vitedge.files.lock",
    "vitedge.spec": "vitedge.bundle.spec",
    "vitedge.preprocess": "vitedge.bundle.preprocess",
    "vitedge.manifest": "vitedge.bundle.manifest",
    "vitedge.manifest_sections": "vitedge.bundle.sections",
    "vitedge.manifest_types": "vitedge.bundle.fields",
    "vitedge.bundle_trust": "vitedge.bundle.trust",
    "vitedge.onnxutil": "vitedge.onnxkit.graph",
    "vitedge.export": "vitedge.models.export",
    "vitedge.backends.ort_attention": "vitedge.backends.onnxruntime.attention",
    "vitedge.backends.ort_gemm_bias": "vitedge.backends.onnxruntime.gemm_bias",
    "vitedge.backends.ort_patch_embed": "vitedge.backends.onnxruntime.patch_embed",
    "vitedge.backends.ort_payoff": "vitedge.backends.onnxruntime.payoff",
    "vitedge.profiles": "vitedge.targets.profiles",
    "vitedge.target_families": "vitedge.targets.families",
    "vitedge.target_table": "vitedge.targets.table",
    "vitedge.preflight": "vitedge.app.preflight",
    "vitedge.cli_options": "vitedge.cli.options",
    "vitedge.cli_stats": "vitedge.cli.stats",
    "vitedge.project_config": "vitedge.cli.project_config",
    "vitedge.project_init": "vitedge.cli.project_init",
    "vitedge.commands": "vitedge.cli.commands",
    "vitedge.calibration": "vitedge.datasources",
    "vitedge.datasources._common": "vitedge.datasources.base",
}


def new_name(old: str) -> str | None:
    """The module an old dotted name names now, or None when it is not an old name."""
    if old in MOVED:
        return MOVED[old]
    parent, _, leaf = old.rpartition(".")
    while parent:
        if parent in MOVED:
            return f"{MOVED[parent]}.{old[len(parent) + 1:]}"
        parent, _, leaf = parent.rpartition(".")
    return None


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: types.ModuleType) -> None:
        """The module ran under its new name already."""


class OldPathFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("vitedge."):
            return None
        new = new_name(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    """Put the finder first on sys.meta_path (once): before Python's path finder, which would load a
    module inside an old package path a second time under that name."""
    if not any(isinstance(f, OldPathFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, OldPathFinder())
