"""The `vitedge` command line.

Errors become one line on stderr and a documented exit code (see vitedge.core.errors);
`--debug` shows the traceback instead. Commands are imported lazily so that
`vitedge --help` stays fast and imports no torch or runtime.
"""

from __future__ import annotations

import ast
import importlib
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

import click

from vitedge import __version__
from vitedge.core import signals, telemetry
from vitedge.core.errors import Interrupted, VitedgeError, environment_error, one_line

# command name -> module under vitedge.cli.commands exposing `command`
COMMANDS = {
    "inspect": "inspect_cmd",
    "export": "export_cmd",
    "export-config": "export_config_cmd",
    "build": "build_cmd",
    "build-matrix": "build_matrix_cmd",
    "engine": "engine_cmd",
    "calibrate": "calibrate_cmd",
    "targets": "targets_cmd",
    "validate": "validate_cmd",
    "compare": "compare_cmd",
    "init": "init_cmd",
    "config": "config_cmd",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str):
        module = COMMANDS.get(name)
        if module is None:
            return None
        return importlib.import_module(f"vitedge.cli.commands.{module}").command

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None:
            refuse_repeated_options(command, rest)
        return name, command, rest

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of `vitedge --help`, read from each command's docstring in its source:
        importing every command (and the workflows it imports) only to print one line each would
        make `vitedge --help` load numpy, rich and the quantizer."""
        rows = [(name, _listed_command(name)) for name in self.list_commands(ctx)]
        limit = formatter.width - 6 - max(len(name) for name, _ in rows)
        with formatter.section("Commands"):
            formatter.write_dl([(name, cmd.get_short_help_str(limit)) for name, cmd in rows])


def refuse_repeated_options(command: click.Command, args: Sequence[str]) -> None:
    """A one-line usage error when an option that takes one value is given twice (`-o A -o B`): click keeps the
    last without a word, so a script that appends a flag to a line that already had it ran on the wrong folder.
    Options that take several values (``multiple``, ``--target``) and counted flags may repeat."""
    single: dict[str, click.Option] = {}
    for param in command.params:
        if isinstance(param, click.Option) and not param.multiple and not param.count and not param.is_flag:
            for name in (*param.opts, *param.secondary_opts):
                single[name] = param
    seen: dict[str, str] = {}
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--":
            break
        name = token.split("=", 1)[0] if token.startswith("--") else token
        param = single.get(name)
        i += 1
        if param is None:
            continue
        if param.name in seen:
            raise click.UsageError(f"{'/'.join(param.opts)} is given twice; it takes one value (click would keep the last "
                                   "without a word): keep the one you mean")
        seen[str(param.name)] = name
        if "=" not in token:
            i += param.nargs  # its value(s), which may look like an option name
    return


def _listed_command(name: str) -> click.Command:
    """A help-only stand-in for a command: its name and the docstring of its `command` function,
    which is the help click shows for it (the one source)."""
    source = Path(__file__).parent / "commands" / f"{COMMANDS[name]}.py"
    tree = ast.parse(source.read_text(encoding="utf-8"))
    doc = next((ast.get_docstring(node, clean=False) for node in tree.body
                if isinstance(node, ast.FunctionDef) and node.name == "command"), None)
    return click.Command(name, help=doc)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="vitedge")
@click.option("--debug", is_flag=True, help="Show full tracebacks instead of one-line errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Quantize a trained Vision Transformer to INT8 with real calibration data, build it for
    each edge target (ONNX Runtime, OpenVINO, TensorRT) and prove it keeps FP32's accuracy."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    telemetry.silence()  # every library's usage reporting off before any of them is imported
    signals.reset()
    signals.install()
    try:
        _run(args, debug)
    finally:
        signals.uninstall()  # the one line is printed and the code chosen: a signal from here on is the exit's, not the command's


def _run(args: list[str], debug: bool) -> None:
    try:
        cli.main(args=args, prog_name="vitedge", standalone_mode=False)
    except click.exceptions.Abort as err:
        message, code = signals.exit_for(err)
        click.echo(f"vitedge: {message}", err=True)
        sys.exit(code)
    except click.ClickException as err:
        # Usage errors: one line plus the usage hint click would print.
        click.echo(f"vitedge: {one_line(err.format_message())}", err=True)
        sys.exit(2)
    except VitedgeError as err:
        _interrupted_instead(err, debug)
        _fail(err, debug)
    except KeyboardInterrupt as err:
        if debug:
            traceback.print_exc()
        message, code = signals.exit_for(err)
        click.echo(f"vitedge: {message}", err=True)
        sys.exit(code)
    except Exception as err:  # the environment (disk full, ...) or a bug: one line unless --debug
        _interrupted_instead(err, debug)
        known = environment_error(err)
        if known is not None:
            _fail(known, debug)
        if debug:
            traceback.print_exc()
            sys.exit(3)
        first = one_line(str(err).strip().splitlines()[0])[:200] if str(err).strip() else ""
        click.echo(f"vitedge: internal error: {type(err).__name__}: {first} (re-run with --debug for the traceback)", err=True)
        sys.exit(3)
    sys.exit(0)


def _interrupted_instead(err: BaseException, debug: bool) -> None:
    """An error raised because an interrupt arrived (a library that caught SIGTERM's exception and raised its own):
    exit as the interrupt (143 / 130), never as bad input or a bug."""
    kind = signals.pending()
    if kind is None or isinstance(err, Interrupted):  # Interrupted already is the interrupt's own line (what was kept)
        return
    if debug:
        traceback.print_exc()
    message, code = signals.exit_for(kind())
    click.echo(f"vitedge: {message}", err=True)
    sys.exit(code)


def _fail(err: VitedgeError, debug: bool) -> None:
    """One line and the error's documented exit code; --debug adds the traceback, never changes the code."""
    if debug:
        traceback.print_exc()
    click.echo(f"vitedge: error: {err}", err=True)
    sys.exit(err.exit_code)
