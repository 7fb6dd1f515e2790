"""How the test suite is laid out: shared fixtures live in tests/conftest.py, shared plain helpers
in tests/helpers/, and no module under tests/ imports a test module (test_*.py)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def collect_test_module_names(root: Path = TESTS) -> set[str]:
    """The import names of every test module under ``root`` (tests/reliability/ included)."""
    return {p.stem for p in root.rglob("test_*.py")}


def _call_name(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def imported_test_modules(source: str, test_names: set[str]) -> list[str]:
    """The imports in ``source`` (anywhere: top level or inside a function) that reach a test module,
    as written: ``import test_x``, ``from test_x import y``, ``from tests.test_x import y``,
    ``from tests import test_x``, ``__import__("test_x")``, ``importlib.import_module("tests.test_x")``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            dotted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            dotted = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom):  # from . import test_x
            dotted = [alias.name for alias in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and _call_name(node) in ("__import__", "import_module")):
            dotted = [node.args[0].value]  # __import__("test_x"), importlib.import_module("test_x")
        else:
            continue
        found += [f"line {node.lineno}: {name}" for name in dotted if set(name.split(".")) & test_names]
    return found


def test_no_module_under_tests_imports_a_test_module():
    names = collect_test_module_names()
    assert {"test_cli", "test_faults", "test_layout_rules"} <= names  # tests/reliability/ is walked too
    offenders = {}
    for path in sorted(TESTS.rglob("*.py")):
        hits = imported_test_modules(path.read_text(), names)
        if hits:
            offenders[str(path.relative_to(TESTS))] = hits
    assert not offenders, ("test modules must not be imported; move shared fixtures to tests/conftest.py and plain "
                           f"helpers to tests/helpers/: {offenders}")


def test_the_rule_sees_every_import_form():
    names = {"test_x", "test_faults"}
    for source in ("import test_x", "import test_x as t", "from test_x import y", "from tests.test_x import y",
                   "from tests import test_x", "from . import test_x", "from reliability.test_faults import z",
                   "def f():\n    from test_x import y\n", "__import__('test_x').CALIB_DIR",
                   "importlib.import_module('tests.test_x')", "import_module('test_x')"):
        assert imported_test_modules(source, names), source
    for source in ("import pytest", "from helpers.cli import run_vitedge", "from conftest import REPO",
                   "from testing_x import test_y", "import test_xyz",
                   "__import__('numpy')", "print('test_x')"):
        assert not imported_test_modules(source, names), source
