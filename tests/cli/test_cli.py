"""The CLI as a user meets it: one-line errors, exit codes, nothing half-written, light start-up."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO
from helpers.cli import vitedge_in_process


def vitedge_process(*args, cwd=None):
    """``python -m vitedge ARGS`` in a child: for what only a process shows (its exit status, a traceback or none on
    stderr). The other tests run the CLI's entry in this process (``vitedge``)."""
    return subprocess.run([sys.executable, "-m", "vitedge", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=600)


def vitedge(*args, cwd=None, process=False):
    return (vitedge_process if process else vitedge_in_process)(*args, cwd=cwd)


def test_help_and_import_do_not_load_heavy_modules():
    code = (
        "import sys, vitedge, vitedge.cli.entry\n"
        "from click.testing import CliRunner\n"
        "r = CliRunner().invoke(vitedge.cli.entry.cli, ['--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        "heavy = [m for m in ('torch', 'onnxruntime', 'openvino', 'tensorrt', 'onnx') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_inspect_prints_facts_and_sources(timm_vit):
    r = vitedge("inspect", timm_vit[1])
    assert r.returncode == 0, r.stderr
    for word in ("timm", "32 x 32", "tokens", "17", "192", "heads", "preset", "10 classes", "bicubic", "0.485"):
        assert word in r.stdout
    js = vitedge("inspect", timm_vit[1], "--json")
    spec = json.loads(js.stdout)
    assert spec["num_tokens"] == 17 and spec["sources"]["preprocess"] == "default"


def test_export_cli_writes_checked_graph(timm_vit, tmp_path):
    out = tmp_path / "m.onnx"
    r = vitedge("export", timm_vit[1], "-o", out)
    assert r.returncode == 0, r.stderr
    assert "max |PyTorch - ONNX Runtime|" in r.stdout and out.exists()
    r2 = vitedge("export", timm_vit[1], "-o", out)
    assert r2.returncode == 2 and "--force" in r2.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["inspect", "missing.pt"], "does not exist"),
        (["export", "missing.pt", "-o", "OUT"], "does not exist"),
        (["inspect", "MODEL", "--model-kwargs", "{bad"], "not valid JSON"),
        (["inspect", "MODEL", "--input-size", "30", "32"], "multiple of the patch size"),
        (["inspect", "MODEL", "--arch", "vit_b_16"], "pick the matching --arch"),
        (["export", "MODEL", "-o", "OUT", "--opset", "11"], "at least 17"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(args, message, timm_vit, tmp_path):
    out = tmp_path / "out.onnx"
    args = [str(timm_vit[1]) if a == "MODEL" else str(out) if a == "OUT" else a for a in args]
    r = vitedge(*args, cwd=tmp_path, process="missing.pt" in args)  # the cheap ones (no model loaded) as a real process
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in r.stderr
    assert not out.exists()


def test_debug_shows_traceback(tmp_path):
    r = vitedge("--debug", "inspect", tmp_path / "missing.pt", process=True)
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_unsafe_pickle_message_explains_risk(timm_vit, tmp_path):
    import torch

    path = tmp_path / "whole.pt"
    torch.save(timm_vit[0], path)
    r = vitedge("inspect", path)
    assert r.returncode == 2 and "arbitrary code" in r.stderr and "--trust-pickle" in r.stderr
    assert vitedge("inspect", path, "--trust-pickle").returncode == 0


def test_list_archs():
    r = vitedge("inspect", "--list-archs")
    assert r.returncode == 0 and "vit_base_patch16_224" in r.stdout and "deit_base_distilled_patch16_224" in r.stdout


def test_help_lists_each_command_with_its_own_short_help():
    """`vitedge --help` reads the short help from the command modules' source (no import): it must be
    what the command itself says."""
    from vitedge.cli.entry import COMMANDS, _listed_command, cli

    for name in COMMANDS:
        real = cli.get_command(None, name)
        assert _listed_command(name).get_short_help_str(60) == real.get_short_help_str(60), name


@pytest.mark.parametrize("where", ["vitedge-error", "click-usage-error"])
def test_error_line_shows_control_characters_instead_of_sending_them(tmp_path, where):
    """A name from a file or a flag that holds an escape sequence (here OSC 52, a clipboard write, and a line break)
    is printed as \\xNN in the one error line: it never reaches the terminal, and the error stays one line."""
    hostile = "m\x1b]52;c;aGk=\x07\nx.pt"
    if where == "vitedge-error":  # our own error, naming the missing model file
        r = vitedge("build", tmp_path / hostile, "-t", "onnx", "--calib", tmp_path, "-o", tmp_path / "out", process=True)
    else:  # click's own, naming the argument it did not expect (unquoted: a --flag's value it would show as repr)
        r = vitedge("build", "model.pt", hostile, "-t", "onnx", "--calib", tmp_path, process=True)
    assert r.returncode == 2, r.stderr
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("vitedge:")]
    assert len(errors) == 1 and "m\\x1b]52;c;aGk=\\x07 x.pt" in errors[0], r.stderr
    assert not any(ln.startswith("x.pt") for ln in r.stderr.splitlines()), r.stderr  # no line broken by the name
