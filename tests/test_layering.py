"""Layers import only downward: the backends (layer 4) import none of the layers above them, not
even in a function (the application layer, vitedge/build/, drives them)."""

from __future__ import annotations

import ast
from pathlib import Path

import vitedge

PACKAGE = Path(vitedge.__file__).parent
ABOVE_BACKENDS = ("vitedge.validation", "vitedge.profiles", "vitedge.families", "vitedge.build", "vitedge.calibration",
                  "vitedge.camera_apps", "vitedge.runtime", "vitedge.preflight", "vitedge.budget", "vitedge.commands",
                  "vitedge.cli", "vitedge.cli_options", "vitedge.cli_stats", "vitedge.target_table", "vitedge.project_config", "vitedge.project_init")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return names


def test_backends_import_no_upper_layer():
    wrong = [f"{p.relative_to(PACKAGE.parent)} imports {name}" for p in sorted((PACKAGE / "backends").rglob("*.py"))
             for name in _imports(p) if any(name == up or name.startswith(up + ".") for up in ABOVE_BACKENDS)]
    assert not wrong, "\n".join(wrong)


def test_tensorrt_backend_and_bundle_do_not_import_each_other():
    bundle = _imports(PACKAGE / "backends" / "tensorrt" / "bundle.py")
    assert "vitedge.backends.tensorrt.backend" not in bundle
