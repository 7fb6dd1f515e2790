"""How the test suite is laid out: test files mirror the package (tests/<pkg>/test_*.py for
vitedge/<pkg>/, plus the cross-cutting folders below; vitedge/ has no top-level module to test at tests/),
their names are unique (pytest's default import mode puts each test folder on sys.path), shared
fixtures live in tests/conftest.py (no fixture is copied between test modules), shared plain
helpers in tests/helpers/, and no module under tests/ imports a test module (test_*.py)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
PACKAGE = TESTS.parent / "vitedge"
# Folders of tests/ that mirror no vitedge/ package, and why.
CROSS_CUTTING = {
    "package": "the whole package at once: layers, layout, packaging, the test toolchain, CI recipes",
    "reliability": "bad input and faults by threat, each end to end through the CLI",
    "helpers": "plain helpers shared by test modules (no tests)",
    "fixtures": "recorded files the tests read (no tests)",
}


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


# A test folder named like an importable library shadows it: pytest's prepend mode puts tests/backends/ on
# sys.path for tests/backends/test_*.py, and then `import tensorrt` found tests/backends/tensorrt/ (a namespace
# package with no __version__), so TensorRT looked installed to every later test in that worker. Such a folder
# takes another name, mapped here to the package it mirrors.
RENAMED = {"backends/trt": "backends/tensorrt", "backends/ort": "backends/onnxruntime"}
# Libraries vitedge imports that no test folder may be named after.
SHADOWED = {"tensorrt", "onnx", "onnxruntime", "openvino", "torch", "torchvision", "timm", "transformers", "ray", "nncf",
            "cuda", "numpy", "PIL", "cv2", "click", "rich", "safetensors", "tritonclient", "scipy", "sklearn", "psutil"}


def misplaced_test_files(tests: Path = TESTS, package: Path = PACKAGE) -> list[str]:
    """Test files whose folder mirrors no vitedge/ package and is not a listed cross-cutting folder, or whose
    folder is named like a library it would shadow."""
    bad = []
    for path in sorted(tests.rglob("test_*.py")):
        folder = path.parent.relative_to(tests)
        mirrored = Path(RENAMED.get(folder.as_posix(), folder.as_posix()))
        if any(part in SHADOWED for part in folder.parts):
            bad.append(str(path.relative_to(tests)))
        elif folder.parts and folder.parts[0] not in CROSS_CUTTING and not (package / mirrored / "__init__.py").is_file():
            bad.append(str(path.relative_to(tests)))
    return bad


def repeated_test_names(tests: Path = TESTS) -> dict[str, list[str]]:
    """Test file names used in two folders (pytest's prepend import mode cannot import both)."""
    seen: dict[str, list[str]] = {}
    for path in sorted(tests.rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(tests)))
    return {name: paths for name, paths in seen.items() if len(paths) > 1}


def _is_fixture(node: ast.FunctionDef) -> bool:
    return any("fixture" in ast.unparse(d) for d in node.decorator_list)


def copied_fixtures(tests: Path = TESTS) -> dict[str, list[str]]:
    """Fixtures defined to the letter (decorator, arguments, body; docstrings aside) in two modules:
    a shared fixture belongs in tests/conftest.py."""
    seen: dict[str, list[str]] = {}
    for path in sorted(tests.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and _is_fixture(node):
                body = node.body[1:] if ast.get_docstring(node) is not None else node.body
                key = ast.dump(ast.Module(body=[*node.decorator_list, node.args, *body], type_ignores=[]))
                seen.setdefault(f"{node.name}: {key}", []).append(str(path.relative_to(tests)))
    return {key.split(":")[0]: paths for key, paths in seen.items() if len(paths) > 1}


def test_test_files_mirror_the_package():
    assert not misplaced_test_files(), (
        f"put each test file in the tests/ folder that mirrors the vitedge/ module it tests, "
        f"or in one of {sorted(CROSS_CUTTING)}: {misplaced_test_files()}")
    assert not repeated_test_names(), f"test file names must be unique across tests/: {repeated_test_names()}"
    assert not copied_fixtures(), f"move these fixtures to tests/conftest.py: {copied_fixtures()}"


def test_the_layout_rules_see_a_misplaced_file_a_repeated_name_and_a_copied_fixture(tmp_path):
    package, tests = tmp_path / "vitedge", tmp_path / "tests"
    for folder in (package / "quantize", tests / "quantize", tests / "reliability", tests / "quantise", tests / "onnx"):
        folder.mkdir(parents=True)
    (package / "quantize" / "__init__.py").write_text("")
    fixture = "import pytest\n\n@pytest.fixture\ndef digits(tmp_path):\n    return tmp_path / 'd'\n"
    (tests / "test_cli.py").write_text(fixture)
    (tests / "quantize" / "test_calibrate.py").write_text("")
    (tests / "reliability" / "test_faults.py").write_text(fixture.replace("'d'", "'e'"))
    assert not misplaced_test_files(tests, package) and not repeated_test_names(tests) and not copied_fixtures(tests)
    (tests / "quantise" / "test_calibrate.py").write_text('@pytest.fixture\ndef digits(tmp_path):\n    """x"""\n'
                                                          "    return tmp_path / 'd'\n")
    assert misplaced_test_files(tests, package) == ["quantise/test_calibrate.py"]
    assert repeated_test_names(tests) == {"test_calibrate.py": ["quantise/test_calibrate.py", "quantize/test_calibrate.py"]}
    assert copied_fixtures(tests) == {"digits": ["quantise/test_calibrate.py", "test_cli.py"]}
    (tests / "onnx" / "test_onnx_graphs.py").write_text("")  # a folder that would shadow the onnx library
    assert "onnx/test_onnx_graphs.py" in misplaced_test_files(tests, package)
