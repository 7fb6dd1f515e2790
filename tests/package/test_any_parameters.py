"""Parameters say what flows: at most MAX_BARE_ANY parameters in vitedge/ are typed bare ``Any``.

The ones left are a real "any JSON/TOML value" (a document being checked, a click value) or a
foreign object with no stub (TensorRT and cuda-python handles, tritonclient's protobufs, whatever
``torch.load`` returns), and ``*args``/``**kwargs`` passed through unchanged. An ONNX model is an
``onnx.ModelProto``, a TensorRT module a ``ModuleType``, a backend's options its own dataclass
(``Backend[O]``), a value checked at run time an ``object``."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "vitedge"
MAX_BARE_ANY = 40


def _is_bare_any(annotation: ast.expr | None) -> bool:
    if isinstance(annotation, ast.Name):
        return annotation.id == "Any"
    if isinstance(annotation, ast.Attribute):
        return annotation.attr == "Any" and isinstance(annotation.value, ast.Name) and annotation.value.id in ("typing", "t")
    if isinstance(annotation, ast.Constant):
        return annotation.value == "Any"
    return False


def bare_any_parameters(source: str, name: str = "<source>") -> list[str]:
    """``file:line function(parameter)`` for every parameter annotated bare ``Any`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(p for p in (a.vararg, a.kwarg) if p is not None)]
            found += [f"{name}:{node.lineno} {node.name}({p.arg})" for p in params if _is_bare_any(p.annotation)]
    return found


def test_the_counter_sees_every_kind_of_parameter():
    source = ("from typing import Any\nimport typing\n"
              "def f(a: Any, /, b: typing.Any, *args: Any, c: 'Any', d: int, **kwargs: Any) -> Any: ...\n"
              "class C:\n    async def g(self, x: Any | None, y: list[Any]) -> None: ...\n")
    assert [f.split(" ")[1] for f in bare_any_parameters(source)] == ["f(a)", "f(b)", "f(c)", "f(args)", "f(kwargs)"]


def test_bare_any_parameters_stay_few():
    found = [hit for path in sorted(PACKAGE.rglob("*.py"))
             for hit in bare_any_parameters(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))]
    assert len(found) <= MAX_BARE_ANY, (
        f"{len(found)} parameters typed bare Any (at most {MAX_BARE_ANY}): give each its type "
        "(onnx.ModelProto under TYPE_CHECKING, the backend's options, object for a value checked at run time):\n"
        + "\n".join(found))
