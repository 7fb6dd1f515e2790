"""One source for every CLI option and default (issue 16): the flags several commands take are
declared once in vitedge/cli/options.py, their choices come from the quantizer's registries,
and the validation defaults live in vitedge/validation/defaults.py only."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path

import click
import pytest
from conftest import REPO

from vitedge.cli.entry import COMMANDS, cli

PACKAGE = REPO / "vitedge"
DEFAULTS_MODULE = PACKAGE / "validation" / "defaults.py"


def command(name: str) -> click.Command:
    return cli.get_command(click.Context(cli), name)


def option(cmd: str, name: str) -> click.Option:
    return next(p for p in command(cmd).params if p.name == name)


@pytest.mark.parametrize("cmd", ["build", "calibrate"])
def test_quantizer_choices_are_the_registries(cmd):
    from vitedge.quantize.config import METHODS
    from vitedge.quantize.weight_range import WEIGHT_RANGES

    assert option(cmd, "method").type.choices == METHODS
    assert option(cmd, "weight_range").type.choices == WEIGHT_RANGES


def test_calibrate_help_shows_the_quantizer_defaults():
    from click.testing import CliRunner

    from vitedge.quantize.config import QuantConfig

    d = QuantConfig()
    text = " ".join(CliRunner().invoke(cli, ["calibrate", "--help"], terminal_width=200).output.split())
    for shown in (f"[default: {d.method}]", f"[default: {d.percentile}]", f"[default: {d.smoothquant_alpha}]",
                  f"[default: {'yes' if d.quantize_attention else 'no'}]", f"[default: {d.weight_range},"):
        assert shown in text, shown
    assert "{" not in text  # every placeholder filled


def test_gate_flags_are_one_set_of_threshold_fields():
    from vitedge.cli.options import THRESHOLD_FLAGS
    from vitedge.targets.profiles import Thresholds

    fields = {f.name for f in dataclasses.fields(Thresholds)}
    names = {flag[2:].replace("-", "_") for flag in THRESHOLD_FLAGS}
    assert names <= fields
    for cmd in ("build", "validate"):
        for name in names:
            opt = option(cmd, name)
            assert opt.default is None and opt.help == THRESHOLD_FLAGS[opt.opts[0]], (cmd, name)


def test_validation_defaults_have_one_value_everywhere():
    from vitedge.budget import BudgetSettings
    from vitedge.validation import defaults
    from vitedge.validation.bundle import ValidateOptions
    from vitedge.validation.compare import compare_reports
    from vitedge.validation.latency import LatencySettings
    from vitedge.validation.sensitivity import first_inputs

    samples = defaults.DEFAULT_SENSITIVITY_SAMPLES
    assert option("validate", "sensitivity_samples").default == samples
    assert ValidateOptions().sensitivity_samples == samples == BudgetSettings().sensitivity_samples
    assert inspect.signature(first_inputs).parameters["count"].default == samples
    assert option("validate", "latency_seconds").default == defaults.DEFAULT_LATENCY_SECONDS == LatencySettings().min_seconds
    params = inspect.signature(compare_reports).parameters
    assert params["max_accuracy_regression"].default == defaults.DEFAULT_MAX_ACCURACY_REGRESSION
    assert option("compare", "max_accuracy_regression").default == defaults.DEFAULT_MAX_ACCURACY_REGRESSION
    assert params["max_latency_regression"].default == defaults.DEFAULT_MAX_LATENCY_REGRESSION
    from vitedge.validation.compare import parse_fraction

    assert parse_fraction(option("compare", "max_latency_regression").default) == defaults.DEFAULT_MAX_LATENCY_REGRESSION


def _assigned_literals(tree: ast.AST) -> dict[str, int]:
    """Names assigned a number literal at module level: name -> line."""
    out = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        value = getattr(node, "value", None)
        if isinstance(value, ast.Constant) and isinstance(value.value, (int, float)) and not isinstance(value.value, bool):
            out.update({t.id: node.lineno for t in targets if isinstance(t, ast.Name)})
    return out


def test_validation_defaults_are_assigned_only_in_their_module():
    from vitedge.validation import defaults

    names = {n for n in vars(defaults) if n.startswith("DEFAULT_")}
    assert names == set(_assigned_literals(ast.parse(DEFAULTS_MODULE.read_text())))
    # the same numbers under the names they had before they had one source
    names |= {"DEFAULT_SAMPLES", "DEFAULT_SENSITIVITY_SAMPLES"}
    elsewhere = {f"{p.relative_to(REPO)}:{line} {name}"
                 for p in PACKAGE.rglob("*.py") if p != DEFAULTS_MODULE
                 for name, line in _assigned_literals(ast.parse(p.read_text())).items() if name in names}
    assert not elsewhere, f"import these from vitedge.validation.defaults instead: {sorted(elsewhere)}"


def _declared_flags(tree: ast.AST) -> list[tuple[str, int]]:
    """The flags of every click.option(...) call: (flag, line)."""
    flags = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "option"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "click"):
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    flags += [(f, node.lineno) for f in arg.value.split("/") if f.startswith("--")]
    return flags


def test_shared_flags_are_declared_only_in_cli_options():
    shared = {f for f, _ in _declared_flags(ast.parse((PACKAGE / "cli" / "options.py").read_text()))}
    from vitedge.cli.options import THRESHOLD_FLAGS

    shared |= set(THRESHOLD_FLAGS) | {"--method", "--weight-range", "--seed", "--calib-size"}
    commands = sorted((PACKAGE / "cli" / "commands").glob("*.py"))
    assert len(commands) >= len(COMMANDS)
    again = [f"{p.name}:{line} {flag}" for p in commands for flag, line in _declared_flags(ast.parse(p.read_text())) if flag in shared]
    assert not again, f"declared in vitedge/cli/options.py already: {again}"


def test_the_flag_scan_sees_option_declarations():
    tree = ast.parse('@click.option("--seed", type=int)\n@click.option("--x/--no-x")\ndef f(): pass\n')
    assert [f for f, _ in _declared_flags(tree)] == ["--seed", "--x", "--no-x"]
    assert _assigned_literals(ast.parse("A = 64\nB: float = 1.0\nC = 'x'\nD = True\n")) == {"A": 1, "B": 2}


def test_help_reads_no_registry():
    """Choices and help defaults from the quantizer are read when shown, so `vitedge --help` stays light."""
    code = ("import sys, vitedge.cli.entry\nfrom click.testing import CliRunner\n"
            "assert CliRunner().invoke(vitedge.cli.entry.cli, ['--help']).exit_code == 0\n"
            "print(sorted(m for m in ('numpy', 'vitedge.quantize') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path(REPO)).stdout
    assert out.strip() == "[]"
