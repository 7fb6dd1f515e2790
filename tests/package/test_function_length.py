"""No long functions in vitedge/ (issue 27 item 3): at most 80 lines, a command's at most 40.

Lines are counted from `def` to the function's last line, docstring included; decorators are
not counted (a command's click options declare its flags, they do no work).

A function that long does several jobs; split it into named steps a reader can follow.
The test prints the longest functions either way (`pytest -s` shows them), so a reviewer
sees how close the package is to the limit.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "vitedge"
MAX_LINES = 80
MAX_COMMAND_LINES = 40


def function_lengths(root: Path) -> list[tuple[int, str, str, bool]]:
    """(lines, file, qualified name, is a command module's function), every function under root."""
    rows = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        relative = path.relative_to(root.parent).as_posix()
        is_command = path.parent.name == "commands"

        def walk(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = f"{prefix}{child.name}"
                    # From `def` to the last line: decorators (a command's click options) declare, they do not run.
                    rows.append((child.end_lineno - child.lineno + 1, relative, name, is_command))
                    walk(child, name + ".")
                elif isinstance(child, ast.ClassDef):
                    walk(child, f"{prefix}{child.name}.")

        walk(tree, "")
    return sorted(rows, reverse=True)


def test_no_function_is_too_long():
    rows = function_lengths(PACKAGE)
    print("\nlongest functions in vitedge/:")
    for lines, where, name, _ in rows[:5]:
        print(f"  {lines:4d}  {where}:{name}")
    too_long = [f"{where}:{name} has {lines} lines (limit {MAX_LINES})"
                for lines, where, name, _ in rows if lines > MAX_LINES]
    too_long += [f"{where}:{name} has {lines} lines (a command's limit is {MAX_COMMAND_LINES})"
                 for lines, where, name, command in rows if command and MAX_COMMAND_LINES < lines <= MAX_LINES]
    assert not too_long, "split these into named steps:\n" + "\n".join(too_long)


def test_the_measure_counts_nested_functions_not_decorators(tmp_path):
    package = tmp_path / "pkg"
    (package / "commands").mkdir(parents=True)
    body = "\n".join(f"    x{i} = {i}" for i in range(45))
    (package / "commands" / "cmd.py").write_text(f"@decorator\ndef command():\n{body}\n")
    nested = "\n".join(f"            x{i} = {i}" for i in range(45))
    (package / "lib.py").write_text(f"class A:\n    def method(self):\n        def inner():\n{nested}\n")
    rows = {name: (lines, command) for lines, _, name, command in function_lengths(package)}
    assert rows["command"] == (46, True)
    assert rows["A.method.inner"] == (46, False)
    assert rows["A.method"] == (47, False)
