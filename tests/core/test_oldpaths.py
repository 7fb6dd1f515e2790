"""Old import paths (before the modules moved into folders) still import, as the same module object."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from vitedge.core import oldpaths

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("old", sorted(oldpaths.MOVED))
def test_every_old_path_is_the_new_module(old):
    assert importlib.import_module(old) is importlib.import_module(oldpaths.MOVED[old])


def test_documented_old_forms_work_in_a_fresh_interpreter():
    code = (
        "import vitedge.fsutil, vitedge.files.atomic\n"
        "from vitedge import onnxutil, cli_options\n"
        "from vitedge.calibration.sources import open_source\n"
        "from vitedge.commands import build_cmd\n"
        "from vitedge.backends.ort_payoff import Int8Payoff\n"
        "import vitedge.onnxkit.graph as graph, vitedge.cli.options as options, vitedge.cli.commands.build_cmd as b\n"
        "import vitedge.datasources.sources as sources\n"
        "assert vitedge.fsutil is vitedge.files.atomic and onnxutil is graph and cli_options is options\n"
        "assert build_cmd is b and open_source is sources.open_source\n"
        "import vitedge.commands.build_cmd as old_b, sys\n"
        "assert old_b is b and sys.modules['vitedge.commands.build_cmd'] is b\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_patching_through_an_old_path_reaches_the_code(monkeypatch):
    from vitedge.files import atomic

    monkeypatch.setattr("vitedge.fsutil.sha256_file", lambda path: "patched")
    assert atomic.sha256_file(Path("anything")) == "patched"


def test_only_old_names_are_answered():
    assert oldpaths.new_name("vitedge.commands.build_cmd") == "vitedge.cli.commands.build_cmd"
    assert oldpaths.new_name("vitedge.files.atomic") is None
    assert oldpaths.new_name("vitedge.runtime") is None
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("vitedge.no_such_module")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("vitedge.commands.no_such_cmd")
