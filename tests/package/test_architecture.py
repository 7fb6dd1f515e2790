"""The package's layers, pinned (docs/architecture.md explains them).

One layer is one or a few folders of vitedge/: every module lives in a folder, and its folder
gives its layer (the package's own `__init__` belongs to the lowest layer, `__main__` to the
highest). Every import inside vitedge/ is read from the source with `ast` (module-level and
function-local alike, so a lazy import cannot hide a cycle): a module may import its own folder
or a folder of a lower layer, never a folder of a higher layer nor another folder of its own
layer, and no two modules may import each other, directly or through others.
Function-local imports are only for heavy optional libraries, for project modules that import
one at module level (so `vitedge --help` and `import vitedge.runtime` stay light), and for
build-only modules imported by a module the runtime wheel ships
(packaging/runtime/pyproject.toml), which would otherwise fail to import there.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "vitedge"

# The folders of vitedge/, lowest layer first. A new folder fails the test until it is placed here.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("core",)),
    ("files", ("files",)),
    ("formats", ("bundle", "onnxkit")),
    ("inputs", ("models", "datasources", "camera_apps")),
    ("quantize", ("quantize",)),
    ("backends", ("backends",)),
    ("targets", ("targets", "runtime")),
    ("validation", ("validation",)),
    ("budget", ("budget",)),
    ("scale-out", ("distributed",)),
    ("application", ("app",)),
    ("interface", ("cli",)),
]
# The only modules at the top of vitedge/: the package's face and `python -m vitedge`.
TOP_LEVEL = {"vitedge": "core", "vitedge.__main__": "cli"}
FOLDER_LAYER = {folder: index for index, (_, folders) in enumerate(LAYERS) for folder in folders}

# Libraries whose import is slow or optional: the only ones imported inside functions.
HEAVY = {"torch", "torchvision", "onnx", "onnxruntime", "onnxscript", "openvino", "tensorrt", "cuda", "pycuda",
         "transformers", "timm", "matplotlib", "cv2", "ray", "nncf", "safetensors", "tritonclient", "sklearn",
         "scipy"}
# Imported where used because they may be missing: psutil is optional, resource is POSIX-only.
OPTIONAL = {"psutil", "resource"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _runtime_modules() -> set[str]:
    """The modules the runtime-only distribution ships (packaging/runtime/pyproject.toml)."""
    import tomllib

    cfg = tomllib.loads((PACKAGE.parent / "packaging" / "runtime" / "pyproject.toml").read_text())["tool"]["setuptools"]
    names = set(cfg["py-modules"])
    for package in cfg["packages"]:
        names.add(package)
        names |= {m for m in MODULES if m.rpartition(".")[0] == package}
    return names


RUNTIME_MODULES = _runtime_modules()


def _folder_of(module: str) -> str:
    if module in TOP_LEVEL:
        return TOP_LEVEL[module]
    parts = module.split(".")
    is_package = module in MODULES and MODULES[module].name == "__init__.py"
    if len(parts) == 2 and not is_package:
        raise AssertionError(f"{module} is a module at the top of vitedge/: put it in the folder of its layer "
                             "(tests/package/test_architecture.py, docs/architecture.md)")
    return parts[1]


def _layer_of(module: str) -> int:
    folder = _folder_of(module)
    if folder not in FOLDER_LAYER:
        raise AssertionError(f"vitedge/{folder}/ has no layer: add it to LAYERS in tests/package/test_architecture.py "
                             "and to docs/architecture.md")
    return FOLDER_LAYER[folder]


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not MODULES[module].name == "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> list[tuple[str, bool, int]]:
    """(imported name, is function-local, line) for every import in the module."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    found: list[tuple[str, bool, int]] = []

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name, local, child.lineno) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                target = _resolve(module, child)
                names = [f"{target}.{alias.name}" for alias in child.names]
                found.extend((n if n in MODULES else target, local, child.lineno) for n in names)
            visit(child, inner)

    visit(tree, False)
    return found


def _project_target(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for module in MODULES:
        for name, _, _ in _imports(module):
            if name.split(".")[0] == "vitedge":
                target = _project_target(name)
                if target and target != module and not module.startswith(target + "."):
                    edges[module].add(target)
    return edges


def test_every_module_is_in_a_folder_with_a_layer():
    for module in MODULES:
        _layer_of(module)


def test_every_folder_has_a_layer():
    folders = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert folders == set(FOLDER_LAYER), (f"folders without a layer: {sorted(folders - set(FOLDER_LAYER))}; "
                                          f"layers naming no folder: {sorted(set(FOLDER_LAYER) - folders)}")


def test_no_module_imports_a_higher_layer_or_a_sibling_folder():
    wrong = []
    for module, targets in _edges().items():
        for target in targets:
            mine, theirs = _layer_of(module), _layer_of(target)
            if theirs > mine or (theirs == mine and _folder_of(target) != _folder_of(module)):
                wrong.append(f"{module} ({LAYERS[mine][0]}: {_folder_of(module)}/) imports {target} "
                             f"({LAYERS[theirs][0]}: {_folder_of(target)}/)")
    assert not wrong, "imports against the layer order:\n" + "\n".join(sorted(wrong))


def test_the_layer_rule_sees_a_flat_module_and_an_unplaced_folder():
    with pytest.raises(AssertionError, match="top of vitedge/"):
        _layer_of("vitedge.fsutil")
    with pytest.raises(AssertionError, match="vitedge/newthing/ has no layer"):
        _layer_of("vitedge.newthing.x")
    assert _layer_of("vitedge.cli.commands.build_cmd") == len(LAYERS) - 1
    assert _layer_of("vitedge") == 0 and _layer_of("vitedge.__main__") == len(LAYERS) - 1


def test_no_import_cycle():
    edges = _edges()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def strongconnect(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in MODULES:
        if module not in index:
            strongconnect(module)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def _heavy_at_import(module: str, seen: set[str] | None = None) -> bool:
    """Does importing this module import a heavy library (directly or through project modules)?"""
    seen = set() if seen is None else seen
    if module in seen:
        return False
    seen.add(module)
    for name, local, _ in _imports(module):
        if local:
            continue
        root = name.split(".")[0]
        if root in HEAVY:
            return True
        if root == "vitedge":
            target = _project_target(name)
            if target and target != module and _heavy_at_import(target, seen):
                return True
    return False


def test_function_local_imports_are_only_for_heavy_libraries():
    wrong = []
    for module in MODULES:
        for name, local, line in _imports(module):
            if not local:
                continue
            root = name.split(".")[0]
            if root in HEAVY or root in OPTIONAL:
                continue
            if root == "vitedge":
                target = _project_target(name)
                if target and _heavy_at_import(target):
                    continue
                if target and module in RUNTIME_MODULES and target not in RUNTIME_MODULES:
                    continue  # a build-only module, imported where used by a module the runtime wheel ships
            if root in sys.stdlib_module_names:
                wrong.append(f"{MODULES[module].relative_to(PACKAGE.parent)}:{line} imports {name} (standard library)")
                continue
            wrong.append(f"{MODULES[module].relative_to(PACKAGE.parent)}:{line} imports {name}")
    assert not wrong, ("function-local imports of light modules (import them at the top):\n" + "\n".join(wrong))


@pytest.mark.parametrize("entry", ["vitedge", "vitedge.runtime", "vitedge.cli"])
def test_light_entry_points_import_no_heavy_library(entry):
    import subprocess

    code = (f"import sys, {entry}\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'torch','onnx','onnxruntime','openvino','tensorrt','transformers','timm','ray','matplotlib','cv2'})\n"
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout.strip()
    assert out == "", f"import {entry} pulls in {out}"


def test_the_workflows_reach_tensorrt_through_its_one_entry():
    """`vitedge engine` completes a bundle through backends/tensorrt/completion; the application and
    interface layers import no other module of the TensorRT backend (its internals stay its own)."""
    entry = "vitedge.backends.tensorrt.completion"
    found = [f"{module} line {line}: {name}" for module in MODULES if _folder_of(module) in ("app", "cli")
             for name, _, line in _imports(module)
             if name.startswith("vitedge.backends.tensorrt") and name != entry and not name.startswith(entry + ".")]
    assert not found, f"import the TensorRT backend through {entry} only:\n" + "\n".join(found)
