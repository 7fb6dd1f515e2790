"""The package's layers, pinned (docs/architecture.md explains them).

Every import inside vitedge/ is read from the source with `ast` (module-level and
function-local alike, so a lazy import cannot hide a cycle) and checked against the
layer order below: a module may import its own layer or a lower one, never a higher
one, and no two modules may import each other, directly or through others.
Function-local imports are only for heavy optional libraries, for project modules
that import one at module level (so `vitedge --help` and `import vitedge.runtime` stay
light), and for build-only modules imported by a module the runtime wheel ships
(packaging/runtime/pyproject.toml), which would otherwise fail to import there.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "vitedge"

# Lowest first. A module is placed by its longest matching prefix.
LAYERS: list[tuple[str, list[str]]] = [
    ("core", ["vitedge", "vitedge.core", "vitedge.files", "vitedge.bundle", "vitedge.onnxkit", "vitedge.core.errors", "vitedge.core.paths", "vitedge.core.signals", "vitedge.files.swap", "vitedge.files.atomic",
              "vitedge.files.safefile", "vitedge.spec", "vitedge.core.cpu", "vitedge.bundle.preprocess", "vitedge.core.ui",
              "vitedge.core.json_sections", "vitedge.bundle.trust", "vitedge.bundle.fields", "vitedge.bundle.sections", "vitedge.bundle.manifest",
              "vitedge.files.outputs", "vitedge.onnxkit.graph", "vitedge.core.memory",
              "vitedge.core.limits", "vitedge.files.lock", "vitedge.core.telemetry"]),
    ("inputs", ["vitedge.datasources", "vitedge.calibration", "vitedge.models", "vitedge.models.export", "vitedge.camera_apps"]),
    ("quantize", ["vitedge.quantize"]),
    ("backends", ["vitedge.backends"]),
    ("targets", ["vitedge.targets", "vitedge.runtime", "vitedge.targets.profiles", "vitedge.targets.families", "vitedge.targets.table"]),
    ("validation", ["vitedge.validation", "vitedge.app.preflight"]),
    ("budget", ["vitedge.budget"]),
    ("scale-out", ["vitedge.distributed"]),
    ("application", ["vitedge.app", "vitedge.cli.project_config", "vitedge.cli.project_init"]),
    ("interface", ["vitedge.cli", "vitedge.cli.commands", "vitedge.cli.entry", "vitedge.cli.options", "vitedge.cli.stats",
                   "vitedge.__main__"]),
]

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


def _layer_of(module: str) -> int:
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            nested = prefix != "vitedge" and module.startswith(prefix + ".")  # the package root holds only itself
            if (module == prefix or nested) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best is None:
        raise AssertionError(f"{module} has no layer: add it to LAYERS in tests/package/test_architecture.py "
                             "and to docs/architecture.md")
    return best


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


def test_every_module_has_a_layer():
    for module in MODULES:
        _layer_of(module)


def test_no_module_imports_a_higher_layer():
    wrong = []
    for module, targets in _edges().items():
        for target in targets:
            if _layer_of(target) > _layer_of(module):
                wrong.append(f"{module} ({LAYERS[_layer_of(module)][0]}) imports {target} "
                             f"({LAYERS[_layer_of(target)][0]})")
    assert not wrong, "imports against the layer order:\n" + "\n".join(sorted(wrong))


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


@pytest.mark.parametrize("entry", ["vitedge", "vitedge.runtime", "vitedge.cli.entry"])
def test_light_entry_points_import_no_heavy_library(entry):
    import subprocess

    code = (f"import sys, {entry}\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'torch','onnx','onnxruntime','openvino','tensorrt','transformers','timm','ray','matplotlib','cv2'})\n"
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout.strip()
    assert out == "", f"import {entry} pulls in {out}"
