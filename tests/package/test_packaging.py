"""Packaging: every code package ships, and the data folders are found."""

from __future__ import annotations

import tomllib
from conftest import REPO


def test_every_code_package_is_listed_in_pyproject():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {
        ".".join(p.parent.relative_to(REPO).parts)
        for p in (REPO / "vitedge").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert on_disk <= listed, f"add to pyproject [tool.setuptools] packages: {sorted(on_disk - listed)}"


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    blocks = [b.split("```")[0].strip() for b in readme.split("```bash\n")[1:]]
    assert len(blocks) >= 2, "README must hold the two set-up commands"
    test_command = blocks[1]
    assert "pytest" in test_command
    assert test_command in (REPO / ".ci" / "run").read_text()
